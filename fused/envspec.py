"""What each supported environment is, described once: observation layout, actions, achievements.

Code that differs between envs reads an `EnvSpec` (`spec(name)`) instead of matching on the
name. The symbolic observation layout (`ObsLayout`) says where each piece sits in the vector and
how the env scaled each inventory value (`ValueKind`), so that the text renderers
(`fused.text.format` on the host, `fused.text.render` on the device) read values back exactly.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Literal, get_args

EnvName = Literal[
    "Craftax-Symbolic-v1",
    "Craftax-Classic-Symbolic-v1",
    "Craftax-Pixels-v1",
    "Craftax-Classic-Pixels-v1",
    "probe-constant",
    "probe-obs-reward",
    "probe-delayed",
    "probe-action-reward",
    "probe-obs-action",
    "probe-truncated",
    "probe-lengths",
    "probe-memory",
]

TextEnvName = Literal["Craftax-Symbolic-v1", "Craftax-Classic-Symbolic-v1"]  # with a text format
PixelEnvName = Literal["Craftax-Pixels-v1", "Craftax-Classic-Pixels-v1"]  # frames as observations
MAX_VALUE = 999  # counts above this (never reached in Craftax) would not render on the device


# --- inventory values ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ValueKind:
    """How one inventory value is read from the observation and written. `decode` works on numpy
    (host renderer) and jax.numpy (device renderer) alike, in float32, so both agree exactly;
    the device renders the integers 0..count-1."""

    name: str
    count: int = MAX_VALUE + 1
    width: int = 1  # observation entries read

    def decode(self, xp, x, scale: float):
        """x: the `width` entries of this value -> the integer it is written from."""
        return xp.rint(x[0] * xp.float32(scale))

    def text(self, v: int) -> str:
        return str(v)


class SqrtCount(ValueKind):
    """Stored as sqrt(count) / scale."""

    def decode(self, xp, x, scale):
        y = x[0] * xp.float32(scale)
        return xp.rint(y * y)


class Tenths(ValueKind):
    """Health: one decimal."""

    def decode(self, xp, x, scale):
        return xp.rint(x[0] * xp.float32(scale * 10))

    def text(self, v):
        return f"{v // 10}.{v % 10}"


class Thousandths(ValueKind):
    """Light level in [0, 1], three decimals."""

    def decode(self, xp, x, scale):
        return xp.rint(x[0] * xp.float32(1000))

    def text(self, v):
        return f"{v // 1000}.{v % 1000:03d}"


class Flag(ValueKind):
    def decode(self, xp, x, scale):
        return (x[0] > 0.5).astype(xp.int32)

    def text(self, v):
        return "True" if v else "False"


DIRECTIONS = ("left", "right", "up", "down")


class Direction(ValueKind):
    """A one-hot over the four directions."""

    def decode(self, xp, x, scale):
        return xp.argmax(x)

    def text(self, v):
        return DIRECTIONS[v]


COUNT = ValueKind("count")
SQRT_COUNT = SqrtCount("sqrt_count")
TENTHS = Tenths("tenths")
THOUSANDTHS = Thousandths("thousandths", count=1001)
FLAG = Flag("bool", count=2)
DIRECTION = Direction("direction", count=len(DIRECTIONS), width=len(DIRECTIONS))


@dataclasses.dataclass(frozen=True)
class AuxField:
    """One `Label:value` of the inventory line: `index` is its position in the aux vector (after
    the map), `scale` undoes the env's scaling."""

    label: str
    index: int
    kind: ValueKind
    scale: float = 1.0

    def decode(self, xp, aux):
        return self.kind.decode(xp, aux[self.index:self.index + self.kind.width], self.scale)


# --- map and layout -----------------------------------------------------------------------------

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


@dataclasses.dataclass(frozen=True)
class ObsLayout:
    """A symbolic observation: a rows x cols x channels map (block one-hot, item one-hot, mob
    channels, optional light), then `aux_size` inventory/status values."""

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

    @property
    def background(self) -> tuple[str, ...]:
        """Blocks left out of the map line unless something stands on them."""
        return tuple(b for b in BACKGROUND if b in self.blocks)


def _full_aux() -> tuple[AuxField, ...]:
    fields = [AuxField(n, i, SQRT_COUNT, 10.0) for i, n in enumerate(
        ("Wood", "Stone", "Coal", "Iron", "Diamond", "Sapphire", "Ruby", "Sapling", "Torch",
         "Arrow"))]
    fields += [AuxField("Book", 10, COUNT, 2.0), AuxField("Pickaxe", 11, COUNT, 4.0),
               AuxField("Sword", 12, COUNT, 4.0), AuxField("Sword Enchantment", 13, COUNT),
               AuxField("Bow Enchantment", 14, COUNT), AuxField("Bow", 15, COUNT)]
    fields += [AuxField(f"{c} Potion", 16 + i, SQRT_COUNT, 10.0)
               for i, c in enumerate(("Red", "Green", "Blue", "Pink", "Cyan", "Yellow"))]
    fields += [AuxField("Health", 22, TENTHS, 10.0)]
    fields += [AuxField(n, 23 + i, COUNT, 10.0) for i, n in enumerate(
        ("Food", "Drink", "Energy", "Mana", "XP", "Dexterity", "Strength", "Intelligence"))]
    fields += [AuxField("Direction", 31, DIRECTION)]
    fields += [AuxField(f"{p} Armour", 35 + i, COUNT, 2.0)
               for i, p in enumerate(("Helmet", "Chestplate", "Leggings", "Boots"))]
    fields += [AuxField(f"{p} Enchantment", 39 + i, COUNT)
               for i, p in enumerate(("Helmet", "Chestplate", "Leggings", "Boots"))]
    fields += [AuxField("Light", 43, THOUSANDTHS), AuxField("Is Sleeping", 44, FLAG),
               AuxField("Is Resting", 45, FLAG), AuxField("Learned Fireball", 46, FLAG),
               AuxField("Learned Iceball", 47, FLAG), AuxField("Floor", 48, COUNT, 10.0),
               AuxField("Ladder Open", 49, FLAG), AuxField("Is Boss Vulnerable", 50, FLAG)]
    return tuple(fields)


def _classic_aux() -> tuple[AuxField, ...]:
    names = ("Wood", "Stone", "Coal", "Iron", "Diamond", "Sapling", "Wood Pickaxe",
             "Stone Pickaxe", "Iron Pickaxe", "Wood Sword", "Stone Sword", "Iron Sword",
             "Health", "Food", "Drink", "Energy")
    fields = [AuxField(n, i, COUNT, 10.0) for i, n in enumerate(names)]
    return tuple(fields + [AuxField("Direction", 16, DIRECTION),
                           AuxField("Light", 20, THOUSANDTHS),
                           AuxField("Is Sleeping", 21, FLAG)])


FULL_LAYOUT = ObsLayout(9, 11, BLOCKS_FULL, ITEMS_FULL, MOBS_FULL, True, _full_aux(), 51)
CLASSIC_LAYOUT = ObsLayout(7, 9, BLOCKS_CLASSIC, (), MOBS_CLASSIC, False, _classic_aux(), 22)


# --- env specs ----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EnvSpec:
    name: str
    family: Literal["craftax", "probe"]
    obs_dim: int
    num_actions: int
    layout: ObsLayout | None = None  # symbolic layout (text observations); None: no text format
    title: str = ""  # the game's name in the prompt
    floors: int = 1  # dungeon floors generated per world
    constants: str | None = None  # craftax module holding the Achievement and Action enums
    image: tuple[int, int, int] | None = None  # a frame's (height, width, 3): a pixel env, its
    #                                            observation the frame flattened (obs_dim)
    fast_step: bool = False  # `fused.envs` has a step of its own for it (--env.impl fast)

    @property
    def has_text(self) -> bool:
        return self.layout is not None

    @property
    def is_pixels(self) -> bool:
        return self.image is not None

    def _enum(self, name: str):
        return getattr(importlib.import_module(self.constants), name)

    @property
    def achievement_names(self) -> tuple[str, ...]:
        return tuple(a.name.lower() for a in self._enum("Achievement")) if self.constants else ()

    @property
    def action_names(self) -> tuple[str, ...]:
        """`id:NAME` of every action (the prompt's action list)."""
        return tuple(f"{a.value}:{a.name}" for a in self._enum("Action")) if self.constants else ()


SPECS: dict[str, EnvSpec] = {
    "Craftax-Symbolic-v1": EnvSpec("Craftax-Symbolic-v1", "craftax", FULL_LAYOUT.obs_dim, 43,
                                   FULL_LAYOUT, "Craftax", 9, "craftax.craftax.constants",
                                   fast_step=True),
    "Craftax-Classic-Symbolic-v1": EnvSpec(
        "Craftax-Classic-Symbolic-v1", "craftax", CLASSIC_LAYOUT.obs_dim, 17, CLASSIC_LAYOUT,
        "Craftax Classic", 1, "craftax.craftax_classic.constants", fast_step=True),
    # 9 x 11 blocks of 10 px above a 40-row inventory; Classic: 7 x 9 blocks of 7 px
    "Craftax-Pixels-v1": EnvSpec("Craftax-Pixels-v1", "craftax", 130 * 110 * 3, 43, None,
                                 "Craftax", 9, "craftax.craftax.constants", (130, 110, 3),
                                 fast_step=True),
    "Craftax-Classic-Pixels-v1": EnvSpec(
        "Craftax-Classic-Pixels-v1", "craftax", 63 * 63 * 3, 17, None, "Craftax Classic", 1,
        "craftax.craftax_classic.constants", (63, 63, 3), fast_step=True),
}
SPECS.update({n: EnvSpec(n, "probe", 2, 2) for n in get_args(EnvName) if n.startswith("probe-")})
TEXT_ENVS = get_args(TextEnvName)
PIXEL_ENVS = get_args(PixelEnvName)
assert tuple(SPECS) == get_args(EnvName)
assert TEXT_ENVS == tuple(n for n, s in SPECS.items() if s.has_text)
assert PIXEL_ENVS == tuple(n for n, s in SPECS.items() if s.is_pixels)


def spec(name: str) -> EnvSpec:
    if name not in SPECS:
        raise ValueError(f"unknown env {name!r}; supported: {', '.join(SPECS)}")
    return SPECS[name]


# A pixel env's text twin: the same game observed symbolically, which is what an LLM reads of
# a frame's state. An env with an LLM beside its frames observes both (`text_offset`).
TEXT_TWIN = {"Craftax-Pixels-v1": "Craftax-Symbolic-v1",
             "Craftax-Classic-Pixels-v1": "Craftax-Classic-Symbolic-v1"}


def text_env(name: str) -> str | None:
    """The env whose text format an LLM reads for `name`: itself, its text twin, or None."""
    return name if spec(name).has_text else TEXT_TWIN.get(name)


def text_offset(name: str) -> int:
    """Where the symbolic observation begins in an observation an LLM reads: 0, or after the
    frame for a pixel env (its observation is then the frame, then the twin's)."""
    return 0 if spec(name).has_text else spec(name).obs_dim
