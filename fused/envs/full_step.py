"""The full game's (Craftax-Symbolic's) step: `craftax.craftax.game_logic.craftax_step` of
craftax 1.6.1 with the parts written for the compiler so far put in its place, the rest
Craftax's own functions, called in Craftax's order with Craftax's keys. Written here: DO
(`fused.envs.full_actions`), the moves of mobs and projectiles, and the spawns
(`fused.envs.full_mobs`). One env's state in, one out
(vmap it)."""

from __future__ import annotations

import jax

from craftax.craftax.constants import ACHIEVEMENT_REWARD_MAP, Action
from craftax.craftax.game_logic import (
    boss_logic, calculate_inventory_achievements, calculate_light_level, cast_spell,
    change_floor, clip_inventory_and_intrinsics, do_crafting, drink_potion, enchant,
    level_up_attributes, move_player, place_block, read_book, shoot_projectile,
    update_player_intrinsics, update_plants)

from fused.envs.full_actions import do_action
from fused.envs.full_mobs import spawn_mobs, update_mobs


def craftax_step(rng, state, action, params, static_params):
    """== `craftax.craftax.game_logic.craftax_step`: -> (state, reward)."""
    init_achievements = state.achievements
    init_health = state.player_health
    action = jax.lax.select(state.is_sleeping, Action.NOOP.value, action)
    action = jax.lax.select(state.is_resting, Action.NOOP.value, action)
    state = change_floor(state, action, params, static_params)
    state = do_crafting(state, action)
    rng, key = jax.random.split(rng)
    state = do_action(key, state, action, static_params)
    state = place_block(state, action, static_params)
    state = shoot_projectile(state, action, static_params)
    state = cast_spell(state, action, static_params)
    state = drink_potion(state, action)
    rng, key = jax.random.split(rng)
    state = read_book(key, state, action)
    rng, key = jax.random.split(rng)
    state = enchant(key, state, action)
    state = boss_logic(state, static_params)
    state = level_up_attributes(state, action, params)
    state = move_player(state, action, params)
    rng, key = jax.random.split(rng)
    state = update_mobs(key, state, params, static_params)
    rng, key = jax.random.split(rng)
    state = spawn_mobs(state, key, params, static_params)
    state = update_plants(state, static_params)
    state = update_player_intrinsics(state, action, static_params)
    state = clip_inventory_and_intrinsics(state, params)
    state = calculate_inventory_achievements(state)
    achievement_reward = ((state.achievements.astype(int) - init_achievements.astype(int))
                          * ACHIEVEMENT_REWARD_MAP).sum()
    reward = achievement_reward + (state.player_health - init_health) * 0.1
    rng, key = jax.random.split(rng)
    state = state.replace(timestep=state.timestep + 1,
                          light_level=calculate_light_level(state.timestep + 1, params),
                          state_rng=key)
    return state, reward
