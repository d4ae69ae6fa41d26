"""Tiny probe environments with known values and policies (after Andy Jones' RL debugging probes).

Each isolates one piece of an RL algorithm, so PPO must solve it in seconds or something is
broken: value regression, observation use, discounting/credit assignment, the policy gradient,
their combination, and bootstrapping on truncation.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fused.envs import StepResult


class ProbeState(NamedTuple):
    t: jax.Array  # [] int32, steps taken in this episode
    sign: jax.Array  # [] float32, +1 or -1 drawn at reset


class Probe:
    """One probe env; the behaviour is chosen by `kind`."""

    achievement_names: tuple[str, ...] = ()
    obs_dim = 2

    def __init__(self, kind: str, max_episode_steps: int | None = None):
        self.kind = kind
        self.num_actions = 2
        # Episode length: 2 for the delayed-reward probe, a time limit for the truncation probe.
        self.horizon = {"delayed": 2, "truncated": max_episode_steps or 5}.get(kind, 1)

    def _obs(self, s: ProbeState) -> jax.Array:
        if self.kind == "delayed":
            return jnp.stack([s.t.astype(jnp.float32), 1.0])
        if self.kind in ("obs-reward", "obs-action"):
            return jnp.stack([s.sign, 1.0])
        return jnp.array([0.0, 1.0])

    def reset(self, key: jax.Array):
        sign = jnp.where(jax.random.bernoulli(key), 1.0, -1.0)
        s = ProbeState(jnp.int32(0), sign)
        return self._obs(s), s

    def step(self, key: jax.Array, s: ProbeState, action: jax.Array):
        del key
        t = s.t + 1
        good = jnp.where(action == 1, 1.0, -1.0)
        reward = {
            "constant": jnp.float32(1.0),
            "obs-reward": s.sign,
            "delayed": jnp.where(t == 2, 1.0, 0.0),
            "action-reward": good,
            "obs-action": good * s.sign,
            "truncated": jnp.float32(1.0),
        }[self.kind]
        end = t >= self.horizon
        truncated = end if self.kind == "truncated" else jnp.bool_(False)
        terminated = end & ~truncated
        ns = ProbeState(t, s.sign)
        return StepResult(self._obs(ns), ns, reward.astype(jnp.float32), terminated, truncated,
                          jnp.zeros((0,), bool))


def make_probe(name: str, max_episode_steps: int | None = None) -> Probe:
    return Probe(name.removeprefix("probe-"), max_episode_steps)
