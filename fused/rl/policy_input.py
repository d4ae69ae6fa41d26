"""What the policy network sees, as one small interface: the observation alone (`Identity`), or
the observation with per-env state kept beside it (an LLM's hidden state: `fused.llm`).

PPO, the rollout and the trainer call only this protocol; they never ask which input they have.
A `PolicyInput` keeps a state `S` per env, updated after every env step from the observation
the policy is about to act on and whether an episode just ended, and turns (state, obs) into
the network input `X`. Its device arrays that never train (an LLM's weights) are `frozen`,
passed to the jitted functions as an argument rather than closed over.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

import jax

S = TypeVar("S")  # per-env state (and anything shared by all envs, e.g. a running normaliser)
X = TypeVar("X")  # network input: an array [N, D] or a pytree of [N, ...] arrays


class PolicyInput(Protocol, Generic[S, X]):
    frozen: Any
    """Device arrays used but never trained or checkpointed; None if there are none."""

    def init(self, frozen, obs: jax.Array, key: jax.Array,
             axis_name: str | None) -> tuple[S, jax.Array]:
        """State for envs whose first observations are obs [N, D], and the part of `key` left
        for the run (an input that needs no randomness returns `key` untouched, so adding an
        input never changes the random stream of the rest)."""

    def step(self, frozen, state: S, obs: jax.Array, done: jax.Array, t: jax.Array,
             key: jax.Array, axis_name: str | None) -> tuple[S, dict]:
        """After an env step: obs [N, D] the policy acts on next, done [N] (the env's episode
        ended and obs starts a new one), t the global env-step count. Returns the new state and
        per-step metrics (scalars summed over the rollout by `summary`)."""

    def view(self, state: S, obs: jax.Array) -> X:
        """The network input for obs [N, D] under `state` (pure; no update)."""

    def example(self, obs: jax.Array) -> X:
        """A network input of the right structure for obs [B, D] (to initialise parameters)."""

    def summary(self, state: S, step_totals: dict, axis_name: str | None) -> dict:
        """Per-update metrics from the state after the rollout and the per-step metrics summed
        over its steps (on this device), reduced across devices."""

    def state_specs(self, state: S, env_axis: str) -> Any:
        """PartitionSpecs of the state: per-env leaves split over `env_axis`, the rest
        replicated."""

    def host_metrics(self, row: dict, chunk_seconds: float, rows_in_chunk: int,
                     obs: Any) -> dict:
        """Host-side metrics added to one logged row (None-free; {} if there are none)."""

    def record(self, state: S) -> dict:
        """Per-env arrays [N, ...] a dataset stores beside each transition ({} if none)."""

    def adopt(self, fresh: S, trained: S) -> S:
        """`fresh` (state for new envs) with what a trained run's state learned (its hidden-state
        normaliser, say), so a checkpoint's policy acts as it did in training."""


class Identity:
    """The plain observation: no state, no metrics (plain PPO)."""

    frozen = None

    def init(self, frozen, obs, key, axis_name) -> tuple[None, jax.Array]:
        return None, key

    def step(self, frozen, state, obs, done, t, key, axis_name) -> tuple[None, dict]:
        return None, {}

    def view(self, state, obs: jax.Array) -> jax.Array:
        return obs

    def example(self, obs: jax.Array) -> jax.Array:
        return obs

    def summary(self, state, step_totals, axis_name) -> dict:
        return {}

    def state_specs(self, state, env_axis) -> None:
        return None

    def host_metrics(self, row, chunk_seconds, rows_in_chunk, obs) -> dict:
        return {}

    def record(self, state) -> dict:
        return {}

    def adopt(self, fresh, trained) -> None:
        return fresh

