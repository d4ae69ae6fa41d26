"""Tiny probe environments with known values and policies (after Andy Jones' RL debugging probes).

Each isolates one piece of an RL algorithm, so PPO must solve it in seconds or something is
broken: value regression, observation use, discounting/credit assignment, the policy gradient,
their combination, bootstrapping on truncation, and memory. Every probe is described once in `KINDS`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from fused.envspec import EnvSpec
from fused.rl.env_api import StepResult


class ProbeState(NamedTuple):
    t: jax.Array  # [] int32, steps taken in this episode
    sign: jax.Array  # [] float32, +1 or -1 drawn at reset


def _good(action):
    return jnp.where(action == 1, 1.0, -1.0)


@dataclasses.dataclass(frozen=True)
class ProbeKind:
    """obs(state) -> [2]; reward(state before the step, action, t after it) -> []."""

    obs: Callable[[ProbeState], jax.Array]
    reward: Callable[[ProbeState, jax.Array, jax.Array], jax.Array]
    horizon: int = 1  # episode length; a probe that truncates takes its time limit instead
    truncates: bool = False  # the episode ends by a time limit (truncation), not termination
    long_horizon: int | None = None  # episodes drawn with sign +1 last this long instead


_BLANK = lambda s: jnp.array([0.0, 1.0])  # noqa: E731
_SIGN = lambda s: jnp.stack([s.sign, 1.0])  # noqa: E731
KINDS: dict[str, ProbeKind] = {
    "constant": ProbeKind(_BLANK, lambda s, a, t: jnp.float32(1.0)),
    "obs-reward": ProbeKind(_SIGN, lambda s, a, t: s.sign),
    "delayed": ProbeKind(lambda s: jnp.stack([s.t.astype(jnp.float32), 1.0]),
                         lambda s, a, t: jnp.where(t == 2, 1.0, 0.0), horizon=2),
    "action-reward": ProbeKind(_BLANK, lambda s, a, t: _good(a)),
    "obs-action": ProbeKind(_SIGN, lambda s, a, t: _good(a) * s.sign),
    "truncated": ProbeKind(_BLANK, lambda s, a, t: jnp.float32(1.0), horizon=5, truncates=True),
    # The sign shows at the first step only; the fourth action earns +1 if it matches it, -1 if
    # not: a policy without memory scores 0 on average (the recurrent-policy probe).
    "memory": ProbeKind(lambda s: jnp.stack([jnp.where(s.t == 0, s.sign, 0.0), 1.0]),
                        lambda s, a, t: jnp.where(t == 4, _good(a) * s.sign, 0.0), horizon=4),
    # Half the episodes last 1 step, half 8, +1 reward a step: expected return 4.5, but the
    # first episodes to finish are mostly short ones (the evaluation-bias probe).
    "lengths": ProbeKind(_SIGN, lambda s, a, t: jnp.float32(1.0), horizon=1, long_horizon=8),
}


class Probe:
    """One probe env (`fused.rl.env_api.Env`)."""

    achievement_names: tuple[str, ...] = ()
    obs_dim = 2
    num_actions = 2

    def __init__(self, kind: ProbeKind, max_episode_steps: int | None = None):
        self.kind = kind
        self.horizon = (max_episode_steps or kind.horizon) if kind.truncates else kind.horizon

    def reset(self, key: jax.Array):
        sign = jnp.where(jax.random.bernoulli(key), 1.0, -1.0)
        s = ProbeState(jnp.int32(0), sign)
        return self.kind.obs(s), s

    def step(self, key: jax.Array, s: ProbeState, action: jax.Array):
        del key
        t = s.t + 1
        reward = self.kind.reward(s, action, t)
        horizon = self.horizon if self.kind.long_horizon is None else jnp.where(
            s.sign > 0, self.kind.long_horizon, self.horizon)
        end = t >= horizon
        truncated = end & self.kind.truncates
        ns = ProbeState(t, s.sign)
        return StepResult(self.kind.obs(ns), ns, reward.astype(jnp.float32), end & ~truncated,
                          truncated, jnp.zeros((0,), bool))


def make_probe(env_spec: EnvSpec, max_episode_steps: int | None = None) -> Probe:
    return Probe(KINDS[env_spec.name.removeprefix("probe-")], max_episode_steps)
