"""The one-env interface every environment implements (Craftax in `fused.rl.envs`, the probes in
`fused.rl.diagnostic_envs`); `fused.rl.vec_env.VecEnv` batches any of them."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax


class StepResult(NamedTuple):
    obs: jax.Array  # [D] float32, observation after the step (before any reset)
    state: Any
    reward: jax.Array  # [] float32
    terminated: jax.Array  # [] bool: a true end (death, boss beaten): the value after it is 0
    truncated: jax.Array  # [] bool: a time limit: the episode could have gone on
    achievements: jax.Array  # [A] bool, unlocked so far in this episode


class Env(Protocol):
    """One environment without auto-reset; methods are pure and vmappable."""

    num_actions: int
    obs_dim: int
    achievement_names: tuple[str, ...]

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]:
        """-> (obs [D], state)"""

    def step(self, key: jax.Array, state: Any, action: jax.Array) -> StepResult:
        ...


def strong_types(tree):
    """The same arrays without weak types. Craftax puts Python scalars into its states (weak
    types) that its step returns as ordinary arrays, and a checkpoint restores as ordinary
    arrays: a jitted function whose input types differ from the ones it was compiled for
    compiles again (70-100 s on Craftax-Symbolic). `VecEnv.reset` and the trainer's `init`
    return strong types, so every call after the first reuses its program."""
    return jax.tree.map(lambda x: jax.lax.convert_element_type(x, x.dtype)
                        if jax.typeof(x).weak_type else x, tree)
