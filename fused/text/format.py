"""The text observation format and the reference (host, plain Python) renderer.

One Craftax symbolic observation becomes two lines with a blank line between:

    Map (interesting tiles only): -4, -5:tree, 0, 1:zombie on grass, ...
    Inventory: Wood:8, Stone:17, ..., Health:9.0, ..., Direction:left, Light:0.131, ...

`r, c` are the row (-4..4, negative = up) and column (-5..5, negative = left) relative to the
player at `0, 0`; rows are the outer loop. A tile is `[<mob> on ][<item> on ]<block>` with enum
names lower-cased (`_` kept, so every name is one word), or `darkness` where the tile is unlit.
Background blocks are dropped unless something stands on them; when nothing is left the line is
`Map: [No interesting tiles in view - all background]`.

Everything is read back from the observation vector alone (not the env state), so the same text
can be produced on the device (`fused.text.render`) and from stored datasets. The env's
`ObsLayout` (`fused.envspec`) says where each piece sits in the vector and how it was scaled.
"""

from __future__ import annotations

import numpy as np

from fused.envspec import TEXT_ENVS, ObsLayout, spec

MAP_HEADER = "Map (interesting tiles only):"
MAP_EMPTY = "Map: [No interesting tiles in view - all background]"


def get_layout(env_name: str) -> ObsLayout:
    """The symbolic observation layout of a text-capable env (one line naming the problem else)."""
    s = spec(env_name)
    if s.layout is None:
        raise ValueError(f"no text format for env {env_name!r}; supported: {', '.join(TEXT_ENVS)}")
    return s.layout


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
    if not parts and block in layout.background:
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
    items = [f"{f.label}:{f.kind.text(int(f.decode(np, aux)))}" for f in layout.aux]
    return "Inventory: " + ", ".join(items)


def render_text(layout: ObsLayout, obs: np.ndarray) -> str:
    """The observation text of one symbolic observation [D]."""
    obs = np.asarray(obs)
    if obs.shape != (layout.obs_dim,):
        raise ValueError(f"observation has shape {obs.shape}, this layout expects "
                         f"({layout.obs_dim},)")
    return render_map(layout, obs) + "\n\n" + render_inventory(layout, obs)
