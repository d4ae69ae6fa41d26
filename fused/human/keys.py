"""Craftax's own key map (its `play_craftax` / `play_craftax_classic` scripts), by the names a
browser gives keys (`KeyboardEvent.key`, lower-cased, with `space` and `tab`) and a `--script`
file uses. Each name maps to an action's NAME in the env's Action enum."""

from __future__ import annotations

from fused.envspec import spec

MOVES = {"q": "NOOP", "w": "UP", "d": "RIGHT", "s": "DOWN", "a": "LEFT", "space": "DO",
         "tab": "SLEEP", "t": "PLACE_TABLE", "r": "PLACE_STONE", "f": "PLACE_FURNACE",
         "p": "PLACE_PLANT"}
CLASSIC = dict(MOVES, **{"1": "MAKE_WOOD_PICKAXE", "2": "MAKE_STONE_PICKAXE",
                         "3": "MAKE_IRON_PICKAXE", "4": "MAKE_WOOD_SWORD",
                         "5": "MAKE_STONE_SWORD", "6": "MAKE_IRON_SWORD"})
FULL = dict(MOVES, **{
    "1": "MAKE_WOOD_PICKAXE", "2": "MAKE_STONE_PICKAXE", "3": "MAKE_IRON_PICKAXE",
    "4": "MAKE_DIAMOND_PICKAXE", "5": "MAKE_WOOD_SWORD", "6": "MAKE_STONE_SWORD",
    "7": "MAKE_IRON_SWORD", "8": "MAKE_DIAMOND_SWORD", "e": "REST", ",": "ASCEND",
    ".": "DESCEND", "y": "MAKE_IRON_ARMOUR", "u": "MAKE_DIAMOND_ARMOUR", "i": "SHOOT_ARROW",
    "o": "MAKE_ARROW", "g": "CAST_FIREBALL", "h": "CAST_ICEBALL", "j": "PLACE_TORCH",
    "z": "DRINK_POTION_RED", "x": "DRINK_POTION_GREEN", "c": "DRINK_POTION_BLUE",
    "v": "DRINK_POTION_PINK", "b": "DRINK_POTION_CYAN", "n": "DRINK_POTION_YELLOW",
    "m": "READ_BOOK", "k": "ENCHANT_SWORD", "l": "ENCHANT_ARMOUR", "[": "MAKE_TORCH",
    "]": "LEVEL_UP_DEXTERITY", "-": "LEVEL_UP_STRENGTH", "=": "LEVEL_UP_INTELLIGENCE",
    ";": "ENCHANT_BOW"})


def key_map(env_name: str) -> dict[str, int]:
    """Key name -> action id of `env_name` (a Craftax env, symbolic or pixels)."""
    s = spec(env_name)
    names = CLASSIC if "Classic" in env_name else FULL
    actions = {n.split(":", 1)[1]: int(n.split(":", 1)[0]) for n in s.action_names}
    return {k: actions[a] for k, a in names.items()}


def key_name(raw: str) -> str:
    """A key as typed in a script file or sent by the page: `space` / ` `, `tab`, letters in
    either case, punctuation as itself."""
    k = raw.strip("\n\r")
    if k == " ":
        return "space"
    k = k.strip()
    return k.lower() if len(k) > 1 or k.isalpha() else k
