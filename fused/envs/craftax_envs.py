"""Craftax's env objects with the step of an implementation: `make_craftax_env(name, impl)`.

`impl="craftax"` is Craftax's own env (craftax 1.6.1, the reference); `impl="fast"` is the same
class with its step (and symbolic observation) written for the compiler in `fused.envs`, equal
to Craftax's bit for bit (tests/test_fast_step.py): resets, pixel renderers and everything else
stay Craftax's. Craftax-Classic's step is ours whole; the full game's (`fused.envs.full_step`,
which names them) is ours in the parts that cost most, Craftax's own functions for the rest."""

from __future__ import annotations

from typing import Literal

import jax

from craftax.craftax.envs.common import log_achievements_to_info
from craftax.craftax.envs.craftax_pixels_env import CraftaxPixelsEnvNoAutoReset
from craftax.craftax.envs.craftax_symbolic_env import CraftaxSymbolicEnvNoAutoReset
from craftax.craftax_classic.envs.common import compute_score
from craftax.craftax_classic.envs.craftax_pixels_env import CraftaxClassicPixelsEnvNoAutoReset
from craftax.craftax_classic.envs.craftax_symbolic_env import (
    CraftaxClassicSymbolicEnvNoAutoReset)
from craftax.craftax_env import make_craftax_env_from_name

from fused.envs import classic_step, full_step

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


class _FastFullStep:
    """The full game's `step_env`, its `craftax_step` `fused.envs.full_step`'s."""

    def step_env(self, key, state, action, params):
        state, reward = full_step.craftax_step(key, state, action, params,
                                               self.static_env_params)
        done = self.is_terminal(state, params)
        info = log_achievements_to_info(state, done)
        info["discount"] = self.discount(state, params)
        return (jax.lax.stop_gradient(self.get_obs(state)), jax.lax.stop_gradient(state),
                reward, done, info)


class FastSymbolic(_FastFullStep, CraftaxSymbolicEnvNoAutoReset):
    def get_obs(self, state):
        return full_step.observe(state)


class FastPixels(_FastFullStep, CraftaxPixelsEnvNoAutoReset):
    pass  # Craftax's pixel renderer


FAST = {"Craftax-Classic-Symbolic-v1": FastClassicSymbolic,
        "Craftax-Classic-Pixels-v1": FastClassicPixels,
        "Craftax-Symbolic-v1": FastSymbolic, "Craftax-Pixels-v1": FastPixels}


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
