"""Environments behind one small interface, and the vectorised wrapper with resets and logging.

An `Env` steps ONE environment without resetting and says apart `terminated` (a true end: death,
boss beaten) from `truncated` (time limit), so GAE can bootstrap on truncation. `VecEnv` batches
envs, handles resets (optimistic pool or exact auto-reset) and keeps episode statistics.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from fused.config import EnvConfig


class StepResult(NamedTuple):
    obs: jax.Array  # [D] float32, observation after the step (before any reset)
    state: Any
    reward: jax.Array  # [] float32
    terminated: jax.Array  # [] bool
    truncated: jax.Array  # [] bool
    achievements: jax.Array  # [A] bool, unlocked so far in this episode


class Env:
    """One Craftax env, no auto-reset. Methods are pure and vmappable."""

    def __init__(self, name: str, max_episode_steps: int | None = None):
        from craftax.craftax_env import make_craftax_env_from_name

        self.name = name
        self._env = make_craftax_env_from_name(name, auto_reset=False)
        params = self._env.default_params
        if max_episode_steps is not None:
            params = params.replace(max_timesteps=max_episode_steps)
        self.params = params
        if "Classic" in name:
            from craftax.craftax_classic.constants import Achievement
        else:
            from craftax.craftax.constants import Achievement
        self.achievement_names = tuple(a.name.lower() for a in Achievement)
        self.num_actions = self._env.action_space(params).n
        self.obs_dim = self._env.observation_space(params).shape[0]

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]:
        return self._env.reset_env(key, self.params)

    def step(self, key: jax.Array, state: Any, action: jax.Array) -> StepResult:
        obs, next_state, reward, done, _ = self._env.step_env(key, state, action, self.params)
        # Time-limit ends are truncations unless the player also died (or won) on that step.
        timed_out = next_state.timestep >= self.params.max_timesteps
        truncated = done & timed_out & (next_state.player_health > 0)
        return StepResult(obs, next_state, reward.astype(jnp.float32), done & ~truncated,
                          truncated, next_state.achievements.astype(bool))


def make_env(cfg: EnvConfig):
    if cfg.name.startswith("probe-"):
        from fused import probes  # probes import StepResult from here

        return probes.make_probe(cfg.name, cfg.max_episode_steps)
    return Env(cfg.name, cfg.max_episode_steps)


@struct.dataclass
class ResetPool:
    obs: jax.Array  # [P, D]
    state: Any  # env states, leading axis P
    used: jax.Array  # [P] bool: handed to an env since it was generated
    cursor: jax.Array  # [1] int32 (a vector so per-device pools concatenate under sharding)


@struct.dataclass
class VecEnvState:
    obs: jax.Array  # [N, D]
    state: Any  # env states, leading axis N
    episode_return: jax.Array  # [N] float32
    episode_length: jax.Array  # [N] int32
    pool: ResetPool | None


class VecStep(NamedTuple):
    """What one vectorised step reports; episode fields are valid where `done`."""

    obs: jax.Array  # [N, D] next observation (after reset where done)
    final_obs: jax.Array  # [N, D] observation the step produced (before reset)
    reward: jax.Array  # [N]
    terminated: jax.Array  # [N] bool
    truncated: jax.Array  # [N] bool
    episode_return: jax.Array  # [N] return of the episode that ended here
    episode_length: jax.Array  # [N]
    achievements: jax.Array  # [N, A] bool, achievements of the episode that ended here
    reset_reuse: jax.Array  # [] int32: resets served by an already handed-out pool world


def _select(mask: jax.Array, on_true: Any, on_false: Any) -> Any:
    def pick(a, b):
        return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(pick, on_true, on_false)


class VecEnv:
    """N envs of one kind; `keys` arguments hold one PRNG key per env so that a sharded run
    steps each env with the same key as an unsharded one."""

    def __init__(self, env, cfg: EnvConfig):
        self.env = env
        self.mode = cfg.reset
        self.pool_size = cfg.reset_pool
        self.worlds_per_step = cfg.worlds_per_step

    def reset(self, keys: jax.Array, pool_key: jax.Array) -> VecEnvState:
        """keys: [N] per-env keys; pool_key: key for this device's reset pool."""
        obs, state = jax.vmap(self.env.reset)(keys)
        n = obs.shape[0]
        pool = None
        if self.mode == "optimistic":
            pobs, pstate = jax.vmap(self.env.reset)(jax.random.split(pool_key, self.pool_size))
            pool = ResetPool(pobs, pstate, jnp.zeros(self.pool_size, bool), jnp.zeros(1, jnp.int32))
        return VecEnvState(obs, state, jnp.zeros(n, jnp.float32), jnp.zeros(n, jnp.int32), pool)

    def step(self, keys: jax.Array, pool_key: jax.Array, vstate: VecEnvState,
             action: jax.Array) -> tuple[VecEnvState, VecStep]:
        """keys: [N, 2] per-env step keys (a reset key is derived from each); action: [N]."""
        step_keys, reset_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
        res = jax.vmap(self.env.step)(step_keys, vstate.state, action)
        done = res.terminated | res.truncated
        ep_return = vstate.episode_return + res.reward
        ep_length = vstate.episode_length + 1
        if self.mode == "auto":
            obs, state, pool, reuse = self._auto_reset(reset_keys, done, res)
        else:
            obs, state, pool, reuse = self._optimistic_reset(pool_key, done, res, vstate.pool)
        new = VecEnvState(obs, state, jnp.where(done, 0.0, ep_return),
                          jnp.where(done, 0, ep_length), pool)
        out = VecStep(obs, res.obs, res.reward, res.terminated, res.truncated, ep_return,
                      ep_length, res.achievements, reuse)
        return new, out

    def _auto_reset(self, reset_keys, done, res):
        def fresh(_):
            obs_re, state_re = jax.vmap(self.env.reset)(reset_keys)
            return _select(done, obs_re, res.obs), _select(done, state_re, res.state)

        # World generation costs ~30 steps; skip it on the (common) steps where no episode ends.
        obs, state = jax.lax.cond(done.any(), fresh, lambda _: (res.obs, res.state), None)
        return obs, state, None, jnp.int32(0)

    def _optimistic_reset(self, pool_key, done, res, pool: ResetPool):
        p, g = self.pool_size, self.worlds_per_step
        cursor = pool.cursor[0]
        rank = jnp.cumsum(done) - 1
        slot = (cursor + rank) % p  # the k-th finished env takes slot cursor+k
        # A world is reused if handed out before, or to an earlier env in this very step.
        reuse = jnp.sum(done & (pool.used[slot] | (rank >= p))).astype(jnp.int32)
        used = pool.used.at[slot].max(done)

        def take(_):
            pobs, pstate = jax.tree.map(lambda x: x[slot], (pool.obs, pool.state))
            return _select(done, pobs, res.obs), _select(done, pstate, res.state)

        def refill(_):
            obs_new, state_new = jax.vmap(self.env.reset)(jax.random.split(pool_key, g))
            idx = (cursor + jnp.arange(g)) % p
            put = lambda old, new: old.at[idx].set(new)
            return ResetPool(put(pool.obs, obs_new), jax.tree.map(put, pool.state, state_new),
                             used.at[idx].set(False), ((cursor + g) % p)[None])

        any_done = done.any()
        obs, state = jax.lax.cond(any_done, take, lambda _: (res.obs, res.state), None)
        new_pool = jax.lax.cond(any_done, refill, lambda _: pool.replace(used=used), None)
        return obs, state, new_pool, reuse
