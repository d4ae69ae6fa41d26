"""Craftax-Classic's mobs, bit for bit `update_mobs` and `spawn_mobs` of craftax 1.6.1.

Craftax moves zombies, cows, skeletons and arrows one after another in slot order, each in a
`lax.scan` step that sees the mob map as the ones before left it. Most of a mob's move does not
depend on the others: its random draws (the keys are one chain of splits, then each draw stands
alone), where it would go, whether it attacks. Those are computed for all slots of a kind at
once (vmapped over slots); only what the others change is done slot by slot: whether the cell
is free (the mob map), the player's health and sleep, the arrows a skeleton shoots. The mob map
and the map are `Grid`s (point writes, applied once)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from craftax.craftax_classic.constants import DIRECTIONS, Achievement, BlockType

from fused.envs.classic import _free, _gain, _in_bounds, _in_mob, _solid
from fused.envs.draws import choice
from fused.envs.grid import Grid, fence, first_true, once, put, spawn_into, take
from fused.envs.keys import fence_keys

B = BlockType


def _key_chain(rng, slots: int, splits: int, carry_second: bool):
    """Craftax's scan over slots, each splitting its carried key `splits` times (`rng, k =
    split(rng)`), carrying on with the last split's first half or (`carry_second`) second half:
    -> (keys [slots, splits - carry_second, 2], the carry after the last slot)."""
    keys = []
    for _ in range(slots):
        row = []
        for _ in range(splits):
            rng, key = jax.random.split(rng)
            row.append(key)
        if carry_second:
            rng = row.pop()
        keys.append(jnp.stack(row))
    return fence_keys((jnp.stack(keys), rng))  # computed once: each key feeds two


def _towards(key, pos, player):
    """A unit step towards the player along one axis, the axis drawn with probability by which
    distance is largest (Craftax's `player_move_direction`)."""
    far = jnp.abs(player - pos)
    p = (far == far.max()) / far.sum()
    axis = choice(key, jnp.arange(2), p)
    step = jnp.sign(take(player, axis) - take(pos, axis)).astype(jnp.int32)
    return put(jnp.zeros((2,), dtype=jnp.int32), axis, step)


def _wander(key, moves):
    return jax.random.choice(key, moves)


def _relocate(mob_map: Grid, old, alive, new, stays):
    """Clear the old cell if alive, then mark the new one if it stays alive."""
    mob_map = mob_map.set(old, mob_map.at(old) & ~alive)
    return mob_map.set(new, mob_map.at(new) | stays)


def _settle(mobs, to, blocks: Grid, mob_map: Grid, player, params):
    """Slot by slot: move to `to` [n, 2] where free, despawn if far; -> (mobs, mob_map)."""
    pos, mask = list(mobs.position), list(mobs.mask)
    for i in range(len(pos)):
        new = jax.lax.select(_free(blocks, mob_map, player, to[i]), to[i], pos[i])
        stays = mask[i] & (jnp.abs(pos[i] - player).sum() < params.mob_despawn_distance)
        mob_map = _relocate(mob_map, pos[i], mask[i], new, stays)
        pos[i], mask[i] = new, stays
        mob_map, pos, mask = fence((mob_map, pos, mask))
    return mobs.replace(position=jnp.stack(pos), mask=jnp.stack(mask)), mob_map


def _zombies(rng, state, blocks, mob_map, params):
    z, player = state.zombies, state.player_position
    keys, rng = _key_chain(rng, z.mask.shape[0], 4, carry_second=True)
    wander = z.position + jax.vmap(_wander, (0, None))(keys[:, 0], DIRECTIONS[1:5])
    chase = z.position + jax.vmap(_towards, (0, 0, None))(keys[:, 1], z.position, player)
    distance = jnp.sum(jnp.abs(z.position - player), -1)
    close = (distance < 10) & (jax.vmap(jax.random.uniform)(keys[:, 2]) < 0.75)
    to = jnp.where(close[:, None], chase, wander)
    attack = (distance == 1) & (z.attack_cooldown <= 0) & z.mask
    to = jnp.where(attack[:, None], z.position, to)
    cooldown = jnp.where(attack, 5, z.attack_cooldown - 1)
    to, attack, cooldown = once((to, attack, cooldown))  # (each slot reads them: once)
    health, sleeping, ach = state.player_health, state.is_sleeping, state.achievements
    for i in range(z.mask.shape[0]):  # a bite wakes the player: later bites hurt less
        ach = _gain(ach, Achievement.WAKE_UP, sleeping & attack[i])
        health = health - jax.lax.select(sleeping, 7, 2) * attack[i]
        sleeping = sleeping & ~attack[i]
    zombies, mob_map = _settle(z.replace(attack_cooldown=cooldown), to, blocks, mob_map,
                               player, params)
    state = state.replace(zombies=zombies, player_health=health, is_sleeping=sleeping,
                          achievements=ach)
    return rng, state, mob_map


def _cows(rng, state, blocks, mob_map, params):
    c = state.cows
    keys, rng = _key_chain(rng, c.mask.shape[0], 1, carry_second=False)
    # DIRECTIONS[5:9] are zeros: half the draws stand still
    to = once(c.position + jax.vmap(_wander, (0, None))(keys[:, 0], DIRECTIONS[1:9]))
    cows, mob_map = _settle(c, to, blocks, mob_map, state.player_position, params)
    return rng, state.replace(cows=cows), mob_map


def ranged_moves(keys, position, player, far: int):
    """A ranged mob's proposed move, Classic's skeletons' and the full game's alike: towards the
    player from `far` away, away from it within 3, else a random step; 15% of the time a random
    step whatever. keys [n, 3]. -> (to [n, 2], the step towards the player [n, 2], too close
    [n], in shooting range 4-5 [n])."""
    wander = position + jax.vmap(_wander, (0, None))(keys[:, 0], DIRECTIONS[1:5])
    step = jax.vmap(_towards, (0, 0, None))(keys[:, 1], position, player)
    distance = jnp.sum(jnp.abs(position - player), -1)
    too_close = distance <= 3
    to = jnp.where((distance >= far)[:, None], position + step, wander)
    to = jnp.where(too_close[:, None], position - step, to)
    to = jnp.where((jax.vmap(jax.random.uniform)(keys[:, 2]) > 0.85)[:, None], to, wander)
    return to, step, too_close, (distance >= 4) & (distance <= 5)


def _skeletons(rng, state, blocks, mob_map, params, static_params):
    s, player = state.skeletons, state.player_position
    keys, rng = _key_chain(rng, s.mask.shape[0], 3, carry_second=False)
    to, step, too_close, in_range = once(ranged_moves(keys, s.position, player, far=10))
    ready = (s.attack_cooldown <= 0) & s.mask
    arrows, directions = state.arrows, state.arrow_directions
    pos, mask, cooldown = list(s.position), list(s.mask), list(s.attack_cooldown)
    for i in range(len(pos)):
        # Shoot at range 4-5, or when too close with the way back blocked.
        attack = (in_range[i] | (too_close[i] & ~_free(blocks, mob_map, player, to[i]))) & ready[i]
        spawning = attack & (arrows.mask.sum() < static_params.max_arrows)
        arrows, directions = spawn_into(arrows, directions, spawning, step[i], position=pos[i])
        target = jax.lax.select(attack, pos[i], to[i])
        cooldown[i] = jax.lax.select(attack, 4, cooldown[i] - 1)
        new = jax.lax.select(_free(blocks, mob_map, player, target), target, pos[i])
        stays = mask[i] & (jnp.abs(pos[i] - player).sum() < params.mob_despawn_distance)
        mob_map = _relocate(mob_map, pos[i], mask[i], new, stays)
        pos[i], mask[i] = new, stays
        mob_map, pos, mask, cooldown, arrows, directions = fence(
            (mob_map, pos, mask, cooldown, arrows, directions))
    state = state.replace(
        skeletons=s.replace(position=jnp.stack(pos), attack_cooldown=jnp.stack(cooldown),
                            mask=jnp.stack(mask)),
        arrows=arrows, arrow_directions=directions)
    return rng, state, mob_map


def _arrows(state, blocks: Grid, mob_map: Grid):
    a = state.arrows
    health, sleeping, player = state.player_health, state.is_sleeping, state.player_position
    to = a.position + state.arrow_directions
    mask = list(a.mask)
    for i in range(len(mask)):  # one arrow may break the table the next one would hit
        block = blocks.at(to[i])
        wall = _solid(block) & ~(block == B.WATER.value)  # arrows fly over water
        flies = _in_bounds(to[i], blocks.base.shape) & ~wall & ~_in_mob(mob_map, player, to[i])
        hit_player = (to[i] == player).all() & a.mask[i]
        # A live arrow reaching a table or furnace breaks it (into a path).
        breaks = ((block == B.FURNACE.value) | (block == B.CRAFTING_TABLE.value)) & a.mask[i]
        blocks = blocks.set(to[i], B.PATH.value, breaks)
        health = health - 2 * hit_player
        sleeping = sleeping & ~hit_player
        mask[i] = flies & a.mask[i]
    state = state.replace(arrows=a.replace(position=to, mask=jnp.stack(mask)),
                          player_health=health, is_sleeping=sleeping)
    return state, blocks


def update_mobs(rng, state, blocks: Grid, mob_map: Grid, params, static_params):
    """Zombies, cows, skeletons, then arrows; -> (state, blocks, mob_map)."""
    rng, _ = jax.random.split(rng)
    rng, state, mob_map = _zombies(rng, state, blocks, mob_map, params)
    rng, _ = jax.random.split(rng)
    rng, state, mob_map = _cows(rng, state, blocks, mob_map, params)
    rng, _ = jax.random.split(rng)
    rng, state, mob_map = _skeletons(rng, state, blocks, mob_map, params, static_params)
    state, blocks = _arrows(state, blocks, mob_map)
    return state, blocks, mob_map


def _spawn_one(key, mobs, can_map, chance_key, chance, health, shape):
    """One spawn: the first free slot gets a cell drawn uniformly from `can_map` [H, W]."""
    can = (mobs.mask.sum() < mobs.mask.shape[0]) & (jax.random.uniform(chance_key) < chance)
    can = can & (can_map.sum() > 0)
    cell = choice(key, jnp.arange(shape[0] * shape[1]),
                  jnp.reshape(can_map, -1) / jnp.sum(can_map), shape=(1,))
    cell = jnp.array([cell // shape[0], cell % shape[1]]).T.astype(jnp.int32)[0]
    can, cell, slot = once((can, cell, first_true(~mobs.mask)))  # (read by each field: once)
    position = jax.lax.select(can, cell, take(mobs.position, slot))
    new_health = jax.lax.select(can, health, take(mobs.health, slot))
    alive = jax.lax.select(can, True, take(mobs.mask, slot))
    mobs = mobs.replace(position=put(mobs.position, slot, position),
                        health=put(mobs.health, slot, new_health),
                        mask=put(mobs.mask, slot, alive))
    return mobs, position, alive


def spawn_mobs(state, rng, blocks: Grid, mob_map: Grid, params, static_params):
    """A cow, a zombie (more likely at night) and a skeleton may appear near the player, on the
    maps as the mobs left them (written here: `flat`). -> (state, blocks, mob_map)."""
    shape = static_params.map_size
    player = state.player_position
    blocks, mob_map = blocks.flat(), mob_map.flat()
    rows = jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    distance = jnp.abs(rows - player[0]) + jnp.abs(cols - player[1])
    grid = blocks.base

    def near(nearest):
        return (distance > nearest) & (distance < params.mob_despawn_distance)

    rng, chance_key = jax.random.split(rng)
    rng, key = jax.random.split(rng)
    can = (grid == B.GRASS.value) & near(3) & ~mob_map.dense()
    cows, at, alive = _spawn_one(key, state.cows, can, chance_key, params.spawn_cow_chance,
                                 params.cow_health, shape)
    mob_map = mob_map.set(at, mob_map.at(at) | alive)

    rng, chance_key = jax.random.split(rng)
    chance = (params.spawn_zombie_base_chance
              + params.spawn_zombie_night_chance * jnp.square(1 - state.light_level))
    rng, key = jax.random.split(rng)
    can = ((grid == B.GRASS.value) | (grid == B.PATH.value)) & near(9) & ~mob_map.dense()
    zombies, at, alive = _spawn_one(key, state.zombies, can, chance_key, chance,
                                    params.zombie_health, shape)
    mob_map = mob_map.set(at, mob_map.at(at) | alive)

    rng, chance_key = jax.random.split(rng)
    rng, key = jax.random.split(rng)
    can = (grid == B.PATH.value) & near(9) & ~mob_map.dense()
    skeletons, at, alive = _spawn_one(key, state.skeletons, can, chance_key,
                                      params.spawn_skeleton_chance, params.skeleton_health, shape)
    mob_map = mob_map.set(at, mob_map.at(at) | alive)
    state = state.replace(cows=cows, zombies=zombies, skeletons=skeletons)
    return state, blocks, mob_map
