"""The full game's mobs, bit for bit `update_mobs` and `spawn_mobs` of craftax 1.6.1
(`craftax.craftax.game_logic`).

Craftax moves the melee, passive and ranged mobs of the player's floor, then the mobs'
projectiles, then the player's, one slot after another, each a `lax.scan` step carrying the
whole state (every floor's maps and mobs). Here only the player's floor is taken out of the
state (its map and mob map as `Grid`s, its mob rows), the slots are unrolled, what a slot does
not learn from the ones before (its random draws, where it would go, the damage it would deal)
is computed for all slots of a kind at once, and the floor is put back once, by selects. As in
`fused.envs.classic_mobs` (Classic's mobs), every quirk is kept: a dead slot still moves, a
projectile's stale position still drifts, reads of an index of -1 wrap, a kill anywhere clears
every floor's dead mobs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from craftax.craftax.constants import (
    DIRECTIONS, FLOOR_MOB_MAPPING, FLOOR_MOB_SPAWN_CHANCE, MOB_ACHIEVEMENT_MAP,
    MOB_TYPE_COLLISION_MAPPING, MOB_TYPE_DAMAGE_MAPPING, MOB_TYPE_DEFENSE_MAPPING,
    MOB_TYPE_HEALTH_MAPPING, MONSTERS_KILLED_TO_CLEAR_LEVEL,
    RANGED_MOB_TYPE_TO_PROJECTILE_TYPE_MAPPING, SOLID_BLOCKS, Achievement, BlockType, MobType,
    ProjectileType)
from craftax.craftax.util.game_logic_utils import (
    get_damage, get_damage_done_to_player, get_max_food)
from craftax.craftax.util.maths_utils import get_distance_map

from fused.envs import keys as fast_keys
from fused.envs.classic import _in_bounds, _in_mob
from fused.envs.classic_mobs import _key_chain, _relocate, _towards, _wander, ranged_moves
from fused.envs.draws import choice
from fused.envs.grid import Grid, any_of, fence, first_true, once, one_of, put, spawn_into, take

B = BlockType
_SOLID = tuple(int(b) for b in SOLID_BLOCKS)


def _solid(block: jax.Array) -> jax.Array:
    """The full game's solid blocks (more than Classic's)."""
    return one_of(block, _SOLID)


def _valid(blocks: Grid, mob_map: Grid, player, pos, collision) -> jax.Array:
    """`is_position_in_bounds_not_in_mob_not_colliding`; collision [3]: ground, water, lava."""
    b = blocks.at(pos)
    solid, water, lava = _solid(b), b == B.WATER.value, b == B.LAVA.value
    ground = ~solid & ~water & ~lava
    ok = _in_bounds(pos, blocks.base.shape) & ~_in_mob(mob_map, player, pos) & ~solid
    c = collision.astype(bool)
    return ok & (~c[0] | ~ground) & (~c[1] | ~water) & (~c[2] | ~lava)


def _gain(achievements: jax.Array, index, cond) -> jax.Array:
    """`achievements.at[index].set(achievements[index] | cond)`, elementwise."""
    return put(achievements, index, take(achievements, index) | cond)


def _row(tree, level):
    return jax.tree.map(lambda x: x[level], tree)


def _put_row(tree, level, row):
    return jax.tree.map(lambda x, r: put(x, level, r), tree, row)


def put_floor(x: jax.Array, level, floor: jax.Array) -> jax.Array:
    """`x.at[level].set(floor)` for a map of every floor [L, H, W]: on a CPU the floor's slice
    updated in place; elsewhere (a GPU) a select over the floors, which fuses with what computes
    `floor` (vmapped, the update would be a scatter kernel of its own). The lowering platform
    picks; the values are the same."""
    return jax.lax.platform_dependent(
        x, level, floor, cpu=lambda x, i, f: x.at[i].set(f), default=put)


def _damage_to_player(state, static_params, vectors):
    """`get_damage_done_to_player` of each damage vector [n, 3]: [n] float32."""
    return jax.vmap(lambda v: get_damage_done_to_player(state, static_params, v))(vectors)


class _Floor:
    """The player's floor, taken out of the state: its map and mob map (`Grid`s), its mob rows."""

    def __init__(self, state):
        self.level = state.player_level
        self.blocks = Grid(state.map[self.level])
        self.mob_map = Grid(state.mob_map[self.level])
        self.melee = _row(state.melee_mobs, self.level)
        self.passive = _row(state.passive_mobs, self.level)
        self.ranged = _row(state.ranged_mobs, self.level)
        self.shots = _row(state.mob_projectiles, self.level)
        self.shot_dirs = state.mob_projectile_directions[self.level]
        self.arrows = _row(state.player_projectiles, self.level)
        self.arrow_dirs = state.player_projectile_directions[self.level]


def _settle(mobs, to, collision, floor: _Floor, player, keep_far, params):
    """Slot by slot: move to `to` [n, 2] where valid, despawn if far unless `keep_far`."""
    pos, mask = list(mobs.position), list(mobs.mask)
    mob_map = floor.mob_map
    for i in range(len(pos)):
        ok = _valid(floor.blocks, mob_map, player, to[i], collision[i])
        new = jax.lax.select(ok, to[i], pos[i])
        stays = mask[i] & ((jnp.abs(pos[i] - player).sum() < params.mob_despawn_distance)
                           | keep_far)
        mob_map = _relocate(mob_map, pos[i], mask[i], new, stays)
        pos[i], mask[i] = new, stays
        mob_map, pos, mask = fence((mob_map, pos, mask))
    floor.mob_map = mob_map
    return mobs.replace(position=jnp.stack(pos), mask=jnp.stack(mask))


def _melee(rng, state, floor: _Floor, boss, params, static_params):
    m, player = floor.melee, state.player_position
    keys, rng = _key_chain(rng, m.mask.shape[0], 4, carry_second=True)
    wander = m.position + jax.vmap(_wander, (0, None))(keys[:, 0], DIRECTIONS[1:5])
    chase = m.position + jax.vmap(_towards, (0, 0, None))(keys[:, 1], m.position, player)
    distance = jnp.sum(jnp.abs(m.position - player), -1)
    close = ((distance < 10) | boss) & (jax.vmap(jax.random.uniform)(keys[:, 2]) < 0.75)
    to = jnp.where(close[:, None], chase, wander)
    attack = (distance == 1) & (m.attack_cooldown <= 0) & m.mask
    to = jnp.where(attack[:, None], m.position, to)
    base = MOB_TYPE_DAMAGE_MAPPING[m.type_id, MobType.MELEE.value]
    awake, asleep = (_damage_to_player(state, static_params, base * (1 + 2.5 * jnp.asarray(s)))
                     for s in (False, True))
    # (each slot reads them: computed once)
    to, attack, awake, asleep = once((to, attack, awake, asleep), floats=True)
    health, sleeping, resting = state.player_health, state.is_sleeping, state.is_resting
    ach = state.achievements
    for i in range(m.mask.shape[0]):  # a blow wakes the player: later blows hurt less
        damage = jax.lax.select(sleeping, asleep[i], awake[i])
        health = health - damage * attack[i]
        ach = _gain(ach, Achievement.WAKE_UP.value, sleeping & attack[i])
        sleeping, resting = sleeping & ~attack[i], resting & ~attack[i]
    cooldown = jnp.where(attack, 5, m.attack_cooldown - 1)
    collision = MOB_TYPE_COLLISION_MAPPING[m.type_id, 1]
    floor.melee = _settle(m.replace(attack_cooldown=cooldown), to, collision, floor, player,
                          boss, params)
    state = state.replace(player_health=health, is_sleeping=sleeping, is_resting=resting,
                          achievements=ach)
    return rng, state


def _passive(rng, state, floor: _Floor, params):
    m = floor.passive
    keys, rng = _key_chain(rng, m.mask.shape[0], 1, carry_second=False)
    # DIRECTIONS[5:9] are zeros: half the draws stand still
    to = once(m.position + jax.vmap(_wander, (0, None))(keys[:, 0], DIRECTIONS[1:9]))
    collision = MOB_TYPE_COLLISION_MAPPING[m.type_id, 0]
    floor.passive = _settle(m, to, collision, floor, state.player_position, False, params)
    return rng


def _ranged(rng, state, floor: _Floor, boss, params, static_params):
    m, player = floor.ranged, state.player_position
    keys, rng = _key_chain(rng, m.mask.shape[0], 3, carry_second=False)
    to, step, too_close, in_range = once(ranged_moves(keys, m.position, player, far=6))
    ready = (m.attack_cooldown <= 0) & m.mask
    collision = MOB_TYPE_COLLISION_MAPPING[m.type_id, 2]
    kind = RANGED_MOB_TYPE_TO_PROJECTILE_TYPE_MAPPING[m.type_id]
    shots, dirs, mob_map = floor.shots, floor.shot_dirs, floor.mob_map
    pos, mask, cooldown = list(m.position), list(m.mask), list(m.attack_cooldown)
    for i in range(len(pos)):
        # Shoot at range 4-5, or when too close with the way back blocked.
        blocked = ~_valid(floor.blocks, mob_map, player, to[i], collision[i])
        attack = (in_range[i] | (too_close[i] & blocked)) & ready[i]
        spawning = attack & (shots.mask.sum() < static_params.max_mob_projectiles)
        shots, dirs = spawn_into(shots, dirs, spawning, step[i], position=pos[i],
                                 type_id=kind[i])
        target = jax.lax.select(attack, pos[i], to[i])
        cooldown[i] = jax.lax.select(attack, 4, cooldown[i] - 1)
        new = jax.lax.select(_valid(floor.blocks, mob_map, player, target, collision[i]),
                             target, pos[i])
        stays = mask[i] & ((jnp.abs(pos[i] - player).sum() < params.mob_despawn_distance)
                           | boss)
        mob_map = _relocate(mob_map, pos[i], mask[i], new, stays)
        pos[i], mask[i] = new, stays
        mob_map, pos, mask, cooldown, shots, dirs = fence(
            (mob_map, pos, mask, cooldown, shots, dirs))
    floor.ranged = m.replace(position=jnp.stack(pos), attack_cooldown=jnp.stack(cooldown),
                             mask=jnp.stack(mask))
    floor.shots, floor.shot_dirs, floor.mob_map = shots, dirs, mob_map


def _mob_shots(state, floor: _Floor, static_params):
    """The mobs' projectiles fly: a live one reaching the player hurts, one reaching a table or
    furnace breaks it (into a path)."""
    p, player = floor.shots, state.player_position
    to = p.position + floor.shot_dirs
    damage = _damage_to_player(state, static_params,
                               MOB_TYPE_DAMAGE_MAPPING[p.type_id, MobType.PROJECTILE.value])
    health, sleeping, resting = state.player_health, state.is_sleeping, state.is_resting
    blocks, mask = floor.blocks, list(p.mask)
    for i in range(len(mask)):  # one may break the table the next one would hit
        block = blocks.at(to[i])
        wall = _solid(block) & ~(block == B.WATER.value)  # they fly over water
        flies = (_in_bounds(to[i], blocks.base.shape) & ~wall
                 & ~_in_mob(floor.mob_map, player, to[i]))
        hit = ((p.position[i] == player).all() | (to[i] == player).all()) & p.mask[i]
        breaks = ((block == B.FURNACE.value) | (block == B.CRAFTING_TABLE.value)) & p.mask[i]
        blocks = blocks.set(to[i], B.PATH.value, breaks)
        health = health - damage[i] * hit
        sleeping, resting = sleeping & ~hit, resting & ~hit
        mask[i] = flies & ~hit & p.mask[i]
    floor.shots = p.replace(position=to, mask=jnp.stack(mask))
    floor.blocks = blocks
    return state.replace(player_health=health, is_sleeping=sleeping, is_resting=resting)


def _strike(mobs, position, damage_vector, can_gain, kind: int, achievements):
    """`attack_mob_class` on the player's floor: the first live mob at `position` takes the
    damage. -> (mobs, killed, struck, achievements)."""
    hits = (mobs.position == position).all(-1) & mobs.mask
    struck = any_of(hits)
    target = first_true(hits)
    type_id = take(mobs.type_id, target)
    damage = get_damage(damage_vector, MOB_TYPE_DEFENSE_MAPPING[type_id, kind])
    health = put(mobs.health, target, take(mobs.health, target) + -damage * struck)
    was_alive = take(mobs.mask, target)
    mask = (health > 0) & mobs.mask
    killed = was_alive & ~take(mask, target)
    achievements = _gain(achievements, MOB_ACHIEVEMENT_MAP[kind, type_id], killed & can_gain)
    return mobs.replace(health=health, mask=mask), killed, struck, achievements


def _attack(state, floor: _Floor, position, damage_vector, can_eat: bool = False):
    """`attack_mob` on the player's floor (a passive mob killed is eaten if `can_eat`): ->
    (state, struck)."""
    ach = state.achievements
    floor.melee, killed_melee, struck_melee, ach = _strike(floor.melee, position, damage_vector,
                                                           True, 1, ach)
    floor.passive, killed_passive, struck_passive, ach = _strike(
        floor.passive, position, damage_vector, can_eat, 0, ach)
    if can_eat:
        eaten = killed_passive
        state = state.replace(
            player_food=jax.lax.select(eaten, jnp.minimum(get_max_food(state),
                                                          state.player_food + 6),
                                       state.player_food),
            player_hunger=jax.lax.select(eaten, 0.0, state.player_hunger))
    floor.ranged, killed_ranged, struck_ranged, ach = _strike(floor.ranged, position,
                                                              damage_vector, True, 2, ach)
    monster = killed_melee | killed_ranged
    floor.mob_map = floor.mob_map.set(
        position, floor.mob_map.at(position) & ~(monster | killed_passive))
    state = state.replace(
        achievements=ach,
        monsters_killed=put(state.monsters_killed, floor.level,
                            take(state.monsters_killed, floor.level) + 1 * monster))
    return state, struck_melee | struck_passive | struck_ranged


def _player_shots(state, floor: _Floor):
    """The player's arrows and spells fly, striking a mob where they are and where they go."""
    p = floor.arrows
    kind = p.type_id
    damage = MOB_TYPE_DAMAGE_MAPPING[kind, MobType.PROJECTILE.value] * p.mask[:, None]
    is_arrow = (kind == ProjectileType.ARROW.value) | (kind == ProjectileType.ARROW2.value)
    bonus = jax.vmap(lambda d: put(put(jnp.zeros(3, dtype=jnp.float32), state.bow_enchantment,
                                       d[0] / 2), 0, 0))(damage)
    damage = damage + jnp.where(is_arrow[:, None], bonus, jnp.zeros(3, dtype=jnp.float32))
    arrow_coeff = 1 + 0.2 * (state.player_dexterity - 1)
    magic_coeff = 1 + 0.5 * (state.player_intelligence - 1)
    damage = damage * jnp.where(is_arrow, arrow_coeff, 1.0)[:, None]
    magic = (kind == ProjectileType.FIREBALL.value) | (kind == ProjectileType.ICEBALL.value)
    damage = damage * jnp.where(magic, magic_coeff, 1.0)[:, None]
    to = p.position + floor.arrow_dirs
    blocks = floor.blocks
    mask = list(p.mask)
    for i in range(len(mask)):
        block = blocks.at(to[i])
        wall = _solid(block) & ~(block == B.WATER.value)  # they fly over water
        state, struck_here = _attack(state, floor, p.position[i], damage[i])
        state, struck_there = _attack(state, floor, to[i], damage[i] * (1 - struck_here))
        flies = _in_bounds(to[i], blocks.base.shape) & ~wall & ~(struck_here | struck_there)
        mask[i] = flies & p.mask[i]
        floor.melee, floor.passive, floor.ranged, floor.mob_map, ach, killed = fence(
            (floor.melee, floor.passive, floor.ranged, floor.mob_map, state.achievements,
             state.monsters_killed))
        state = state.replace(achievements=ach, monsters_killed=killed)
    floor.arrows = p.replace(position=to, mask=jnp.stack(mask))
    return state


def _alive(mobs):
    """A kill clears every floor's mobs without health (`attack_mob_class`)."""
    return mobs.replace(mask=(mobs.health > 0) & mobs.mask)


def update_mobs(rng, state, params, static_params):
    """== `craftax.craftax.game_logic.update_mobs` (one env's state; vmap it)."""
    rng = fast_keys.wrap(rng)
    boss = state.player_level == static_params.num_levels - 1  # is_fighting_boss
    floor = _Floor(state)
    rng, _ = jax.random.split(rng)
    rng, state = _melee(rng, state, floor, boss, params, static_params)
    rng, _ = jax.random.split(rng)
    rng = _passive(rng, state, floor, params)
    rng, _ = jax.random.split(rng)
    _ranged(rng, state, floor, boss, params, static_params)
    state = _mob_shots(state, floor, static_params)
    if static_params.max_player_projectiles:
        # (the player's floor: in `_strike`, where a slot's death is counted as a kill)
        state = state.replace(melee_mobs=_alive(state.melee_mobs),
                              passive_mobs=_alive(state.passive_mobs),
                              ranged_mobs=_alive(state.ranged_mobs))
        state = _player_shots(state, floor)
    level = floor.level
    return once(state.replace(  # (the fields computed once on a CPU)
        map=put_floor(state.map, level, floor.blocks.array()),
        mob_map=put_floor(state.mob_map, level, floor.mob_map.array()),
        melee_mobs=_put_row(state.melee_mobs, level, floor.melee),
        passive_mobs=_put_row(state.passive_mobs, level, floor.passive),
        ranged_mobs=_put_row(state.ranged_mobs, level, floor.ranged),
        mob_projectiles=_put_row(state.mob_projectiles, level, floor.shots),
        mob_projectile_directions=put(state.mob_projectile_directions, level, floor.shot_dirs),
        player_projectiles=_put_row(state.player_projectiles, level, floor.arrows)))


def _spawn_one(key, mobs, can_map, can, health, type_id, shape):
    """One spawn on the player's floor: the first free slot gets a cell drawn uniformly from
    `can_map` [H, W] where `can`; the slot takes `type_id` whether or not. -> (mobs, cell,
    alive)."""
    can = can & (can_map.sum() > 0)
    cell = choice(key, jnp.arange(shape[0] * shape[1]),
                  jnp.reshape(can_map, -1) / jnp.sum(can_map), shape=(1,))
    cell = jnp.array([cell // shape[0], cell % shape[1]]).T.astype(jnp.int32)[0]
    can, cell, slot = once((can, cell, first_true(~mobs.mask)))  # (read by each field: once)
    position = jax.lax.select(can, cell, take(mobs.position, slot))
    alive = jax.lax.select(can, True, take(mobs.mask, slot))
    mobs = mobs.replace(
        position=put(mobs.position, slot, position),
        health=put(mobs.health, slot, jax.lax.select(can, health, take(mobs.health, slot))),
        mask=put(mobs.mask, slot, alive), type_id=put(mobs.type_id, slot, type_id))
    return mobs, position, alive


def spawn_mobs(state, rng, params, static_params):
    """== `craftax.craftax.game_logic.spawn_mobs` (one env's state; vmap it): a passive mob, a
    melee and a ranged one may appear on the player's floor, each on the mob map as the one
    before left it (on the boss's floor: monsters at its graves, in waves)."""
    rng = fast_keys.wrap(rng)
    shape = static_params.map_size
    level = state.player_level
    boss = level == static_params.num_levels - 1
    floor = state.map[level]
    mob_map = Grid(state.mob_map[level])
    distance = get_distance_map(state.player_position, shape)
    graves = ((floor == B.GRAVE.value) | (floor == B.GRAVE2.value)
              | (floor == B.GRAVE3.value))
    coeff = 1 + (take(state.monsters_killed, level) < MONSTERS_KILLED_TO_CLEAR_LEVEL) * 2
    wave = boss & (state.boss_timesteps_to_spawn_this_round >= 1)  # is_boss_spawn_wave
    coeff = coeff * jax.lax.select(boss, wave * 1000, 1)
    ground = ((floor == B.GRASS.value) | (floor == B.PATH.value)
              | (floor == B.FIRE_GRASS.value) | (floor == B.ICE_GRASS.value))
    near = distance < params.mob_despawn_distance
    chances = FLOOR_MOB_SPAWN_CHANCE[level]
    kinds = FLOOR_MOB_MAPPING[level]
    boss_kinds = FLOOR_MOB_MAPPING[state.boss_progress]

    passive = _row(state.passive_mobs, level)
    rng, chance_key = jax.random.split(rng)
    can = ((passive.mask.sum() < static_params.max_passive_mobs)
           & (jax.random.uniform(chance_key) < chances[0]) & ~boss)
    rng, key = jax.random.split(rng)
    kind = kinds[MobType.PASSIVE.value]
    can_map = ground & (distance > 3) & near & ~mob_map.dense()
    passive, at, alive = _spawn_one(key, passive, can_map, can,
                                    MOB_TYPE_HEALTH_MAPPING[kind, MobType.PASSIVE.value], kind,
                                    shape)
    mob_map = mob_map.set(at, mob_map.at(at) | alive)

    monster_range = jax.lax.select(boss, distance <= 6, distance > 9)
    melee = _row(state.melee_mobs, level)
    kind = jax.lax.select(boss, boss_kinds[MobType.MELEE.value], kinds[MobType.MELEE.value])
    rng, chance_key = jax.random.split(rng)
    chance = chances[1] + chances[3] * jnp.square(1 - state.light_level)
    can = ((melee.mask.sum() < static_params.max_melee_mobs)
           & (jax.random.uniform(chance_key) < chance * coeff))
    can_map = (jax.lax.select(boss, graves, ground) & monster_range & near
               & ~mob_map.dense())
    rng, key = jax.random.split(rng)
    melee, at, alive = _spawn_one(key, melee, can_map, can,
                                  MOB_TYPE_HEALTH_MAPPING[kind, MobType.MELEE.value], kind, shape)
    mob_map = mob_map.set(at, mob_map.at(at) | alive)

    ranged = _row(state.ranged_mobs, level)
    kind = jax.lax.select(boss, boss_kinds[MobType.RANGED.value], kinds[MobType.RANGED.value])
    rng, chance_key = jax.random.split(rng)
    can = ((ranged.mask.sum() < static_params.max_ranged_mobs)
           & (jax.random.uniform(chance_key) < chances[2] * coeff))
    where = jax.lax.select(kind == 5, floor == B.WATER.value, ground)  # the deep thing: water
    can_map = (jax.lax.select(boss, graves, where) & monster_range & near & ~mob_map.dense())
    rng, key = jax.random.split(rng)
    ranged, at, alive = _spawn_one(key, ranged, can_map, can,
                                   MOB_TYPE_HEALTH_MAPPING[kind, MobType.RANGED.value], kind,
                                   shape)
    mob_map = mob_map.set(at, mob_map.at(at) | alive)
    return once(state.replace(  # (the fields computed once on a CPU)
        mob_map=put_floor(state.mob_map, level, mob_map.array()),
        passive_mobs=_put_row(state.passive_mobs, level, passive),
        melee_mobs=_put_row(state.melee_mobs, level, melee),
        ranged_mobs=_put_row(state.ranged_mobs, level, ranged)))
