"""Collecting trajectories without learning: a behaviour policy steps N envs for T steps per call
and every (step, env) yields a record of the observation it acted on (compactly encoded) and
what happened. Pure functions; `fused.data.generate` jits, shards and stores them.

The policy input (`PolicyInput`) runs exactly as in training, so a dataset collected from an
LLM-augmented run sees the hidden states that run's policy would see, and records them.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from fused.envspec import EnvSpec
from fused.rl.acting import Acted, Policy, Rollout
from fused.rl.obs_codec import ObsCodec
from fused.rl.policy_input import PolicyInput
from fused.rl.vec_env import VecEnv, VecEnvState, Worlds


@struct.dataclass
class CollectState:
    env: VecEnvState
    inputs: Any  # the PolicyInput's state
    rng: jax.Array  # replicated
    achieved: jax.Array  # [N, A] bool: achievements already unlocked in the current episode
    carry: Any = None  # the policy's carry (None for a feed-forward policy)


class Record(NamedTuple):
    """One step of N envs ([T, N, ...] once stacked by the scan)."""

    obs: dict  # the observation acted on, encoded by the ObsCodec
    obs_exact: jax.Array  # [N] bool: its map part was 0/1, as bits hold it (the writer checks)
    action: jax.Array  # [N]
    reward: jax.Array  # [N]
    terminated: jax.Array  # [N] bool
    truncated: jax.Array  # [N] bool
    log_prob: jax.Array  # [N] of the behaviour policy
    value: jax.Array  # [N] behaviour critic V(obs); NaN without one
    truncation_value: jax.Array  # [N] V(final obs) where truncated, else 0
    step: jax.Array  # [N] int32, step within the episode of the obs acted on
    unlocked: jax.Array  # [N, ceil(A / 8)] uint8: achievements unlocked by this step (packed)
    extra: dict  # PolicyInput.record: e.g. the LLM hidden state the policy acted on


def record_step(codec: ObsCodec, obs, acted: Acted, episode_step, achieved, extra: dict
                ) -> Record:
    """The dataset record of one acting step: obs [N, D] acted on at `episode_step` [N], what
    happened (`acted`), `achieved` [N, A] the achievements unlocked before it in the episode."""
    out = acted.env
    unlocked = jnp.packbits((out.achievements.astype(bool) & ~achieved).astype(jnp.uint8),
                            axis=-1)
    obs_cols, exact = codec.encode(jnp, obs)
    return Record(obs_cols, exact, acted.action.astype(jnp.int32), out.reward, out.terminated,
                  out.truncated, acted.log_prob, acted.value, acted.truncation_value,
                  episode_step, unlocked, extra)


class Collector(NamedTuple):
    init: Callable  # (key, frozen, env_state=None) -> CollectState
    block: Callable  # (CollectState, params, frozen, t0) -> (CollectState, Record [T, N, ...])
    worlds: Worlds  # the envs `init(key, ...)` starts from (made inside it if not given)


def make_collect(spec: EnvSpec, env, env_cfg, policy: Policy, inputs: PolicyInput,
                 num_envs: int, steps: int, axis_name: str | None = None,
                 num_shards: int = 1) -> Collector:
    """`steps` env steps of `num_envs` envs per `block` call (this device's num_envs / num_shards
    when `axis_name` is set: run under shard_map). Per-env keys do not depend on the sharding.
    `policy` acts (`fused.rl.acting`: a network's, mixed with uniform actions, or uniform)."""
    local = num_envs // num_shards
    rollout = Rollout(policy, inputs, VecEnv(env, env_cfg), num_envs, local, axis_name,
                      values=True)
    codec = ObsCodec(spec)
    n_ach = len(spec.achievement_names)

    def reset_keys(key):
        k_env, k_pool, _ = jax.random.split(key, 3)
        return rollout.keys(k_env), rollout.fold(k_pool)

    worlds = Worlds(reset_keys, rollout.envs)

    def init(key, frozen, env_state=None):
        _, _, k_run = jax.random.split(key, 3)
        if env_state is None:
            env_state = worlds(key)
        state, k_run = inputs.init(frozen, env_state.obs, k_run, axis_name)
        return CollectState(env_state, state, k_run, jnp.zeros((local, n_ach), bool),
                            policy.carry(local))

    def block(s: CollectState, params, frozen, t0):
        """t0: stream time of the first step (the policy input's global step counter)."""
        rng, k = jax.random.split(s.rng)

        def body(carry, xs):
            s, t = carry
            key, = xs
            s2, rec = step(params, frozen, s, key, t)
            return (s2, t + 1), rec

        (s, _), recs = jax.lax.scan(body, (s.replace(rng=rng), t0), (jax.random.split(k, steps),))
        return s, recs

    def step(params, frozen, s: CollectState, key, t):
        """Act on s.env.obs (stream time t), step, update the input state for time t + 1."""
        (env_state, new_inputs, carry), a = rollout.step(params, frozen, s.env, s.inputs,
                                                         s.carry, key, t)
        rec = record_step(codec, s.env.obs, a, s.env.episode_length, s.achieved,
                          inputs.record(s.inputs))
        achieved = a.env.achievements.astype(bool)
        return s.replace(env=env_state, inputs=new_inputs, carry=carry,
                         achieved=jnp.where(a.done[:, None], False, achieved)), rec

    return Collector(init, block, worlds)
