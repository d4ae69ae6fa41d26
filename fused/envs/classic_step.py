"""Craftax-Classic's whole step and symbolic observation, bit for bit craftax 1.6.1's
(`craftax_step`, `render_craftax_symbolic`), written for the compiler (`fused.envs.classic`,
`fused.envs.classic_mobs`); one env's state in, one out (vmap it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from craftax.craftax_classic.constants import MAX_OBS_DIM, OBS_DIM, Action, BlockType
from craftax.craftax_classic.game_logic import (
    calculate_light_level, cap_inventory, update_player_intrinsics)

from fused.envs import keys
from fused.envs.classic import craft, do, move, place
from fused.envs.classic_mobs import spawn_mobs, update_mobs
from fused.envs.grid import Grid, fence, once, wrap

B = BlockType


def grow_plants(state, blocks: Grid):
    """`update_plants`: every live sapling ages; at 600 it ripens."""
    age = (state.growing_plants_age + 1) * state.growing_plants_mask
    for k in range(age.shape[0]):
        blocks = blocks.set(state.growing_plants_positions[k], B.RIPE_PLANT.value, age[k] >= 600)
    return state.replace(growing_plants_age=age), blocks


def craftax_step(rng, state, action, params, static_params):
    """== `craftax.craftax_classic.game_logic.craftax_step`: -> (state, reward, in_lava)."""
    init_achievements = state.achievements
    init_health = state.player_health
    action = jax.lax.select(state.is_sleeping, Action.NOOP.value, action)
    rng = keys.wrap(rng)  # the same draws, the hash unrolled
    blocks, mob_map = Grid(state.map), Grid(state.mob_map)
    state = once(craft(state, action, blocks))
    rng, key = jax.random.split(rng)
    state, blocks, mob_map = fence(do(key, state, action, blocks, mob_map))
    state, blocks = place(state, action, blocks, mob_map)
    state = move(state, action, blocks, mob_map)
    state, blocks = fence((state, blocks))
    rng, key = jax.random.split(rng)
    state, blocks, mob_map = fence(update_mobs(key, state, blocks, mob_map, params,
                                               static_params))
    rng, key = jax.random.split(rng)
    state, blocks, mob_map = fence(spawn_mobs(state, key, blocks, mob_map, params,
                                              static_params))
    state, blocks = once(grow_plants(state, blocks))
    state = update_player_intrinsics(state, action)
    state = cap_inventory(state)
    in_lava = blocks.at(state.player_position) == B.LAVA.value
    health = jnp.maximum(0, jax.lax.select(in_lava, 0, state.player_health))
    state = state.replace(map=blocks.array(), mob_map=mob_map.array(), player_health=health)

    achievement_reward = (state.achievements.astype(jnp.float32).sum()
                          - init_achievements.astype(jnp.float32).sum())
    reward = achievement_reward + (state.player_health - init_health) * 0.1
    rng, key = jax.random.split(rng)
    state = state.replace(timestep=state.timestep + 1,
                          light_level=calculate_light_level(state.timestep + 1, params),
                          state_rng=keys.unwrap(key))
    # The new state's small fields computed once, not again inside each observation element.
    return fence((state, reward, in_lava))


def observe(state) -> jax.Array:
    """== `render_craftax_symbolic`: the 7 x 9 view one-hot (blocks, then a channel per mob kind),
    the inventory, intrinsics, direction, light and sleep: [1345] float32."""
    padded = jnp.pad(state.map, (MAX_OBS_DIM + 2, MAX_OBS_DIM + 2),
                     constant_values=B.OUT_OF_BOUNDS.value)
    corner = state.player_position - jnp.array(OBS_DIM, dtype=jnp.int32) // 2 + MAX_OBS_DIM + 2
    view = jax.nn.one_hot(jax.lax.dynamic_slice(padded, corner, OBS_DIM), num_classes=len(B))
    # Each kind's slots write their cell in slot order, off-screen slots a 0 (where a wrapped
    # index lands: -1 is the last row), as Craftax's scatters do.
    rows = jax.lax.broadcasted_iota(jnp.int32, OBS_DIM, 0)
    cols = jax.lax.broadcasted_iota(jnp.int32, OBS_DIM, 1)
    half = jnp.array(OBS_DIM) // 2
    channels = []
    for mobs in (state.zombies, state.cows, state.skeletons, state.arrows):
        channel = jnp.zeros(OBS_DIM, dtype=jnp.uint8)
        for k in range(mobs.mask.shape[0]):
            local = mobs.position[k] - state.player_position + half
            on_screen = ((local >= 0) & (local < jnp.array(OBS_DIM))).all() * mobs.mask[k]
            r, c = wrap(local[0], OBS_DIM[0]), wrap(local[1], OBS_DIM[1])
            inside = (r >= 0) & (r < OBS_DIM[0]) & (c >= 0) & (c < OBS_DIM[1])
            channel = jnp.where(inside & (rows == r) & (cols == c),
                                on_screen.astype(jnp.uint8), channel)
        channels.append(channel)
    all_map = jnp.concatenate([view, jnp.stack(channels, -1)], axis=-1)
    inv = state.inventory
    inventory = jnp.array([inv.wood, inv.stone, inv.coal, inv.iron, inv.diamond, inv.sapling,
                           inv.wood_pickaxe, inv.stone_pickaxe, inv.iron_pickaxe,
                           inv.wood_sword, inv.stone_sword, inv.iron_sword]
                          ).astype(jnp.float16) / 10.0
    intrinsics = jnp.array([state.player_health, state.player_food, state.player_drink,
                            state.player_energy]).astype(jnp.float16) / 10.0
    direction = jax.nn.one_hot(state.player_direction - 1, num_classes=4)
    return jnp.concatenate([all_map.flatten(), inventory, intrinsics, direction,
                            jnp.array([state.light_level, state.is_sleeping])])
