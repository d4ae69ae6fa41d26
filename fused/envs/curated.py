"""Hand-made Craftax states: a real state edited so that the rare parts of the step run (night,
sleep, mobs next to the player, arrows in flight, tables and lava close by, the map's edge, a
plant about to ripen, low health, full inventories). For equality tests of a step:
`classic_edit(key, state)` (Craftax-Classic) and `full_edit` (the full game) edit one env's
state (vmap them); every edit is one a game could reach or close to it (a mob map that marks
the mobs placed), and each applies with some probability, so a batch mixes them."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from craftax.craftax.constants import DIRECTIONS as FULL_DIRECTIONS
from craftax.craftax.constants import BlockType as F
from craftax.craftax.craftax_state import EnvParams as FullParams
from craftax.craftax.game_logic import calculate_light_level as full_light
from craftax.craftax_classic.constants import BlockType
from craftax.craftax_classic.envs.craftax_state import EnvParams
from craftax.craftax_classic.game_logic import calculate_light_level

B = BlockType
NEAR_BLOCKS = jnp.array([B.GRASS.value, B.GRASS.value, B.SAND.value, B.PATH.value, B.TREE.value,
                         B.STONE.value, B.WATER.value, B.CRAFTING_TABLE.value, B.FURNACE.value,
                         B.LAVA.value, B.COAL.value, B.IRON.value, B.DIAMOND.value,
                         B.PLANT.value, B.RIPE_PLANT.value], dtype=jnp.int32)


def _mobs(key, mobs, player, spread: int, health_max: int, is_arrow: bool = False):
    k_pos, k_mask, k_health, k_cool = jax.random.split(key, 4)
    n = mobs.mask.shape[0]
    pos = player + jax.random.randint(k_pos, (n, 2), -spread, spread + 1)
    mask = jax.random.bernoulli(k_mask, 0.7, (n,))
    health = jax.random.randint(k_health, (n,), 0 if is_arrow else 1, health_max + 1)
    cooldown = jax.random.randint(k_cool, (n,), -1, 6)
    return mobs.replace(position=pos.astype(jnp.int32), mask=mask,
                        health=health.astype(mobs.health.dtype),
                        attack_cooldown=cooldown.astype(mobs.attack_cooldown.dtype))


def classic_edit(key, state):
    """One env's Classic state, edited at random (see the module's docstring)."""
    ks = iter(jax.random.split(key, 32))
    h, w = state.map.shape

    def maybe(p):
        return jax.random.bernoulli(next(ks), p)

    # The player: now and then on the map's edge (an index of -1 wraps in Craftax's reads).
    edge = jax.random.randint(next(ks), (2,), 0, 4)
    corner = jnp.stack([jnp.array([0, 1, h - 2, h - 1])[edge[0]],
                        jnp.array([0, 1, w - 2, w - 1])[edge[1]]]).astype(jnp.int32)
    on_edge = maybe(0.15)
    player = jnp.where(on_edge, corner, state.player_position)
    state = state.replace(player_position=player,
                          player_direction=jax.random.randint(next(ks), (), 1, 5).astype(
                              state.player_direction.dtype))
    # Blocks around the player (5 x 5), sometimes.
    offsets = jnp.stack(jnp.meshgrid(jnp.arange(-2, 3), jnp.arange(-2, 3)), -1).reshape(-1, 2)
    cells = player + offsets
    blocks = NEAR_BLOCKS[jax.random.randint(next(ks), (25,), 0, NEAR_BLOCKS.shape[0])]
    keep = (offsets == 0).all(-1) | ~maybe(0.5)  # the player's own cell stays
    blocks = jnp.where(keep, state.map[cells[:, 0], cells[:, 1]], blocks)
    state = state.replace(map=state.map.at[cells[:, 0], cells[:, 1]].set(blocks, mode="drop"))
    # Night and sleep.
    t = jnp.where(maybe(0.5), jax.random.randint(next(ks), (), 0, 10000), state.timestep)
    sleep = maybe(0.3)
    state = state.replace(timestep=t.astype(state.timestep.dtype),
                          light_level=calculate_light_level(t, EnvParams()).astype(jnp.float32),
                          is_sleeping=sleep | state.is_sleeping)
    # Intrinsics, their counters, the inventory.
    ints = jax.random.randint(next(ks), (4,), 0, 10)
    low = maybe(0.3)
    state = state.replace(
        player_health=jnp.where(low, jnp.minimum(ints[0], 2), ints[0]).astype(jnp.int32),
        player_food=ints[1].astype(jnp.int32), player_drink=ints[2].astype(jnp.int32),
        player_energy=ints[3].astype(jnp.int32),
        player_hunger=jax.random.uniform(next(ks), (), minval=0, maxval=26),
        player_thirst=jax.random.uniform(next(ks), (), minval=0, maxval=21),
        player_fatigue=jax.random.uniform(next(ks), (), minval=-11, maxval=31),
        player_recover=jax.random.uniform(next(ks), (), minval=-16, maxval=26))
    rich = maybe(0.4)
    state = state.replace(inventory=jax.tree.map(
        lambda x, k: jnp.where(rich, jax.random.randint(k, (), 0, 10), x).astype(x.dtype),
        state.inventory, _keys_like(next(ks), state.inventory)))
    # Mobs close by, arrows in flight (the mob map marks the live ones placed).
    mobs_near = maybe(0.6)
    zombies = _mobs(next(ks), state.zombies, player, 3, 5)
    cows = _mobs(next(ks), state.cows, player, 4, 3)
    skeletons = _mobs(next(ks), state.skeletons, player, 6, 3)
    arrows = _mobs(next(ks), state.arrows, player, 4, 1, is_arrow=True)
    directions = jnp.array([[0, -1], [0, 1], [-1, 0], [1, 0]], dtype=jnp.int32)[
        jax.random.randint(next(ks), (arrows.mask.shape[0],), 0, 4)]
    pick = lambda new, old: jax.tree.map(lambda a, b: jnp.where(mobs_near, a, b), new, old)
    state = state.replace(zombies=pick(zombies, state.zombies), cows=pick(cows, state.cows),
                          skeletons=pick(skeletons, state.skeletons),
                          arrows=pick(arrows, state.arrows),
                          arrow_directions=pick(directions, state.arrow_directions))
    mob_map = state.mob_map
    for mobs in (state.zombies, state.cows, state.skeletons):
        mob_map = mob_map.at[mobs.position[:, 0], mobs.position[:, 1]].max(mobs.mask,
                                                                           mode="drop")
    state = state.replace(mob_map=jnp.where(mobs_near, mob_map, state.mob_map))
    # Saplings near the player, some about to ripen.
    n = state.growing_plants_mask.shape[0]
    plants = maybe(0.4)
    pos = player + jax.random.randint(next(ks), (n, 2), -3, 4)
    age = jax.random.randint(next(ks), (n,), 590, 601)
    mask = jax.random.bernoulli(next(ks), 0.6, (n,))
    state = state.replace(
        growing_plants_positions=jnp.where(plants, pos, state.growing_plants_positions),
        growing_plants_age=jnp.where(plants, age, state.growing_plants_age),
        growing_plants_mask=jnp.where(plants, mask, state.growing_plants_mask))
    ach = jax.random.bernoulli(next(ks), 0.3, state.achievements.shape)
    return state.replace(achievements=jnp.where(maybe(0.3), ach, state.achievements))


def _keys_like(key, tree):
    leaves, treedef = jax.tree.flatten(tree)
    return treedef.unflatten(list(jax.random.split(key, len(leaves))))


# --- the full game (Craftax-Symbolic) -----------------------------------------------------------

def _full_blocks():
    return jnp.array([F.GRASS.value, F.GRASS.value, F.PATH.value, F.PATH.value, F.SAND.value,
                      F.WATER.value, F.LAVA.value, F.STONE.value, F.TREE.value,
                      F.CRAFTING_TABLE.value, F.FURNACE.value, F.WALL.value, F.DARKNESS.value,
                      F.FIRE_GRASS.value, F.ICE_GRASS.value, F.GRAVEL.value, F.CHEST.value,
                      F.ENCHANTMENT_TABLE_FIRE.value, F.ENCHANTMENT_TABLE_ICE.value,
                      F.NECROMANCER.value, F.COAL.value,
                      F.IRON.value, F.DIAMOND.value, F.SAPPHIRE.value, F.RUBY.value,
                      F.RIPE_PLANT.value, F.STALAGMITE.value, F.FOUNTAIN.value,
                      F.FIRE_TREE.value, F.ICE_SHRUB.value], dtype=jnp.int32)


def _floor_mobs(key, mobs, level, player, spread: int, health_max: float, types: int):
    """`mobs` with the player's floor's rows drawn near the player."""
    k_pos, k_mask, k_health, k_cool, k_type = jax.random.split(key, 5)
    n = mobs.mask.shape[1]
    pos = (player + jax.random.randint(k_pos, (n, 2), -spread, spread + 1)).astype(jnp.int32)
    row = dict(position=pos, mask=jax.random.bernoulli(k_mask, 0.7, (n,)),
               health=jax.random.uniform(k_health, (n,), minval=0.5, maxval=health_max),
               attack_cooldown=jax.random.randint(k_cool, (n,), -1, 6),
               type_id=jax.random.randint(k_type, (n,), 0, types))
    return mobs.replace(**{f: getattr(mobs, f).at[level].set(v.astype(getattr(mobs, f).dtype))
                           for f, v in row.items()})


def full_edit(key, state):
    """One env's full-game state, edited at random as `classic_edit` does, and more: the player
    on another floor (the boss's among them), every kind of mob and projectile of that floor
    next to the player, sleep and rest, armour, enchantments and attributes, the boss's waves and
    cleared floors."""
    ks = iter(jax.random.split(key, 112))
    levels, h, w = state.map.shape

    def maybe(p):
        return jax.random.bernoulli(next(ks), p)

    level = jnp.where(maybe(0.5), jax.random.randint(next(ks), (), 0, levels),
                      state.player_level).astype(jnp.int32)
    level = jnp.where(maybe(0.15), levels - 1, level).astype(jnp.int32)  # the boss's floor
    edge = jax.random.randint(next(ks), (2,), 0, 4)
    corner = jnp.stack([jnp.array([0, 1, h - 2, h - 1])[edge[0]],
                        jnp.array([0, 1, w - 2, w - 1])[edge[1]]]).astype(jnp.int32)
    inner = jax.random.randint(next(ks), (2,), 2, h - 2).astype(jnp.int32)
    player = jnp.where(maybe(0.15), corner,
                       jnp.where(level == state.player_level, state.player_position, inner))
    state = state.replace(player_level=level, player_position=player,
                          player_direction=jax.random.randint(next(ks), (), 1, 5).astype(
                              state.player_direction.dtype))
    # Blocks around the player (5 x 5), sometimes.
    offsets = jnp.stack(jnp.meshgrid(jnp.arange(-2, 3), jnp.arange(-2, 3)), -1).reshape(-1, 2)
    cells = player + offsets
    choices = _full_blocks()
    blocks = choices[jax.random.randint(next(ks), (25,), 0, choices.shape[0])]
    floor = state.map[level]
    keep = (offsets == 0).all(-1) | ~maybe(0.6)
    blocks = jnp.where(keep, floor[cells[:, 0], cells[:, 1]], blocks)
    floor = floor.at[cells[:, 0], cells[:, 1]].set(blocks, mode="drop")
    # Now and then a table beside the player, and a furnace (crafting).
    beside = jax.random.choice(next(ks), jnp.array([[-1, 0], [1, 0], [0, -1], [0, 1], [-1, -1],
                                                    [1, 1]], dtype=jnp.int32), (2,),
                               replace=False) + player
    table = maybe(0.3)
    furnace = table & maybe(0.5)
    for cell, block, placed in zip(beside, (F.CRAFTING_TABLE.value, F.FURNACE.value),
                                   (table, furnace)):
        floor = floor.at[cell[0], cell[1]].set(
            jnp.where(placed, block, floor[cell[0], cell[1]]), mode="drop")
    # On the boss's floor, often the necromancer ahead.
    ahead = player + FULL_DIRECTIONS[state.player_direction]
    necromancer = (level == levels - 1) & maybe(0.5)
    floor = floor.at[ahead[0], ahead[1]].set(
        jnp.where(necromancer, F.NECROMANCER.value, floor[ahead[0], ahead[1]]), mode="drop")
    state = state.replace(map=state.map.at[level].set(floor))
    # Night, sleep, rest, health, attributes, armour and enchantments.
    t = jnp.where(maybe(0.5), jax.random.randint(next(ks), (), 0, 10000), state.timestep)
    state = state.replace(
        timestep=t.astype(state.timestep.dtype),
        light_level=full_light(t, FullParams()).astype(jnp.float32),
        is_sleeping=maybe(0.3) | state.is_sleeping, is_resting=maybe(0.2) | state.is_resting,
        player_health=jnp.where(maybe(0.3), jax.random.uniform(next(ks), (), maxval=3.0),
                                jax.random.uniform(next(ks), (), maxval=9.0)),
        player_hunger=jax.random.uniform(next(ks), (), minval=0, maxval=26),
        player_thirst=jax.random.uniform(next(ks), (), minval=0, maxval=21),
        player_food=jax.random.randint(next(ks), (), 0, 10),
        player_drink=jax.random.randint(next(ks), (), 0, 10),
        player_mana=jax.random.randint(next(ks), (), 0, 12),
        learned_spells=jax.random.bernoulli(next(ks), 0.5, (2,)),
        player_dexterity=jax.random.randint(next(ks), (), 1, 6),
        player_intelligence=jax.random.randint(next(ks), (), 1, 6),
        player_strength=jax.random.randint(next(ks), (), 1, 6),
        bow_enchantment=jax.random.randint(next(ks), (), 0, 3),
        sword_enchantment=jax.random.randint(next(ks), (), 0, 3),
        armour_enchantments=jax.random.randint(next(ks), (4,), 0, 3),
        boss_progress=jax.random.randint(next(ks), (), 0, levels),
        boss_timesteps_to_spawn_this_round=jax.random.randint(next(ks), (), 0, 4),
        monsters_killed=jnp.where(maybe(0.5), jax.random.randint(next(ks), (levels,), 0, 11),
                                  state.monsters_killed),
        inventory=state.inventory.replace(armour=jax.random.randint(next(ks), (4,), 0, 3),
                                          pickaxe=jax.random.randint(next(ks), (), 0, 5),
                                          sword=jax.random.randint(next(ks), (), 0, 5)))
    # A rich inventory now and then (enough to craft anything; arrows and torches near 99).
    rich = maybe(0.5)
    inv = state.inventory
    goods = dict(wood=6, stone=6, coal=5, iron=5, diamond=5, sapphire=3, ruby=3, sapling=3)
    state = state.replace(inventory=inv.replace(
        **{k: jnp.where(rich, jax.random.randint(next(ks), (), 0, n), getattr(inv, k))
           for k, n in goods.items()},
        bow=jnp.where(rich, jax.random.randint(next(ks), (), 0, 2), inv.bow),
        books=jnp.where(rich, jax.random.randint(next(ks), (), 0, 3), inv.books),
        potions=jnp.where(rich, jax.random.randint(next(ks), (6,), 0, 3), inv.potions),
        arrows=jnp.where(rich, jax.random.randint(next(ks), (), 95, 100), inv.arrows),
        torches=jnp.where(rich, jax.random.randint(next(ks), (), 0, 100), inv.torches)))
    # Saplings around the player, some about to ripen.
    n = state.growing_plants_mask.shape[0]
    plants = maybe(0.4)
    state = state.replace(
        growing_plants_positions=jnp.where(
            plants, player + jax.random.randint(next(ks), (n, 2), -2, 3),
            state.growing_plants_positions),
        growing_plants_age=jnp.where(plants, jax.random.randint(next(ks), (n,), 590, 601),
                                     state.growing_plants_age),
        growing_plants_mask=jnp.where(plants, jax.random.bernoulli(next(ks), 0.6, (n,)),
                                      state.growing_plants_mask))
    # Mobs and projectiles of every kind on the floor, close by; the mob map marks the live ones.
    near = maybe(0.7)
    new = dict(melee_mobs=_floor_mobs(next(ks), state.melee_mobs, level, player, 3, 8.0, 8),
               passive_mobs=_floor_mobs(next(ks), state.passive_mobs, level, player, 4, 5.0, 3),
               ranged_mobs=_floor_mobs(next(ks), state.ranged_mobs, level, player, 6, 5.0, 8),
               mob_projectiles=_floor_mobs(next(ks), state.mob_projectiles, level, player, 4,
                                           1.0, 8),
               player_projectiles=_floor_mobs(next(ks), state.player_projectiles, level, player,
                                              4, 1.0, 8))
    directions = jnp.array([[0, -1], [0, 1], [-1, 0], [1, 0]], dtype=jnp.int32)
    for name in ("mob_projectile_directions", "player_projectile_directions"):
        d = directions[jax.random.randint(next(ks), (state.mob_projectiles.mask.shape[1],), 0, 4)]
        new[name] = getattr(state, name).at[level].set(d)
    state = state.replace(**jax.tree.map(lambda a, b: jnp.where(near, a, b), new,
                                         {k: getattr(state, k) for k in new}))
    # The necromancer ahead, now and then open to a blow: no monsters, no wave coming.
    open_ = necromancer & maybe(0.5)
    state = state.replace(
        melee_mobs=state.melee_mobs.replace(mask=state.melee_mobs.mask.at[level].set(
            state.melee_mobs.mask[level] & ~open_)),
        ranged_mobs=state.ranged_mobs.replace(mask=state.ranged_mobs.mask.at[level].set(
            state.ranged_mobs.mask[level] & ~open_)),
        boss_timesteps_to_spawn_this_round=jnp.where(
            open_, 0, state.boss_timesteps_to_spawn_this_round))
    # Now and then a mob left without health on some floor (a kill anywhere clears them all).
    floor_, slot = jax.random.randint(next(ks), (2,), 0, jnp.array([levels, 2]))
    state = state.replace(melee_mobs=state.melee_mobs.replace(health=jnp.where(
        maybe(0.1), state.melee_mobs.health.at[floor_, slot].set(0.0), state.melee_mobs.health)))
    mob_map = state.mob_map[level]
    for mobs in (state.melee_mobs, state.passive_mobs, state.ranged_mobs):
        p = mobs.position[level]
        mob_map = mob_map.at[p[:, 0], p[:, 1]].max(mobs.mask[level], mode="drop")
    return state.replace(mob_map=state.mob_map.at[level].set(mob_map),
                         achievements=jnp.where(maybe(0.3), jax.random.bernoulli(
                             next(ks), 0.3, state.achievements.shape), state.achievements))
