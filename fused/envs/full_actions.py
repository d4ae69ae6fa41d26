"""The full game's DO and crafting, bit for bit `do_action` and `do_crafting` of craftax 1.6.1
(`craftax.craftax.game_logic`). DO: strike the mob ahead (eating a passive one killed), else
mine, drink, eat, open a chest or hurt the necromancer at the block ahead. Crafting: the recipe
the action names, near a table (and a furnace), the cells around read once, not in a loop per
kind of block.

Craftax writes the block ahead once per kind of block (fourteen scatters into the floor's map),
finds a mob to strike with a `lax.scan` per kind and a plant with another, draws a chest's loot
with `jax.random.choice`'s loops, and chooses the whole state (every floor's maps) between DO and
not. Here the block ahead is read once and written once (`Grid`), the slots compared at once,
the loot drawn with the same bits without loops (`fused.envs.draws`), and only what DO changes
is chosen. Every quirk is kept: a block ahead off the map (an index of -1 reads the last row)
mines nothing but still opens a chest's record and hurts the necromancer, a strike is checked
before the block."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from craftax.craftax.constants import (
    BOSS_FIGHT_SPAWN_TURNS, CAN_PLACE_ITEM_MAPPING, CLOSE_BLOCKS, DIRECTIONS, SOLID_BLOCK_MAPPING,
    TORCH_LIGHT_MAP, Achievement, Action, BlockType, ItemType, ProjectileType)
from craftax.craftax.util.game_logic_utils import (
    get_max_drink, get_max_food, get_player_damage_vector)

from fused.envs import keys as fast_keys
from fused.envs.draws import choice
from fused.envs.full_mobs import (
    _alive, _attack, _Floor, _in_bounds, _put_row, _row, put_floor)
from fused.envs.grid import Grid, first_true, once, put, spawn_into, take

A = Action
B = BlockType
ACH = Achievement


def _gain(achievements, which: Achievement, cond):
    return achievements | ((jnp.arange(achievements.shape[0]) == which.value) & cond)


def _chest_loot(rng, state, inventory, opening):
    """`add_items_from_chest`: the same draws in the same order."""
    rng, key = jax.random.split(rng)
    torch = jax.random.uniform(key) < 0.6
    rng, key = jax.random.split(rng)
    torches = jax.random.randint(key, shape=(), minval=4, maxval=8) * torch
    rng, key = jax.random.split(rng)
    ore = jax.random.uniform(key) < 0.6
    rng, key = jax.random.split(rng)
    ore_id = choice(key, jnp.arange(5, dtype=jnp.int32),
                    jnp.array([0.3, 0.3, 0.15, 0.125, 0.125]), shape=())
    rng, key = jax.random.split(rng)  # one key: the ores exclude each other
    ores = [jax.random.randint(key, shape=(), minval=1, maxval=top) * (ore_id == i) * ore
            for i, top in enumerate((4, 3, 2, 2, 2))]
    rng, key = jax.random.split(rng)
    potion = jax.random.uniform(key) < 0.5
    rng, key = jax.random.split(rng)
    potion_index = jax.random.randint(key, shape=(), minval=0, maxval=6)
    rng, key = jax.random.split(rng)
    potions = jax.random.randint(key, shape=(), minval=1, maxval=3)
    rng, key = jax.random.split(rng)
    arrow = jax.random.uniform(key) < 0.25
    rng, key = jax.random.split(rng)
    arrows = jax.random.randint(key, shape=(), minval=1, maxval=5) * arrow
    rng, key = jax.random.split(rng)
    tool = jax.random.uniform(key) < 0.2
    rng, key = jax.random.split(rng)
    tool_id = jax.random.randint(key, shape=(), minval=0, maxval=2)
    levels = (jnp.arange(4) + 1).astype(int)
    odds = jnp.array([0.4, 0.3, 0.2, 0.1])

    def upgrade(key, looting, current):
        level = jnp.maximum(choice(key, levels, odds, shape=()) * looting, current)
        return looting * level + (1 - looting) * current

    pickaxe = tool & (tool_id == 0) & opening
    rng, key = jax.random.split(rng)
    new_pickaxe = upgrade(key, pickaxe, inventory.pickaxe)
    sword = tool & (tool_id == 1) & opening
    rng, key = jax.random.split(rng)
    new_sword = upgrade(key, sword, inventory.sword)
    first = ~take(state.chests_opened, state.player_level)
    bow = opening & (state.player_level == 1) & first
    book = first & ((state.player_level == 3) | (state.player_level == 4))
    coal, iron, diamond, sapphire, ruby = ores
    return inventory.replace(
        torches=inventory.torches + torches * opening,
        coal=inventory.coal + coal * opening, iron=inventory.iron + iron * opening,
        diamond=inventory.diamond + diamond * opening,
        sapphire=inventory.sapphire + sapphire * opening, ruby=inventory.ruby + ruby * opening,
        arrows=inventory.arrows + arrows * opening, pickaxe=new_pickaxe, sword=new_sword,
        potions=put(inventory.potions, potion_index,
                    take(inventory.potions, potion_index) + potions * potion * opening),
        bow=bow * 1 + (1 - bow) * inventory.bow,
        books=inventory.books + 1 * book * opening)


def do_action(rng, state, action, static_params):
    """== `craftax.craftax.game_logic.do_action` (one env's state; vmap it)."""
    old = state
    rng = fast_keys.wrap(rng)
    level = state.player_level
    ahead = state.player_position + DIRECTIONS[state.player_direction]
    floor = _Floor(state)
    state = state.replace(melee_mobs=_alive(state.melee_mobs),
                          passive_mobs=_alive(state.passive_mobs),
                          ranged_mobs=_alive(state.ranged_mobs))
    state, struck = _attack(state, floor, ahead, get_player_damage_vector(old), can_eat=True)

    b = floor.blocks.at(ahead)
    inv, pick = state.inventory, state.inventory.pickaxe
    tree, fire_tree, ice_shrub = b == B.TREE.value, b == B.FIRE_TREE.value, b == B.ICE_SHRUB.value
    trees = tree | fire_tree | ice_shrub
    regrow = (tree * B.GRASS.value + fire_tree * B.FIRE_GRASS.value
              + ice_shrub * B.ICE_GRASS.value)
    mined = {k: (b == block.value) & (pick >= tier) for k, block, tier in (
        ("stone", B.STONE, 1), ("coal", B.COAL, 1), ("iron", B.IRON, 2),
        ("diamond", B.DIAMOND, 3), ("sapphire", B.SAPPHIRE, 4), ("ruby", B.RUBY, 4),
        ("stalagmite", B.STALAGMITE, 1))}
    furnace, table = b == B.FURNACE.value, b == B.CRAFTING_TABLE.value
    ripe, chest = b == B.RIPE_PLANT.value, b == B.CHEST.value
    # The block ahead after each kind's write, in Craftax's order.
    cell = jax.lax.select(trees, regrow, b)
    for to_path in (mined["stone"], furnace, table, mined["coal"], mined["iron"],
                    mined["diamond"], mined["sapphire"], mined["ruby"]):
        cell = jax.lax.select(to_path, B.PATH.value, cell)
    cell = jax.lax.select(ripe, B.PLANT.value, cell)
    cell = jax.lax.select(mined["stalagmite"], B.PATH.value, cell)
    cell = jax.lax.select(chest, B.PATH.value, cell)

    rng, key = jax.random.split(rng)
    sapling = (b == B.GRASS.value) & (jax.random.uniform(key) < 0.1)
    new_inv = inv.replace(
        wood=inv.wood + 1 * trees, coal=inv.coal + 1 * mined["coal"],
        iron=inv.iron + 1 * mined["iron"], diamond=inv.diamond + 1 * mined["diamond"],
        sapphire=inv.sapphire + 1 * mined["sapphire"], ruby=inv.ruby + 1 * mined["ruby"],
        sapling=inv.sapling + 1 * sapling,
        stone=inv.stone + 1 * mined["stone"] + 1 * mined["stalagmite"])
    rng, key = jax.random.split(rng)
    new_inv = _chest_loot(key, state, new_inv, chest)

    drinking = (b == B.WATER.value) | (b == B.FOUNTAIN.value)
    drink = jax.lax.select(drinking, jnp.minimum(get_max_drink(state), state.player_drink + 1),
                           state.player_drink)
    thirst = jax.lax.select(drinking, 0.0, state.player_thirst)
    food = jax.lax.select(ripe, jnp.minimum(get_max_food(state), state.player_food + 4),
                          state.player_food)
    hunger = jax.lax.select(ripe, 0.0, state.player_hunger)
    plant = first_true((state.growing_plants_positions == ahead).all(-1))
    ages = put(state.growing_plants_age, plant, 0)

    fighting = level == static_params.num_levels - 1
    vulnerable = ((floor.melee.mask.sum() == 0) & (floor.ranged.mask.sum() == 0)
                  & (state.boss_timesteps_to_spawn_this_round <= 0))
    damaging = (b == B.NECROMANCER.value) & vulnerable & fighting
    ach = state.achievements
    new_ach = _gain(ach, ACH.COLLECT_DRINK, drinking)
    new_ach = _gain(new_ach, ACH.EAT_PLANT, ripe)
    new_ach = _gain(new_ach, ACH.OPEN_CHEST, chest)
    new_ach = _gain(new_ach, ACH.DAMAGE_NECROMANCER, damaging)

    ok = _in_bounds(ahead, floor.blocks.base.shape) & ~struck
    do = action == Action.DO.value
    blocks = floor.blocks.set(ahead, cell, ok & do)

    return once(old.replace(  # (the fields computed once on a CPU)
        map=put_floor(old.map, level, blocks.array()),
        inventory=jax.tree.map(lambda n, c, o: jax.lax.select(do, jax.lax.select(ok, n, c), o),
                               new_inv, inv, old.inventory),
        player_drink=jax.lax.select(do, jax.lax.select(ok, drink, state.player_drink),
                                    old.player_drink),
        player_thirst=jax.lax.select(do, jax.lax.select(ok, thirst, state.player_thirst),
                                     old.player_thirst),
        player_food=jax.lax.select(do, jax.lax.select(ok, food, state.player_food),
                                   old.player_food),
        player_hunger=jax.lax.select(do, jax.lax.select(ok, hunger, state.player_hunger),
                                     old.player_hunger),
        growing_plants_age=jax.lax.select(do & ok & ripe, ages, old.growing_plants_age),
        achievements=jax.lax.select(do, jax.lax.select(ok, new_ach, ach), old.achievements),
        chests_opened=jnp.where(do, put(old.chests_opened, level,
                                        take(old.chests_opened, level) | chest),
                                old.chests_opened),
        boss_progress=jax.lax.select(do, old.boss_progress + 1 * damaging, old.boss_progress),
        boss_timesteps_to_spawn_this_round=jax.lax.select(
            do, BOSS_FIGHT_SPAWN_TURNS * damaging
            + old.boss_timesteps_to_spawn_this_round * (1 - damaging),
            old.boss_timesteps_to_spawn_this_round),
        mob_map=put_floor(old.mob_map, level,
                          jnp.where(do, floor.mob_map.array(), old.mob_map[level])),
        monsters_killed=jnp.where(do, state.monsters_killed, old.monsters_killed),
        **{kind: jax.tree.map(lambda n, o: jnp.where(do, n, o), _put_row(
            getattr(state, kind), level, getattr(floor, attr)), getattr(old, kind))
           for kind, attr in (("melee_mobs", "melee"), ("passive_mobs", "passive"),
                              ("ranged_mobs", "ranged"))}))


def _near(state, blocks) -> dict:
    """`is_near_block` for each of `blocks`: one of the 8 cells around the player, in the map,
    holds it (the cells read once for all)."""
    floor = state.map[state.player_level]
    h, w = floor.shape
    near = {b: jnp.bool_(False) for b in blocks}
    for offset in CLOSE_BLOCKS.tolist():
        pos = state.player_position + jnp.array(offset, dtype=jnp.int32)
        inside = (0 <= pos[0]) & (pos[0] < h) & (0 <= pos[1]) & (pos[1] < w)
        cell = floor[pos[0], pos[1]]
        for b in blocks:
            near[b] = near[b] | (inside & (cell == b))
    return near


def do_crafting(state, action):
    """== `craftax.craftax.game_logic.do_crafting`: the recipe the action names, if the
    inventory holds its cost and a table (and a furnace) is among the 8 cells around."""
    near = _near(state, (B.CRAFTING_TABLE.value, B.FURNACE.value))
    table, furnace = once((near[B.CRAFTING_TABLE.value], near[B.FURNACE.value]))
    inv, ach = state.inventory, state.achievements

    def making(which: Action, can, *needs):
        ok = (action == which.value) & can
        for need in needs:
            ok = ok & need
        return ok

    # Tools: (action, tier, the cost by field) for pickaxes, then swords, in Craftax's order.
    for field, recipes in (
            ("pickaxe", ((A.MAKE_WOOD_PICKAXE, 1, dict(wood=1), False),
                         (A.MAKE_STONE_PICKAXE, 2, dict(stone=1, wood=1), False),
                         (A.MAKE_IRON_PICKAXE, 3, dict(iron=1, wood=1, stone=1, coal=1), True),
                         (A.MAKE_DIAMOND_PICKAXE, 4, dict(diamond=3, wood=1), False))),
            ("sword", ((A.MAKE_WOOD_SWORD, 1, dict(wood=1), False),
                       (A.MAKE_STONE_SWORD, 2, dict(wood=1, stone=1), False),
                       (A.MAKE_IRON_SWORD, 3, dict(wood=1, iron=1, stone=1, coal=1), True),
                       (A.MAKE_DIAMOND_SWORD, 4, dict(wood=1, diamond=2), False)))):
        for which, tier, cost, at_furnace in recipes:
            can = (getattr(inv, field) < tier) & table & (furnace if at_furnace else True)
            ok = making(which, can, *(getattr(inv, k) >= n for k, n in cost.items()))
            inv = inv.replace(**{k: getattr(inv, k) - n * ok for k, n in cost.items()},
                              **{field: getattr(inv, field) * (1 - ok) + tier * ok})
            inv = once(inv)  # (the next recipe reads every field: each computed once)
    # Armour: the first piece below the tier, if any.
    for which, tier, cost, at_furnace, made in (
            (A.MAKE_IRON_ARMOUR, 1, dict(iron=3, coal=3), True, ACH.MAKE_IRON_ARMOUR),
            (A.MAKE_DIAMOND_ARMOUR, 2, dict(diamond=3), False, ACH.MAKE_DIAMOND_ARMOUR)):
        below = inv.armour < tier
        piece = first_true(below)
        can = (below.sum() > 0) & table & (furnace if at_furnace else True)
        ok = making(which, can, *(getattr(inv, k) >= n for k, n in cost.items()))
        inv = inv.replace(**{k: getattr(inv, k) - n * ok for k, n in cost.items()},
                          armour=put(inv.armour, piece,
                                     ok * tier + (1 - ok) * take(inv.armour, piece)))
        ach = _gain(ach, made, ok)
        inv = once(inv)
    # Arrows and torches, up to 99.
    ok = making(A.MAKE_ARROW, table & (inv.arrows < 99), inv.stone >= 1, inv.wood >= 1)
    inv = inv.replace(wood=inv.wood - 1 * ok, stone=inv.stone - 1 * ok,
                      arrows=inv.arrows + 2 * ok)
    ok = making(A.MAKE_TORCH, table & (inv.torches < 99), inv.coal >= 1, inv.wood >= 1)
    inv = inv.replace(wood=inv.wood - 1 * ok, coal=inv.coal - 1 * ok,
                      torches=inv.torches + 4 * ok)
    return once(state.replace(inventory=inv, achievements=ach))  # (computed once on a CPU)


def place_block(state, action, static_params):
    """== `craftax.craftax.game_logic.place_block`: a table, furnace, stone, torch or sapling
    put on the cell ahead, if it takes one and the inventory has it. The cell is read once and
    written once; a torch lights its 9 x 9 window of the light map: on a CPU as Craftax does (a
    pad, a slice and an update of the slice), elsewhere by selects over the floor."""
    level = state.player_level
    ahead = state.player_position + DIRECTIONS[state.player_direction]
    blocks, items = Grid(state.map[level]), Grid(state.item_map[level])
    b, item = blocks.at(ahead), items.at(ahead)
    inv, ach = state.inventory, state.achievements
    taken = SOLID_BLOCK_MAPPING[b] | (item != ItemType.NONE.value)
    table = (action == A.PLACE_TABLE.value) & ~taken & (inv.wood >= 2)
    furnace = (action == A.PLACE_FURNACE.value) & ~taken & (inv.stone > 0)
    stone = ((action == A.PLACE_STONE.value) & ((b == B.WATER.value) | ~taken)
             & (inv.stone - 1 * furnace > 0))
    torch = ((action == A.PLACE_TORCH.value) & CAN_PLACE_ITEM_MAPPING[b]
             & (item == ItemType.NONE.value) & (inv.torches > 0))
    cell = jax.lax.select(table, B.CRAFTING_TABLE.value, b)
    cell = jax.lax.select(furnace, B.FURNACE.value, cell)
    cell = jax.lax.select(stone, B.STONE.value, cell)
    sapling = ((action == A.PLACE_PLANT.value) & (cell == B.GRASS.value) & (inv.sapling > 0)
               & (jax.lax.select(torch, ItemType.TORCH.value, item) == ItemType.NONE.value))
    cell = jax.lax.select(sapling, B.PLANT.value, cell)
    new_inv = inv.replace(wood=inv.wood - 2 * table, stone=inv.stone - 1 * furnace - 1 * stone,
                          torches=inv.torches - 1 * torch, sapling=inv.sapling - 1 * sapling)
    new_ach = _gain(ach, ACH.PLACE_TABLE, table)
    new_ach = _gain(new_ach, ACH.PLACE_FURNACE, furnace)
    new_ach = _gain(new_ach, ACH.PLACE_STONE, stone)
    new_ach = _gain(new_ach, ACH.PLACE_TORCH, torch)
    new_ach = _gain(new_ach, ACH.PLACE_PLANT, sapling)
    # The torch's light: Craftax's 9 x 9 window of the floor padded by 6, its start clamped.
    light = state.light_map[level]
    h, w = light.shape

    def window_update(light, torch):  # (a CPU: Craftax's pad, slice, update of the slice)
        padded = jnp.pad(light, (6, 6), constant_values=0)
        corner = ahead - jnp.array([4, 4]) + jnp.array([6, 6])
        now = jax.lax.dynamic_slice(padded, corner, (9, 9))
        lit = jnp.clip(TORCH_LIGHT_MAP + now, 0.0, 1.0)
        padded = jax.lax.dynamic_update_slice(padded, lit * torch + now * (1 - torch), corner)
        return padded[6:-6, 6:-6]

    def window_select(light, torch):  # (a GPU: a select over the floor, no pad or update)
        start = jnp.clip(ahead - 4 + 6, 0, jnp.array([h + 12 - 9, w + 12 - 9])) - 6
        i = jax.lax.broadcasted_iota(jnp.int32, (h, w), 0) - start[0]
        j = jax.lax.broadcasted_iota(jnp.int32, (h, w), 1) - start[1]
        window = (i >= 0) & (i < 9) & (j >= 0) & (j < 9)
        lit = jnp.clip(TORCH_LIGHT_MAP[jnp.clip(i, 0, 8), jnp.clip(j, 0, 8)] + light, 0.0, 1.0)
        return jnp.where(window, lit * torch + light * (1 - torch), light)

    new_light = jax.lax.platform_dependent(light, torch, cpu=window_update,
                                           default=window_select)
    # A sapling takes the first free plant slot, if there is one.
    free = ~state.growing_plants_mask
    slot = first_true(free)
    adding = (free.sum() > 0) & sapling
    plants = (jax.lax.select(adding, put(state.growing_plants_positions, slot, ahead),
                             state.growing_plants_positions),
              jax.lax.select(adding, put(state.growing_plants_age, slot, 0),
                             state.growing_plants_age),
              jax.lax.select(adding, put(state.growing_plants_mask, slot, True),
                             state.growing_plants_mask))

    ok = (_in_bounds(ahead, (h, w)) & ~state.mob_map[level][ahead[0], ahead[1]]
          & ~(state.player_position == ahead).all())
    positions, ages, mask = (jax.lax.select(ok, new, now) for new, now in zip(
        plants, (state.growing_plants_positions, state.growing_plants_age,
                 state.growing_plants_mask)))
    return state.replace(
        map=put_floor(state.map, level, blocks.set(ahead, cell, ok).array()),
        item_map=put_floor(state.item_map, level,
                           items.set(ahead, ItemType.TORCH.value, ok & torch).array()),
        light_map=put_floor(state.light_map, level, jnp.where(ok, new_light, light)),
        inventory=jax.tree.map(lambda n, o: jax.lax.select(ok, n, o), new_inv, inv),
        achievements=jax.lax.select(ok, new_ach, ach),
        growing_plants_positions=positions, growing_plants_age=ages,
        growing_plants_mask=mask)


def _spawn_player_projectile(state, spawning, direction, kind):
    """`spawn_projectile` into the player's projectiles on the player's floor: the first free
    slot (slot 0 if none) takes it where `spawning`."""
    level = state.player_level
    p, dirs = spawn_into(_row(state.player_projectiles, level),
                         state.player_projectile_directions[level], spawning, direction,
                         position=state.player_position, type_id=kind)
    return (_put_row(state.player_projectiles, level, p),
            put(state.player_projectile_directions, level, dirs))


def shoot_projectile(state, action, static_params):
    """== `shoot_projectile`: an arrow, if the player has a bow, an arrow and a free slot."""
    room = (state.player_projectiles.mask[state.player_level].sum()
            < static_params.max_player_projectiles)
    shooting = ((action == A.SHOOT_ARROW.value) & (state.inventory.bow >= 1)
                & (state.inventory.arrows >= 1) & room)
    projectiles, directions = _spawn_player_projectile(
        state, shooting, DIRECTIONS[state.player_direction], ProjectileType.ARROW2.value)
    return state.replace(
        player_projectiles=projectiles, player_projectile_directions=directions,
        inventory=state.inventory.replace(arrows=state.inventory.arrows - 1 * shooting),
        achievements=_gain(state.achievements, ACH.FIRE_BOW, shooting))


def cast_spell(state, action, static_params):
    """== `cast_spell`: a fireball or an iceball, if learned, for 2 mana."""
    able = (state.player_mana >= 2) & (state.player_projectiles.mask[state.player_level].sum()
                                       < static_params.max_player_projectiles)
    fire = (action == A.CAST_FIREBALL.value) & able & state.learned_spells[0]
    ice = (action == A.CAST_ICEBALL.value) & able & state.learned_spells[1]
    casting = fire | ice
    kind = fire * ProjectileType.FIREBALL.value + ice * ProjectileType.ICEBALL.value
    projectiles, directions = _spawn_player_projectile(
        state, casting, DIRECTIONS[state.player_direction], kind)
    which = fire * ACH.CAST_FIREBALL.value + ice * ACH.CAST_ICEBALL.value
    return state.replace(
        player_projectiles=projectiles, player_projectile_directions=directions,
        player_mana=state.player_mana - casting * 2,
        achievements=put(state.achievements, which, take(state.achievements, which) | casting))


def drink_potion(state, action):
    """== `drink_potion`: the potion the action names, if held; its effect by the world's
    potion mapping (health, mana or energy, up 8 or down 3)."""
    potions = state.inventory.potions
    index, drinking = -1, jnp.bool_(False)
    for k, which in enumerate((A.DRINK_POTION_RED, A.DRINK_POTION_GREEN, A.DRINK_POTION_BLUE,
                               A.DRINK_POTION_PINK, A.DRINK_POTION_CYAN,
                               A.DRINK_POTION_YELLOW)):
        this = (action == which.value) & (potions[k] > 0)
        index = this * k + (1 - this) * index
        drinking = drinking | this
    effect = take(state.potion_mapping, index)
    deltas = []
    for up, down in ((0, 1), (2, 3), (4, 5)):
        delta = 0
        delta += drinking * (effect == up) * 8
        delta += drinking * (effect == down) * (-3)
        deltas.append(delta)
    return state.replace(
        inventory=state.inventory.replace(
            potions=put(potions, index, take(potions, index) - 1 * drinking)),
        player_health=state.player_health + deltas[0],
        player_mana=state.player_mana + deltas[1],
        player_energy=state.player_energy + deltas[2],
        achievements=_gain(state.achievements, ACH.DRINK_POTION, drinking))


def read_book(rng, state, action):
    """== `read_book`: a book teaches a spell not yet learned, drawn."""
    rng = fast_keys.wrap(rng)
    reading = (action == A.READ_BOOK.value) & (state.inventory.books > 0)
    to_learn = jnp.logical_not(state.learned_spells).astype(float)
    to_learn /= to_learn.sum()
    rng, key = jax.random.split(rng)
    spell = choice(key, jnp.arange(2), to_learn, shape=())
    which = jax.lax.select(spell, ACH.LEARN_ICEBALL.value, ACH.LEARN_FIREBALL.value)
    return state.replace(
        inventory=state.inventory.replace(books=state.inventory.books - 1 * reading),
        learned_spells=put(state.learned_spells, spell,
                           take(state.learned_spells, spell) | reading),
        achievements=put(state.achievements, which, take(state.achievements, which) | reading))


def enchant(rng, state, action):
    """== `enchant`: at an enchantment table ahead, 9 mana and a gem of its element enchant the
    sword, the bow or a piece of armour (drawn among the unenchanted, else the other
    element's)."""
    rng = fast_keys.wrap(rng)
    ahead = state.player_position + DIRECTIONS[state.player_direction]
    block = state.map[state.player_level, ahead[0], ahead[1]]
    fire_table = block == B.ENCHANTMENT_TABLE_FIRE.value
    at_table = fire_table | (block == B.ENCHANTMENT_TABLE_ICE.value)
    element = jax.lax.select(fire_table, 1, 2)
    gems = jax.lax.select(fire_table, state.inventory.ruby, state.inventory.sapphire)
    could = (state.player_mana >= 9) & at_table & (gems >= 1)
    inv = state.inventory
    bow = could & (action == A.ENCHANT_BOW.value) & (inv.bow > 0)
    sword = could & (action == A.ENCHANT_SWORD.value) & (inv.sword > 0)
    armour = could & (action == A.ENCHANT_ARMOUR.value) & (inv.armour.sum() > 0)
    rng, key = jax.random.split(rng)
    bare = state.armour_enchantments == 0
    other = (state.armour_enchantments != 0) & (state.armour_enchantments != element)
    targets = bare + (bare.sum() == 0) * other
    target = choice(key, jnp.arange(4), targets.astype(jnp.float32), shape=())
    enchanting = sword | bow | armour
    pieces = state.armour_enchantments
    return state.replace(
        sword_enchantment=sword * element + (1 - sword) * state.sword_enchantment,
        bow_enchantment=bow * element + (1 - bow) * state.bow_enchantment,
        armour_enchantments=put(pieces, target,
                                armour * element + (1 - armour) * take(pieces, target)),
        inventory=inv.replace(sapphire=inv.sapphire - 1 * enchanting * (element == 2),
                              ruby=inv.ruby - 1 * enchanting * (element == 1)),
        player_mana=state.player_mana - 9 * enchanting,
        achievements=_gain(_gain(state.achievements, ACH.ENCHANT_SWORD, sword),
                           ACH.ENCHANT_ARMOUR, armour))
