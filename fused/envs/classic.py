"""Craftax-Classic's step written for the compiler: the same game, bit for bit, as
`craftax.craftax_classic.game_logic.craftax_step` (craftax 1.6.1), in few fused kernels.

What differs is only how it is computed: no `lax.scan` (the mobs' loops run unrolled, so XLA
fuses them instead of looping over several kernels and copies an iteration), no scatter into the
map (`fused.envs.grid.Grid` keeps the step's point writes and writes the map once), mob arrays
edited as rows, the spawn draws' binary search unrolled (`fused.envs.draws`), and every quirk of
Craftax's indexing kept (an index of -1 reads the last row; a mob's stale slot still counts).
Functions take and give one env's state (vmap them); PRNG keys are split as Craftax splits them,
in the same order."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from craftax.craftax_classic.constants import (
    CLOSE_BLOCKS, DIRECTIONS, SOLID_BLOCKS, Achievement, Action, BlockType)

from fused.envs.grid import Grid, any_of, first_true, once, one_of, put, take

B = BlockType
A = Action
ACH = Achievement
_SOLID = tuple(int(b) for b in SOLID_BLOCKS)


def _gain(achievements: jax.Array, which: Achievement, cond) -> jax.Array:
    """`achievements.at[which].set(achievements[which] | cond)`, elementwise."""
    hit = jnp.arange(achievements.shape[0]) == which.value
    return achievements | (hit & cond)


def _solid(block: jax.Array) -> jax.Array:
    return one_of(block, _SOLID)


def _in_bounds(pos: jax.Array, shape) -> jax.Array:
    return (0 <= pos[0]) & (pos[0] < shape[0]) & (0 <= pos[1]) & (pos[1] < shape[1])


def _in_mob(mob_map: Grid, player: jax.Array, pos: jax.Array) -> jax.Array:
    return mob_map.at(pos) | (player == pos).all()


def _free(blocks: Grid, mob_map: Grid, player, pos) -> jax.Array:
    """`is_position_in_bounds_not_in_wall_not_in_mob_not_in_lava`."""
    b = blocks.at(pos)
    return (_in_bounds(pos, blocks.base.shape) & ~_solid(b) & ~_in_mob(mob_map, player, pos)
            & ~(b == B.LAVA.value))


# --- the player's actions -----------------------------------------------------------------------

def craft(state, action, blocks: Grid):
    """`do_crafting`: the recipes need a table (and a furnace) among the 8 cells around."""
    near = {}
    for block in (B.CRAFTING_TABLE, B.FURNACE):
        hit = jnp.bool_(False)
        for k in range(CLOSE_BLOCKS.shape[0]):
            pos = state.player_position + CLOSE_BLOCKS[k]
            hit = hit | (_in_bounds(pos, blocks.base.shape) & (blocks.at(pos) == block.value))
        near[block] = hit
    table, furnace = once((near[B.CRAFTING_TABLE], near[B.FURNACE]))  # (every recipe reads them)
    inv, ach = state.inventory, state.achievements

    wood_pickaxe = (action == A.MAKE_WOOD_PICKAXE.value) & ((inv.wood >= 1) & table)
    inv = inv.replace(wood=inv.wood - 1 * wood_pickaxe,
                      wood_pickaxe=inv.wood_pickaxe + 1 * wood_pickaxe)
    ach = _gain(ach, ACH.MAKE_WOOD_PICKAXE, wood_pickaxe)
    stone_pickaxe = (action == A.MAKE_STONE_PICKAXE.value) & (
        ((inv.wood >= 1) & (inv.stone >= 1)) & table)
    inv = inv.replace(stone=inv.stone - 1 * stone_pickaxe, wood=inv.wood - 1 * stone_pickaxe,
                      stone_pickaxe=inv.stone_pickaxe + 1 * stone_pickaxe)
    ach = _gain(ach, ACH.MAKE_STONE_PICKAXE, stone_pickaxe)
    iron_ok = (inv.wood >= 1) & ((inv.stone >= 1) & ((inv.iron >= 1) & (inv.coal >= 1)))
    iron_pickaxe = (action == A.MAKE_IRON_PICKAXE.value) & (iron_ok & (furnace & table))
    inv = inv.replace(iron=inv.iron - 1 * iron_pickaxe, wood=inv.wood - 1 * iron_pickaxe,
                      stone=inv.stone - 1 * iron_pickaxe, coal=inv.coal - 1 * iron_pickaxe,
                      iron_pickaxe=inv.iron_pickaxe + 1 * iron_pickaxe)
    ach = _gain(ach, ACH.MAKE_IRON_PICKAXE, iron_pickaxe)
    wood_sword = (action == A.MAKE_WOOD_SWORD.value) & ((inv.wood >= 1) & table)
    inv = inv.replace(wood=inv.wood - 1 * wood_sword, wood_sword=inv.wood_sword + 1 * wood_sword)
    ach = _gain(ach, ACH.MAKE_WOOD_SWORD, wood_sword)
    stone_sword = (action == A.MAKE_STONE_SWORD.value) & (
        ((inv.stone >= 1) & (inv.wood >= 1)) & table)
    inv = inv.replace(wood=inv.wood - 1 * stone_sword, stone=inv.stone - 1 * stone_sword,
                      stone_sword=inv.stone_sword + 1 * stone_sword)
    ach = _gain(ach, ACH.MAKE_STONE_SWORD, stone_sword)
    iron_ok = (inv.iron >= 1) & ((inv.wood >= 1) & ((inv.stone >= 1) & (inv.coal >= 1)))
    iron_sword = (action == A.MAKE_IRON_SWORD.value) & (iron_ok & (furnace & table))
    inv = inv.replace(wood=inv.wood - 1 * iron_sword, iron=inv.iron - 1 * iron_sword,
                      stone=inv.stone - 1 * iron_sword, coal=inv.coal - 1 * iron_sword,
                      iron_sword=inv.iron_sword + 1 * iron_sword)
    ach = _gain(ach, ACH.MAKE_IRON_SWORD, iron_sword)
    return state.replace(inventory=inv, achievements=ach)


def _strike(mobs, target: jax.Array, damage):
    """One kind of mob struck at `target`: (mobs, attacked, killed). Craftax sets every slot's
    mask to health > 0 (a despawned slot with health left comes back)."""
    hit = (mobs.position == target).all(-1) & mobs.mask
    attacked = any_of(hit)
    index = first_true(hit)
    health = put(mobs.health, index, take(mobs.health, index) + -damage * attacked)
    mask = health > 0
    killed = take(mobs.mask, index) & ~take(mask, index)
    return mobs.replace(health=health, mask=mask), attacked, killed


def do(rng, state, action, blocks: Grid, mob_map: Grid):
    """`do_action`: strike a mob, else mine, drink or eat what the player faces (action DO)."""
    is_do = action == A.DO.value
    inv = state.inventory
    target = state.player_position + DIRECTIONS[state.player_direction]
    damage = jnp.maximum(jnp.maximum(jnp.int32(1), 2 * inv.wood_sword),
                         jnp.maximum(3 * inv.stone_sword, 5 * inv.iron_sword))
    zombies, hit_zombie, killed_zombie = _strike(state.zombies, target, damage)
    cows, hit_cow, killed_cow = _strike(state.cows, target, damage)
    skeletons, hit_skeleton, killed_skeleton = _strike(state.skeletons, target, damage)
    ach = _gain(state.achievements, ACH.DEFEAT_ZOMBIE, killed_zombie)
    ach = _gain(ach, ACH.EAT_COW, killed_cow)
    ach = _gain(ach, ACH.DEFEAT_SKELETON, killed_skeleton)
    food = jax.lax.select(killed_cow, jnp.minimum(9, state.player_food + 6), state.player_food)
    hunger = jax.lax.select(killed_cow, 0.0, state.player_hunger)
    attacked = hit_zombie | hit_cow | hit_skeleton
    killed = killed_zombie | killed_cow | killed_skeleton
    mob_map = mob_map.set(target, mob_map.at(target) & ~killed, is_do)

    block = blocks.at(target)
    tree = block == B.TREE.value
    stone = (block == B.STONE.value) & (inv.wood_pickaxe != 0)
    coal = (block == B.COAL.value) & (inv.wood_pickaxe != 0)
    iron = (block == B.IRON.value) & (inv.stone_pickaxe != 0)
    diamond = (block == B.DIAMOND.value) & (inv.iron_pickaxe != 0)
    _, key = jax.random.split(rng)
    sapling = (block == B.GRASS.value) & (jax.random.uniform(key) < 0.1)
    water = block == B.WATER.value
    eat = block == B.RIPE_PLANT.value
    new_block = jnp.where(tree, B.GRASS.value, block)
    for mined in (stone, coal, iron, diamond):
        new_block = jnp.where(mined, B.PATH.value, new_block)
    new_block = jnp.where(eat, B.PLANT.value, new_block)
    reach = _in_bounds(target, blocks.base.shape) & ~attacked  # else only the strike counts
    blocks = blocks.set(target, new_block, is_do & reach)

    gets = is_do & reach
    inv = inv.replace(wood=inv.wood + 1 * (tree & gets), stone=inv.stone + 1 * (stone & gets),
                      coal=inv.coal + 1 * (coal & gets), iron=inv.iron + 1 * (iron & gets),
                      diamond=inv.diamond + 1 * (diamond & gets),
                      sapling=inv.sapling + 1 * (sapling & gets))
    for which, cond in ((ACH.COLLECT_WOOD, tree), (ACH.COLLECT_STONE, stone),
                        (ACH.COLLECT_COAL, coal), (ACH.COLLECT_IRON, iron),
                        (ACH.COLLECT_DIAMOND, diamond), (ACH.COLLECT_SAPLING, sapling),
                        (ACH.COLLECT_DRINK, water), (ACH.EAT_PLANT, eat)):
        ach = _gain(ach, which, cond & reach)
    drink = jnp.where(water & reach, jnp.minimum(9, state.player_drink + 1), state.player_drink)
    thirst = jnp.where(water & reach, 0.0, state.player_thirst)
    food = jnp.where(eat & reach, jnp.minimum(9, food + 4), food)
    hunger = jnp.where(eat & reach, 0.0, hunger)
    # update_plants_with_eat: the first plant slot at the target, any slot, masked or not (0 if
    # none): its age restarts.
    at_target = (state.growing_plants_positions == target).all(-1)
    ages = put(state.growing_plants_age, first_true(at_target), 0)
    ages = jnp.where(eat & reach, ages, state.growing_plants_age)

    def pick(new, old):
        return jax.tree.map(lambda x, y: jax.lax.select(is_do, x, y), new, old)

    state = state.replace(
        zombies=pick(zombies, state.zombies), cows=pick(cows, state.cows),
        skeletons=pick(skeletons, state.skeletons), achievements=pick(ach, state.achievements),
        inventory=pick(inv, state.inventory), player_food=pick(food, state.player_food),
        player_hunger=pick(hunger, state.player_hunger),
        player_drink=pick(drink, state.player_drink),
        player_thirst=pick(thirst, state.player_thirst),
        growing_plants_age=pick(ages, state.growing_plants_age))
    return state, blocks, mob_map


def place(state, action, blocks: Grid, mob_map: Grid):
    """`place_block`: a table, furnace, stone or sapling on the cell the player faces."""
    target = state.player_position + DIRECTIONS[state.player_direction]
    block = blocks.at(target)
    wall = _solid(block)
    inv = state.inventory
    table = (action == A.PLACE_TABLE.value) & (~wall & (inv.wood >= 2))
    furnace = (action == A.PLACE_FURNACE.value) & (~wall & (inv.stone > 0))
    stone = (action == A.PLACE_STONE.value) & (
        ((block == B.WATER.value) | ~wall) & (inv.stone > 0))
    plant = (action == A.PLACE_PLANT.value) & ((block == B.GRASS.value) & (inv.sapling > 0))
    ok = _in_bounds(target, blocks.base.shape) & ~_in_mob(mob_map, state.player_position, target)
    new_block = block
    for placing, kind in ((table, B.CRAFTING_TABLE), (furnace, B.FURNACE), (stone, B.STONE),
                          (plant, B.PLANT)):
        new_block = jnp.where(placing, kind.value, new_block)
    blocks = blocks.set(target, new_block, ok)
    inv = inv.replace(wood=inv.wood - 2 * (table & ok),
                      stone=inv.stone - 1 * (furnace & ok) - 1 * (stone & ok),
                      sapling=inv.sapling - 1 * (plant & ok))
    ach = state.achievements
    for which, cond in ((ACH.PLACE_TABLE, table), (ACH.PLACE_FURNACE, furnace),
                        (ACH.PLACE_STONE, stone), (ACH.PLACE_PLANT, plant)):
        ach = _gain(ach, which, cond & ok)
    # add_new_growing_plant: the first free slot (slot 0 if none is free: nothing added).
    free = ~state.growing_plants_mask
    index = first_true(free)
    adding = any_of(free) & plant & ok
    slot = jnp.arange(free.shape[0]) == index
    state = state.replace(
        inventory=inv, achievements=ach,
        growing_plants_positions=jnp.where((slot & adding)[:, None], target,
                                           state.growing_plants_positions),
        growing_plants_age=jnp.where(slot & adding, 0, state.growing_plants_age),
        growing_plants_mask=state.growing_plants_mask | (slot & adding))
    return state, blocks


def move(state, action, blocks: Grid, mob_map: Grid):
    """`move_player`: a step onto a free cell (or into lava); a move action turns the player."""
    step = DIRECTIONS[action]
    to = state.player_position + step
    valid = _free(blocks, mob_map, state.player_position, to) | (blocks.at(to) == B.LAVA.value)
    is_new = jnp.sum(jnp.abs(step)) != 0
    return state.replace(
        player_position=state.player_position + valid.astype(jnp.int32) * step,
        player_direction=state.player_direction * (1 - is_new) + action * is_new)
