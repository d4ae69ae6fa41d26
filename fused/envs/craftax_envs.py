"""Craftax's env objects with the step of an implementation: `make_craftax_env(name, impl)`.

`impl="craftax"` is Craftax's own env (craftax 1.6.1, the reference); `impl="fast"` is the same
class with its step (and symbolic observation) written for the compiler in `fused.envs`, equal
to Craftax's bit for bit (tests/test_fast_step.py): resets, pixel renderers and everything else
stay Craftax's. Games without a fast step yet (the full game) get Craftax's own."""

from __future__ import annotations

from typing import Literal

import jax

from craftax.craftax_classic.envs.common import compute_score
from craftax.craftax_classic.envs.craftax_pixels_env import CraftaxClassicPixelsEnvNoAutoReset
from craftax.craftax_classic.envs.craftax_symbolic_env import (
    CraftaxClassicSymbolicEnvNoAutoReset)
from craftax.craftax_env import make_craftax_env_from_name

from fused.envs import classic_step

Impl = Literal["craftax", "fast"]
IMPLS: tuple[str, ...] = ("craftax", "fast")


class _FastClassicStep:
    """Craftax-Classic's `step_env`, computed by `fused.envs.classic_step`."""

    def step_env(self, key, state, action, params):
        state, reward, in_lava = classic_step.craftax_step(key, state, action, params,
                                                           self.static_env_params)
        # is_game_over, the map read at the player once (update_health read the same cell)
        done = (state.timestep >= params.max_timesteps) | in_lava | (state.player_health <= 0)
        info = compute_score(state, done)
        info["discount"] = jax.lax.select(done, 0.0, 1.0)
        return (jax.lax.stop_gradient(self.get_obs(state)), jax.lax.stop_gradient(state),
                reward, done, info)


class FastClassicSymbolic(_FastClassicStep, CraftaxClassicSymbolicEnvNoAutoReset):
    def get_obs(self, state):
        return classic_step.observe(state)


class FastClassicPixels(_FastClassicStep, CraftaxClassicPixelsEnvNoAutoReset):
    pass  # Craftax's pixel renderer


FAST = {"Craftax-Classic-Symbolic-v1": FastClassicSymbolic,
        "Craftax-Classic-Pixels-v1": FastClassicPixels}


def make_craftax_env(name: str, impl: Impl = "craftax"):
    """Craftax's env object for `name` (no auto-reset), stepped by `impl`."""
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}: one of {', '.join(IMPLS)}")
    if impl == "fast" and name in FAST:
        return FAST[name]()
    return make_craftax_env_from_name(name, auto_reset=False)


def has_fast_step(name: str) -> bool:
    """Whether `impl="fast"` steps `name` with its own step (else Craftax's)."""
    return name in FAST
