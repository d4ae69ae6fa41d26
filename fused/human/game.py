"""One Craftax game played by a person: keys to actions (Craftax's own map), each step's dataset
row (the columns `label.py generate` writes), and what the page shows (the frame, the text the
LLM would read, inventory, health bars, achievements, floor).

Every world and step is a function of the episode's seed: the world is made from
`fold_in(PRNGKey(seed), 0)` and step k (from 0) uses `fold_in(PRNGKey(seed), k + 1)`, so an
episode's seed (in the dataset's card) and its recorded actions play it again exactly
(`replay`).
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from craftax.craftax_env import make_craftax_env_from_name
from PIL import Image

from fused.envspec import spec, text_env
from fused.human.keys import key_map
from fused.rl.envs import CraftaxEnv
from fused.rl.obs_codec import ObsCodec
from fused.text.format import get_layout, render_text
from fused.video import pixel_renderer

BARS = ("health", "food", "drink", "energy", "mana")


def text_twin(env_name: str) -> str:
    """The env whose text an LLM reads for `env_name` (a pixel env's: its symbolic twin)."""
    return text_env(env_name) or env_name


class Game:
    """The env, its jitted reset / step / frame / text observation, and the running episode."""

    def __init__(self, env_name: str, max_episode_steps: int | None = None,
                 block_pixels: int = 16):
        self.name, self.max_episode_steps = env_name, max_episode_steps
        self.spec = spec(env_name)
        if self.spec.family != "craftax":
            raise ValueError(f"{env_name} is not a Craftax env; people play Craftax envs")
        self.env = CraftaxEnv(self.spec, max_episode_steps)
        self.codec = ObsCodec(self.spec)
        self.keys = key_map(env_name)
        self.action_names = [n.split(":", 1)[1] for n in self.spec.action_names]
        self.layout = get_layout(text_twin(env_name))
        twin = make_craftax_env_from_name(text_twin(env_name), auto_reset=False)
        env = self.env

        def reset(seed):
            return env.reset(jax.random.fold_in(jax.random.PRNGKey(seed), 0))

        def step(seed, state, action):
            key = jax.random.fold_in(jax.random.PRNGKey(seed), state.timestep + 1)
            return env.step(key, state, action)

        self._reset = jax.jit(reset)
        self._step = jax.jit(step)
        self._frame = jax.jit(pixel_renderer(env_name, block_pixels))
        self._text_obs = jax.jit(lambda s: twin.get_obs(s).reshape(-1))
        self.state: Any = None
        self.obs: np.ndarray | None = None
        self.seed = 0
        self.episode_return = 0.0
        self.over = False  # the episode ended (terminated or truncated); the next key starts
        #                    the next one

    # --- the episode ------------------------------------------------------------------------

    def new(self, seed: int) -> None:
        obs, state = self._reset(jnp.int32(seed))
        self.set(state, np.asarray(obs), seed, 0.0)

    def set(self, state, obs: np.ndarray, seed: int, episode_return: float,
            over: bool = False) -> None:
        # strongly typed (via the host) and committed to the device, so one compiled step
        # serves every key: reset returns weakly typed scalars, some of which (the player's
        # direction, say) a step's output has strongly typed, a second signature to compile
        self.state = jax.device_put(jax.tree.map(np.asarray, state), jax.local_devices()[0])
        self.obs, self.seed = obs, int(seed)
        self.episode_return, self.over = float(episode_return), over

    def warm(self) -> None:
        """Compiles a step (its result dropped: the episode is unchanged), so the page's first
        key is not the one that waits for the compiler."""
        jax.block_until_ready(self._step(jnp.int32(self.seed), self.state, jnp.int32(0)))

    def like(self):
        """A state of this env's structure (to restore saved leaves into)."""
        return jax.eval_shape(self._reset, jnp.int32(0))[1]

    def action_of(self, key: str) -> int | None:
        """The action a key takes now (None: not a game key). While the player sleeps or rests
        every key is NOOP, as Craftax's own play script has it."""
        a = self.keys.get(key)
        if a is None:
            return None
        if bool(self.state.is_sleeping) or bool(getattr(self.state, "is_resting", False)):
            return self.keys["q"]
        return a

    def act(self, action: int) -> dict[str, np.ndarray]:
        """Steps the episode with `action`; returns the step's dataset row (columns [1, ...]
        without t / env / episode_id, which the recorder adds)."""
        before = self.state
        res = self._step(jnp.int32(self.seed), before, jnp.int32(action))
        cols, exact = self.codec.encode(np, self.obs[None].astype(np.float32))
        if not exact.all():
            raise ValueError("observation map entries outside {0, 1}: fused.envspec's layout "
                             f"of {self.name} is wrong")
        old = np.asarray(before.achievements).astype(bool)
        new = np.asarray(res.achievements).astype(bool)
        row = dict(cols)
        row.update(action=np.array([action], np.uint8),
                   reward=np.array([res.reward], np.float32),
                   terminated=np.array([bool(res.terminated)]),
                   truncated=np.array([bool(res.truncated)]),
                   log_prob=np.array([np.nan], np.float32),  # a person: no known policy
                   value=np.array([np.nan], np.float32),
                   truncation_value=np.zeros(1, np.float32),
                   step=np.array([int(before.timestep)], np.int32),
                   unlocked=np.packbits((new & ~old).astype(np.uint8))[None])
        self.state, self.obs = res.state, np.asarray(res.obs)
        self.episode_return += float(res.reward)
        self.over = bool(res.terminated) or bool(res.truncated)
        return row

    # --- what the page shows ----------------------------------------------------------------

    def text(self) -> str:
        return render_text(self.layout, np.asarray(self._text_obs(self.state)))

    def frame_png(self, scale: int = 1) -> bytes:
        img = np.asarray(self._frame(self.state)).clip(0, 255).astype(np.uint8)
        out = io.BytesIO()
        im = Image.fromarray(img)
        if scale > 1:
            im = im.resize((im.width * scale, im.height * scale), Image.NEAREST)
        im.save(out, format="PNG")
        return out.getvalue()

    def view(self) -> dict:
        s = self.state
        inv = {}
        for f in dataclasses.fields(s.inventory):
            v = np.asarray(getattr(s.inventory, f.name))
            inv[f.name] = v.tolist() if v.ndim else int(v)
        bars = {b: float(np.asarray(getattr(s, f"player_{b}"))) for b in BARS
                if hasattr(s, f"player_{b}")}
        got = np.asarray(s.achievements).astype(bool)
        return {"env": self.name, "seed": self.seed, "step": int(s.timestep),
                "floor": int(getattr(s, "player_level", 0)), "inventory": inv, "bars": bars,
                "achievements": [n for n, g in zip(self.spec.achievement_names, got) if g],
                "achievements_total": len(self.spec.achievement_names),
                "sleeping": bool(s.is_sleeping), "episode_return": round(self.episode_return, 3),
                "over": self.over, "text": self.text()}


def replay(env_name: str, seed: int, actions, max_episode_steps: int | None = None) -> np.ndarray:
    """The observations [T, D] an episode of `seed` acted on, played again from its actions."""
    g = Game(env_name, max_episode_steps)
    g.new(seed)
    out = []
    for a in actions:
        out.append(g.obs)
        g.act(int(a))
    return np.stack(out) if out else np.zeros((0, g.spec.obs_dim), np.float32)
