"""N envs of one kind in lock step: resets (optimistic pool or exact auto-reset) and episode
statistics. Any `fused.rl.env_api.Env` works."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from fused.rl.config import EnvSettings
from fused.rl.env_api import Env, strong_types


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


def per_env_keys(key: jax.Array, num_envs: int, local_envs: int,
                 axis_name: str | None = None) -> jax.Array:
    """This device's slice of one key per global env: sharding never changes any env's key."""
    keys = jax.random.split(key, num_envs)
    if axis_name is None:
        return keys
    offset = jax.lax.axis_index(axis_name) * local_envs
    return jax.lax.dynamic_slice_in_dim(keys, offset, local_envs)


def _select(mask: jax.Array, on_true: Any, on_false: Any) -> Any:
    def pick(a, b):
        return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(pick, on_true, on_false)


class Worlds(NamedTuple):
    """How an `init` makes its first envs from its seed key: `envs.reset(*keys(key))`, which
    `fused.rl.sharding.jit_init` makes in programs of their own: world generation, the costly
    part, one program per env and count of worlds (`envs.worlds`), shared by any run's envs and
    reset pool of that count."""

    keys: Any  # (seed key) -> (per-env keys [N], pool key)
    envs: "VecEnv"

    def __call__(self, key: jax.Array) -> VecEnvState:
        return self.envs.reset(*self.keys(key))


class VecEnv:
    """N envs of one kind; `keys` arguments hold one PRNG key per env so that a sharded run
    steps each env with the same key as an unsharded one."""

    def __init__(self, env: Env, cfg: EnvSettings | None):
        """cfg None: no resets (each env plays one episode, then stays where it ended; what it
        reports after that is the caller's to ignore, as evaluation does)."""
        self.env = env
        self.mode = "none" if cfg is None else cfg.reset
        self.pool_size = 0 if cfg is None else cfg.reset_pool
        self.worlds_per_step = 0 if cfg is None else cfg.worlds_per_step

    @property
    def resets(self) -> bool:
        """A finished env starts a new episode at once."""
        return self.mode != "none"

    def reset(self, keys: jax.Array, pool_key: jax.Array) -> VecEnvState:
        """keys: [N] per-env keys; pool_key: key for this device's reset pool."""
        pooled = self.worlds(self.pool_keys(pool_key)) if self.pooled else None
        return self.assemble(self.worlds(keys), pooled)

    @property
    def pooled(self) -> bool:
        """`reset` makes a pool of worlds too (`pool_keys`' worlds)."""
        return self.mode == "optimistic"

    def pool_keys(self, pool_key: jax.Array) -> jax.Array:
        return jax.random.split(pool_key, self.pool_size)

    def worlds(self, keys: jax.Array) -> tuple[jax.Array, Any]:
        """A fresh world of the env for each of `keys`: (obs [K, D], states [K])."""
        return jax.vmap(self.env.reset)(keys)

    def assemble(self, made: tuple, pooled: tuple | None = None) -> VecEnvState:
        """`reset`'s state from the envs' `worlds` and (`pooled`) the pool's."""
        obs, state = made
        n = obs.shape[0]
        pool = None
        if pooled is not None:
            pobs, pstate = pooled
            pool = ResetPool(pobs, pstate, jnp.zeros(self.pool_size, bool), jnp.zeros(1, jnp.int32))
        return strong_types(VecEnvState(obs, state, jnp.zeros(n, jnp.float32),
                                        jnp.zeros(n, jnp.int32), pool))

    def step(self, keys: jax.Array, pool_key: jax.Array, vstate: VecEnvState,
             action: jax.Array) -> tuple[VecEnvState, VecStep]:
        """keys: [N, 2] per-env step keys (a reset key is derived from each); action: [N].
        Named `env` in profiles (`bench/trace_report.py` groups device time by it)."""
        with jax.named_scope("env"):
            return self._step(keys, pool_key, vstate, action)

    def _step(self, keys, pool_key, vstate: VecEnvState, action):
        step_keys, reset_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
        res = jax.vmap(self.env.step)(step_keys, vstate.state, action)
        done = res.terminated | res.truncated
        ep_return = vstate.episode_return + res.reward
        ep_length = vstate.episode_length + 1
        if self.mode == "none":
            obs, state, pool, reuse = res.obs, res.state, None, jnp.int32(0)
        elif self.mode == "auto":
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
