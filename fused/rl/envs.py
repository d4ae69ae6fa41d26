"""Craftax behind the one-env interface (`fused.rl.env_api.Env`), and `make_env` for any env name.

`CraftaxEnv` steps ONE environment without resetting and says apart `terminated` (death, boss
beaten) from `truncated` (time limit), so GAE can bootstrap on truncation.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fused.rl.config import EnvSettings
from fused.envspec import EnvSpec, TextEnvName, spec, text_env
from fused.rl.env_api import Env, StepResult
from fused.rl.diagnostic_envs import make_probe


class CraftaxEnv:
    """One Craftax env, no auto-reset. Methods are pure and vmappable. A pixel env's frame
    [H, W, 3] is its observation flattened ([H * W * 3]: every env's is a vector; the CNN
    policy reshapes it). With `text` (a pixel env whose policy has an LLM beside the CNN) the
    observation is the frame, then the same state's symbolic observation (its text twin's,
    `fused.envspec.text_offset`), which the LLM's renderer reads."""

    def __init__(self, env_spec: EnvSpec, max_episode_steps: int | None = None,
                 text: bool = False, impl: str = "craftax"):
        """impl: whose step (`fused.envs.IMPLS`): Craftax's own, or ours written for the
        compiler (equal to Craftax's bit for bit)."""
        from fused.envs import make_craftax_env

        self.spec = env_spec
        self._env = make_craftax_env(env_spec.name, impl)
        self._twin = None
        if text and env_spec.is_pixels:
            self._twin = make_craftax_env(text_env(env_spec.name), impl)
        params = self._env.default_params
        if max_episode_steps is not None:
            params = params.replace(max_timesteps=max_episode_steps)
        self.params = params
        self.achievement_names = env_spec.achievement_names
        self.num_actions = self._env.action_space(params).n
        self.obs_dim = int(np.prod(self._env.observation_space(params).shape))
        assert (self.num_actions, self.obs_dim) == (env_spec.num_actions, env_spec.obs_dim), \
            f"fused.envspec disagrees with craftax about {env_spec.name}"
        if self._twin is not None:
            self.obs_dim += spec(text_env(env_spec.name)).obs_dim

    def _with_text(self, obs, state):
        if self._twin is None:
            return obs.reshape(-1)
        return jnp.concatenate([obs.reshape(-1), self._twin.get_obs(state).reshape(-1)])

    def reset(self, key: jax.Array) -> tuple[jax.Array, Any]:
        obs, state = self._env.reset_env(key, self.params)
        return self._with_text(obs, state), state

    def observe(self, state: Any) -> jax.Array:
        """The observation of a state (after editing it, say)."""
        return self._with_text(self._env.get_obs(state), state)

    def step(self, key: jax.Array, state: Any, action: jax.Array) -> StepResult:
        obs, next_state, reward, done, _ = self._env.step_env(key, state, action, self.params)
        obs = self._with_text(obs, next_state)
        # Time-limit ends are truncations unless the player also died (or won) on that step.
        timed_out = next_state.timestep >= self.params.max_timesteps
        truncated = done & timed_out & (next_state.player_health > 0)
        return StepResult(obs, next_state, reward.astype(jnp.float32), done & ~truncated,
                          truncated, next_state.achievements.astype(bool))


def make_env(cfg: EnvSettings, text: bool = False) -> Env:
    """The env of `cfg`; `text`: a pixel env observes its text twin's observation after the
    frame, for an LLM beside the CNN (`fused.agent.needs_text`)."""
    s = spec(cfg.name)
    if s.family == "probe":
        return make_probe(s, cfg.max_episode_steps)
    return CraftaxEnv(s, cfg.max_episode_steps, text, getattr(cfg, "impl", "craftax"))


def rollout_observations(env_name: TextEnvName, num_states: int, seed: int,
                         num_envs: int) -> np.ndarray:
    """Observations of real states from uniform-random-action rollouts: [N, D].

    Envs are reset once and never again (ended episodes keep stepping; world generation is what
    makes Craftax slow to compile). For Craftax-Symbolic every other observation views the same
    state from a random floor (all 9 are generated at reset), so darkness, ladders, torches and
    the deeper floors' blocks and mobs appear, which a random policy on floor 0 rarely sees."""
    env = CraftaxEnv(spec(env_name))
    full = env.spec.floors > 1
    steps = -(-num_states // (2 * num_envs)) if full else -(-num_states // num_envs)

    def observe(state, key):
        obs = env.observe(state)
        if not full:
            return obs[None]
        level = jax.random.randint(key, (), 0, env.spec.floors)
        return jnp.stack([obs, env.observe(state.replace(player_level=level))])

    def run(key):
        k_reset, k_roll = jax.random.split(key)
        _, state = jax.vmap(env.reset)(jax.random.split(k_reset, num_envs))

        def step(s, k):
            k_act, k_env, k_floor = jax.random.split(k, 3)
            action = jax.random.randint(k_act, (num_envs,), 0, env.num_actions)
            res = jax.vmap(env.step)(jax.random.split(k_env, num_envs), s, action)
            return res.state, jax.vmap(observe)(s, jax.random.split(k_floor, num_envs))

        _, obs = jax.lax.scan(step, state, jax.random.split(k_roll, steps))
        return obs.reshape(-1, obs.shape[-1])

    return np.asarray(jax.jit(run)(jax.random.PRNGKey(seed)))[:num_states]


