"""The text observation format and the reference (host, plain Python) renderer.

One Craftax symbolic observation becomes two lines with a blank line between (BRIEF section 2):

    Map (interesting tiles only): -4, -5:tree, 0, 1:zombie on grass, ...
    Inventory: Wood:8, Stone:17, ..., Health:9.0, ..., Direction:left, Light:0.131, ...

`r, c` are the row (-4..4, negative = up) and column (-5..5, negative = left) relative to the
player at `0, 0`; rows are the outer loop. A tile is `[<mob> on ][<item> on ]<block>` with enum
names lower-cased (`_` kept, so every name is one word), or `darkness` where the tile is unlit.
Background blocks are dropped unless something stands on them; when nothing is left the line is
`Map: [No interesting tiles in view - all background]`.

Everything is read back from the observation vector alone (not the env state), so the same text
can be produced on the device (`fused.render`) and from stored datasets. `ObsLayout` says where
each piece sits in the vector for each supported env and how its value was scaled.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

BLOCKS_FULL = (
    "invalid", "out_of_bounds", "grass", "water", "stone", "tree", "wood", "path", "coal", "iron",
    "diamond", "crafting_table", "furnace", "sand", "lava", "plant", "ripe_plant", "wall",
    "darkness", "wall_moss", "stalagmite", "sapphire", "ruby", "chest", "fountain", "fire_grass",
    "ice_grass", "gravel", "fire_tree", "ice_shrub", "enchantment_table_fire",
    "enchantment_table_ice", "necromancer", "grave", "grave2", "grave3", "necromancer_vulnerable",
)
ITEMS_FULL = ("none", "torch", "ladder_down", "ladder_up", "ladder_down_blocked")
# 5 classes x 8 type ids (craftax renderer.py); None = a channel no mob uses.
MOBS_FULL = (
    "zombie", "gnome_warrior", "orc_soldier", "lizard", "knight", "troll", "pigman", "frost_troll",
    "cow", "bat", "snail", None, None, None, None, None,
    "skeleton", "gnome_archer", "orc_mage", "kobold", "archer", "deep_thing", "fire_elemental",
    "ice_elemental",
    "arrow", "dagger", "fireball", "iceball", "arrow", "slimeball", "fireball", "iceball",
    "player_arrow", "player_dagger", "player_fireball", "player_iceball", "player_arrow",
    "player_slimeball", "player_fireball", "player_iceball",
)
BLOCKS_CLASSIC = BLOCKS_FULL[:17]
MOBS_CLASSIC = ("zombie", "cow", "skeleton", "arrow")
BACKGROUND = ("grass", "sand", "gravel", "fire_grass", "ice_grass")
DIRECTIONS = ("left", "right", "up", "down")

ValueKind = Literal["sqrt_count", "count", "tenths", "thousandths", "bool", "direction"]


@dataclasses.dataclass(frozen=True)
class AuxField:
    """One `Label:value` of the inventory line. `index` is the position in the aux vector (after
    the map); `scale` undoes the env's scaling (value = obs * scale, or (obs * scale)^2 for
    sqrt_count); direction reads 4 one-hot entries starting at `index`."""

    label: str
    index: int
    kind: ValueKind
    scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class ObsLayout:
    rows: int
    cols: int
    blocks: tuple[str, ...]
    items: tuple[str, ...]  # empty: the env has no item channels
    mobs: tuple[str | None, ...]
    has_light: bool  # a light channel closes each cell's channels
    aux: tuple[AuxField, ...]
    aux_size: int

    @property
    def channels(self) -> int:
        return len(self.blocks) + len(self.items) + len(self.mobs) + int(self.has_light)

    @property
    def map_size(self) -> int:
        return self.rows * self.cols * self.channels

    @property
    def obs_dim(self) -> int:
        return self.map_size + self.aux_size


def _full_aux() -> tuple[AuxField, ...]:
    fields = [AuxField(n, i, "sqrt_count", 10.0) for i, n in enumerate(
        ("Wood", "Stone", "Coal", "Iron", "Diamond", "Sapphire", "Ruby", "Sapling", "Torch",
         "Arrow"))]
    fields += [AuxField("Book", 10, "count", 2.0), AuxField("Pickaxe", 11, "count", 4.0),
               AuxField("Sword", 12, "count", 4.0), AuxField("Sword Enchantment", 13, "count"),
               AuxField("Bow Enchantment", 14, "count"), AuxField("Bow", 15, "count")]
    fields += [AuxField(f"{c} Potion", 16 + i, "sqrt_count", 10.0)
               for i, c in enumerate(("Red", "Green", "Blue", "Pink", "Cyan", "Yellow"))]
    fields += [AuxField("Health", 22, "tenths", 10.0)]
    fields += [AuxField(n, 23 + i, "count", 10.0) for i, n in enumerate(
        ("Food", "Drink", "Energy", "Mana", "XP", "Dexterity", "Strength", "Intelligence"))]
    fields += [AuxField("Direction", 31, "direction")]
    fields += [AuxField(f"{p} Armour", 35 + i, "count", 2.0)
               for i, p in enumerate(("Helmet", "Chestplate", "Leggings", "Boots"))]
    fields += [AuxField(f"{p} Enchantment", 39 + i, "count")
               for i, p in enumerate(("Helmet", "Chestplate", "Leggings", "Boots"))]
    fields += [AuxField("Light", 43, "thousandths"), AuxField("Is Sleeping", 44, "bool"),
               AuxField("Is Resting", 45, "bool"), AuxField("Learned Fireball", 46, "bool"),
               AuxField("Learned Iceball", 47, "bool"), AuxField("Floor", 48, "count", 10.0),
               AuxField("Ladder Open", 49, "bool"), AuxField("Is Boss Vulnerable", 50, "bool")]
    return tuple(fields)


def _classic_aux() -> tuple[AuxField, ...]:
    names = ("Wood", "Stone", "Coal", "Iron", "Diamond", "Sapling", "Wood Pickaxe",
             "Stone Pickaxe", "Iron Pickaxe", "Wood Sword", "Stone Sword", "Iron Sword",
             "Health", "Food", "Drink", "Energy")
    fields = [AuxField(n, i, "count", 10.0) for i, n in enumerate(names)]
    return tuple(fields + [AuxField("Direction", 16, "direction"),
                           AuxField("Light", 20, "thousandths"),
                           AuxField("Is Sleeping", 21, "bool")])


LAYOUTS: dict[str, ObsLayout] = {
    "Craftax-Symbolic-v1": ObsLayout(9, 11, BLOCKS_FULL, ITEMS_FULL, MOBS_FULL, True,
                                     _full_aux(), 51),
    "Craftax-Classic-Symbolic-v1": ObsLayout(7, 9, BLOCKS_CLASSIC, (), MOBS_CLASSIC, False,
                                             _classic_aux(), 22),
}
MAP_HEADER = "Map (interesting tiles only):"
MAP_EMPTY = "Map: [No interesting tiles in view - all background]"
MAX_VALUE = 999  # counts above this (never reached in Craftax) would not render on the device


def get_layout(env_name: str) -> ObsLayout:
    if env_name not in LAYOUTS:
        raise ValueError(f"no text format for env {env_name!r}; supported: {', '.join(LAYOUTS)}")
    return LAYOUTS[env_name]


# --- value decoding: float32 arithmetic, mirrored exactly by fused.render on the device ---------

def decode_value(x: np.float32, f: AuxField) -> int:
    """The integer a value is rendered from (tenths / thousandths for those kinds)."""
    x = np.float32(x)
    if f.kind == "sqrt_count":
        y = x * np.float32(f.scale)
        return int(np.rint(y * y))
    if f.kind == "count":
        return int(np.rint(x * np.float32(f.scale)))
    if f.kind == "tenths":
        return int(np.rint(x * np.float32(f.scale * 10)))
    if f.kind == "thousandths":
        return int(np.rint(x * np.float32(1000)))
    if f.kind == "bool":
        return int(x > 0.5)
    raise ValueError(f.kind)


def format_value(v: int, kind: ValueKind) -> str:
    if kind in ("sqrt_count", "count"):
        return str(v)
    if kind == "tenths":
        return f"{v // 10}.{v % 10}"
    if kind == "thousandths":
        return f"{v // 1000}.{v % 1000:03d}"
    if kind == "bool":
        return "True" if v else "False"
    if kind == "direction":
        return DIRECTIONS[v]
    raise ValueError(kind)


# --- reference renderer ---------------------------------------------------------------------

def tile_text(layout: ObsLayout, cell: np.ndarray) -> str | None:
    """Text of one map cell (its channel vector), or None for a dropped background tile."""
    nb, ni, nm = len(layout.blocks), len(layout.items), len(layout.mobs)
    if layout.has_light and cell[-1] <= 0.5:
        return "darkness"
    block = layout.blocks[int(np.argmax(cell[:nb]))]
    item = int(np.argmax(cell[nb:nb + ni])) if ni else 0
    mobs = cell[nb + ni:nb + ni + nm]
    parts = []
    if mobs.max() > 0.5:
        parts.append(layout.mobs[int(np.argmax(mobs))])
    if item:
        parts.append(layout.items[item])
    if not parts and block in BACKGROUND:
        return None
    return " on ".join(parts + [block])


def render_map(layout: ObsLayout, obs: np.ndarray) -> str:
    grid = np.asarray(obs[:layout.map_size], np.float32).reshape(
        layout.rows, layout.cols, layout.channels)
    entries = []
    for r in range(layout.rows):
        for c in range(layout.cols):
            text = tile_text(layout, grid[r, c])
            if text is not None:
                entries.append(f"{r - layout.rows // 2}, {c - layout.cols // 2}:{text}")
    if not entries:
        return MAP_EMPTY
    return MAP_HEADER + " " + ", ".join(entries)


def render_inventory(layout: ObsLayout, obs: np.ndarray) -> str:
    aux = np.asarray(obs[layout.map_size:], np.float32)
    items = []
    for f in layout.aux:
        if f.kind == "direction":
            v = int(np.argmax(aux[f.index:f.index + 4]))
        else:
            v = decode_value(aux[f.index], f)
        items.append(f"{f.label}:{format_value(v, f.kind)}")
    return "Inventory: " + ", ".join(items)


def render_text(layout: ObsLayout, obs: np.ndarray) -> str:
    """The observation text of one symbolic observation [D]."""
    obs = np.asarray(obs)
    if obs.shape != (layout.obs_dim,):
        raise ValueError(f"observation has shape {obs.shape}, this layout expects "
                         f"({layout.obs_dim},)")
    return render_map(layout, obs) + "\n\n" + render_inventory(layout, obs)
