"""The full game's (Craftax-Symbolic's) step: `craftax.craftax.game_logic.craftax_step` of
craftax 1.6.1 with the parts written for the compiler so far put in its place, the rest
Craftax's own functions, called in Craftax's order with Craftax's keys. Written here: crafting,
DO, placing, shooting, spells, potions, books and enchanting (`fused.envs.full_actions`), the
moves of mobs and projectiles and the spawns (`fused.envs.full_mobs`), the plants, the
inventory's achievements and the symbolic observation (below); Craftax's: the floors,
attributes, movement, the boss, intrinsics and light. One env's state in, one out (vmap it)."""

from __future__ import annotations

import jax

import jax.numpy as jnp

from craftax.craftax.constants import (
    ACHIEVEMENT_REWARD_MAP, MAX_OBS_DIM, MONSTERS_KILLED_TO_CLEAR_LEVEL, OBS_DIM, Achievement,
    Action, BlockType, ItemType)
from craftax.craftax.game_logic import (
    boss_logic, calculate_light_level, change_floor, clip_inventory_and_intrinsics,
    level_up_attributes, move_player, update_player_intrinsics)
from craftax.craftax.util.game_logic_utils import is_boss_vulnerable

from fused.envs.full_actions import (
    cast_spell, do_action, do_crafting, drink_potion, enchant, place_block, read_book,
    shoot_projectile)
from fused.envs.full_mobs import put_floor, spawn_mobs, update_mobs
from fused.envs.grid import Grid, wrap

ACH = Achievement


def update_plants(state, static_params):
    """== `update_plants`: every live sapling (all on the overworld, floor 0) ages; at 600 it
    ripens."""
    age = (state.growing_plants_age + 1) * state.growing_plants_mask
    blocks = Grid(state.map[0])
    for k in range(static_params.max_growing_plants):
        blocks = blocks.set(state.growing_plants_positions[k], BlockType.RIPE_PLANT.value,
                            age[k] >= 600)
    return state.replace(map=put_floor(state.map, 0, blocks.array()), growing_plants_age=age)


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


def observe(state) -> jax.Array:
    """== `craftax.craftax.renderer.render_craftax_symbolic`: the 9 x 11 view one-hot (blocks,
    items, a channel per class and kind of mob, all dark beyond the light), the light, then the
    inventory, potions, intrinsics, direction, armour, enchantments and the floor's state.
    Craftax writes the mobs one slot at a time in five loops; here the slots are unrolled, each a
    point write on a CPU and a select over the view elsewhere (a slot off the view, or dead,
    writes a 0 where its wrapped index lands)."""
    level = state.player_level
    dims = jnp.array(OBS_DIM, dtype=jnp.int32)
    corner = state.player_position - dims // 2 + MAX_OBS_DIM + 2

    def view(grid, fill):
        padded = jnp.pad(grid[level], (MAX_OBS_DIM + 2, MAX_OBS_DIM + 2), constant_values=fill)
        return jax.lax.dynamic_slice(padded, corner, OBS_DIM)

    blocks = jax.nn.one_hot(view(state.map, BlockType.OUT_OF_BOUNDS.value),
                            num_classes=len(BlockType))
    items = jax.nn.one_hot(view(state.item_map, ItemType.NONE.value), num_classes=len(ItemType))
    kinds = 8  # mob types a class
    shape = (*OBS_DIM, 5 * kinds)
    writes = []  # (row, column, channel, value) a slot, in Craftax's order
    for c, group in enumerate((state.melee_mobs, state.passive_mobs, state.ranged_mobs,
                               state.mob_projectiles, state.player_projectiles)):
        for k in range(group.mask.shape[1]):
            local = group.position[level, k] - state.player_position + dims // 2
            on = ((local >= 0) & (local < dims)).all() * group.mask[level, k]
            writes.append((local[0], local[1], c * kinds + group.type_id[level, k],
                           on.astype(jnp.int32)))

    def scattered(writes):  # (a CPU: each a point write, as Craftax's)
        mobs = jnp.zeros(shape, dtype=jnp.int32)
        for r, col, chan, value in writes:
            mobs = mobs.at[r, col, chan].set(value)
        return mobs

    def selected(writes):  # (a GPU: each a select over the view, fused into one kernel)
        rows, cols, chans = (jax.lax.broadcasted_iota(jnp.int32, shape, d) for d in range(3))
        mobs = jnp.zeros(shape, dtype=jnp.int32)
        for r, col, chan, value in writes:
            index = [wrap(r, shape[0]), wrap(col, shape[1]), wrap(chan, shape[2])]
            inside = ((index[0] >= 0) & (index[0] < shape[0]) & (index[1] >= 0)
                      & (index[1] < shape[1]) & (index[2] >= 0) & (index[2] < shape[2]))
            hit = inside & (rows == index[0]) & (cols == index[1]) & (chans == index[2])
            mobs = jnp.where(hit, value, mobs)
        return mobs

    mobs = jax.lax.platform_dependent(writes, cpu=scattered, default=selected)
    all_map = jnp.concatenate([blocks, items, mobs], axis=-1)
    light = view(state.light_map, 0.0) > 0.05
    all_map = jnp.concatenate((all_map * light[:, :, None], light[:, :, None]), axis=-1)
    inv = state.inventory
    inventory = jnp.array(
        [jnp.sqrt(getattr(inv, k)) / 10.0 for k in ("wood", "stone", "coal", "iron", "diamond",
                                                    "sapphire", "ruby", "sapling", "torches",
                                                    "arrows")]
        + [inv.books / 2.0, inv.pickaxe / 4.0, inv.sword / 4.0, state.sword_enchantment,
           state.bow_enchantment, inv.bow]).astype(jnp.float32)
    intrinsics = jnp.array([state.player_health / 10.0, state.player_food / 10.0,
                            state.player_drink / 10.0, state.player_energy / 10.0,
                            state.player_mana / 10.0, state.player_xp / 10.0,
                            state.player_dexterity / 10.0, state.player_strength / 10.0,
                            state.player_intelligence / 10.0]).astype(jnp.float32)
    special = jnp.array([
        state.light_level, state.is_sleeping, state.is_resting, state.learned_spells[0],
        state.learned_spells[1], level / 10.0,
        state.monsters_killed[level] >= MONSTERS_KILLED_TO_CLEAR_LEVEL,
        is_boss_vulnerable(state)])
    return jnp.concatenate([all_map.flatten(), inventory, jnp.sqrt(inv.potions) / 10.0,
                            intrinsics, jax.nn.one_hot(state.player_direction - 1, num_classes=4),
                            inv.armour / 2.0, state.armour_enchantments, special])
