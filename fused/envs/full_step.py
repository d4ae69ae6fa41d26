"""The full game's (Craftax-Symbolic's) step: `craftax.craftax.game_logic.craftax_step` of
craftax 1.6.1 with the parts written for the compiler so far put in its place, the rest
Craftax's own functions, called in Craftax's order with Craftax's keys. Written here: crafting
and DO (`fused.envs.full_actions`), the moves of mobs and projectiles, and the spawns
(`fused.envs.full_mobs`), the plants and the inventory's achievements (below). One env's state in, one out
(vmap it)."""

from __future__ import annotations

import jax

import jax.numpy as jnp

from craftax.craftax.constants import ACHIEVEMENT_REWARD_MAP, Achievement, Action, BlockType
from craftax.craftax.game_logic import (
    boss_logic, calculate_light_level, cast_spell, change_floor, clip_inventory_and_intrinsics,
    drink_potion, enchant, level_up_attributes, move_player, place_block,
    read_book, shoot_projectile, update_player_intrinsics)

from fused.envs.full_actions import do_action, do_crafting
from fused.envs.full_mobs import spawn_mobs, update_mobs
from fused.envs.grid import Grid

ACH = Achievement


def update_plants(state, static_params):
    """== `update_plants`: every live sapling (all on the overworld, floor 0) ages; at 600 it
    ripens."""
    age = (state.growing_plants_age + 1) * state.growing_plants_mask
    blocks = Grid(state.map[0])
    for k in range(static_params.max_growing_plants):
        blocks = blocks.set(state.growing_plants_positions[k], BlockType.RIPE_PLANT.value,
                            age[k] >= 600)
    return state.replace(map=state.map.at[0].set(blocks.array()), growing_plants_age=age)


def calculate_inventory_achievements(state):
    """== `calculate_inventory_achievements`: what the inventory holds counts as collected or
    made, however it came (mined, crafted, looted), each an OR into its achievement."""
    inv = state.inventory
    held = [(ACH.COLLECT_WOOD, inv.wood > 0), (ACH.COLLECT_STONE, inv.stone > 0),
            (ACH.COLLECT_COAL, inv.coal > 0), (ACH.COLLECT_IRON, inv.iron > 0),
            (ACH.COLLECT_DIAMOND, inv.diamond > 0), (ACH.COLLECT_RUBY, inv.ruby > 0),
            (ACH.COLLECT_SAPPHIRE, inv.sapphire > 0), (ACH.COLLECT_SAPLING, inv.sapling > 0),
            (ACH.FIND_BOW, inv.bow > 0), (ACH.MAKE_ARROW, inv.arrows > 0),
            (ACH.MAKE_TORCH, inv.torches > 0)]
    for tier, (pickaxe, sword) in enumerate(
            [(ACH.MAKE_WOOD_PICKAXE, ACH.MAKE_WOOD_SWORD),
             (ACH.MAKE_STONE_PICKAXE, ACH.MAKE_STONE_SWORD),
             (ACH.MAKE_IRON_PICKAXE, ACH.MAKE_IRON_SWORD),
             (ACH.MAKE_DIAMOND_PICKAXE, ACH.MAKE_DIAMOND_SWORD)], start=1):
        held += [(pickaxe, inv.pickaxe >= tier), (sword, inv.sword >= tier)]
    slots = jnp.arange(state.achievements.shape[0])
    achievements = state.achievements
    for which, cond in held:
        achievements = achievements | ((slots == which.value) & cond)
    return state.replace(achievements=achievements)


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
