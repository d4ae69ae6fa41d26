"""Qwen3-VL's M-RoPE: positions on three axes (t, row, col) for prompts with images, and the
interleaved rotary tables of those positions, as HF's `get_rope_index` and
`Qwen3VLTextRotaryEmbedding` compute them.

Positions: text runs count on from the previous position on all three axes; an image of llm
grid (1, h, w) starting at position p puts its tokens at (p, p + row, p + col) in merge-block
order; text after it continues at p + max(h, w).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llm_jax.vl_config import VLConfig


def rope_index(tokens: np.ndarray, lengths: np.ndarray, cfg: VLConfig,
               grid: tuple[int, int, int], images: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """Host-side M-RoPE positions of right-padded rows whose images all have `grid`:
    (positions [3, B, T] int32, padding 0 as HF's; deltas [B]: max position + 1 - length, what
    generated tokens add to their index). `images`: how many images the pass gets; ValueError
    unless the rows hold exactly that many image runs (the device pass cannot check it)."""
    b, t = tokens.shape
    m = cfg.vision.spatial_merge_size
    gh, gw = grid[1] // m, grid[2] // m
    per_image = gh * gw
    rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    pos = np.zeros((3, b, t), np.int32)
    deltas = np.zeros(b, np.int32)
    for r in range(b):
        ids = tokens[r, :lengths[r]]
        i = cur = 0
        while i < len(ids):
            if ids[i] == cfg.image_token_id:
                if not (ids[i:i + per_image] == cfg.image_token_id).all():
                    raise ValueError(f"row {r}: an image run at {i} is shorter than the "
                                     f"{per_image} tokens of grid {grid}")
                pos[0, r, i:i + per_image] = cur
                pos[1, r, i:i + per_image] = cur + rows.ravel()
                pos[2, r, i:i + per_image] = cur + cols.ravel()
                cur += max(gh, gw)
                i += per_image
            else:
                pos[:, r, i] = cur
                cur += 1
                i += 1
        deltas[r] = (pos[:, r, :len(ids)].max() + 1 - len(ids)) if len(ids) else 0
    runs = sum(int((tokens[r, :lengths[r]] == cfg.image_token_id).sum()) for r in range(b))
    if images is not None and runs != images * per_image:
        raise ValueError(f"the rows hold {runs // per_image} images' tokens ({runs} "
                         f"<|image_pad|>) for {images} images; one run of {per_image} per image")
    return pos, deltas


def mrope_tables(pos: jax.Array, cfg: VLConfig, dtype) -> tuple[jax.Array, jax.Array]:
    """cos, sin [B, T, 1, D] of interleaved M-RoPE for positions [3, B, T] (HF's
    `Qwen3VLTextRotaryEmbedding`): frequency i turns with the row where i % 3 == 1 and
    i < 3 * section[1], with the column where i % 3 == 2 and i < 3 * section[2], else with t."""
    d = cfg.text.head_dim
    inv = 1.0 / (cfg.text.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    i = np.arange(d // 2)
    axis = np.zeros(d // 2, np.int32)
    axis[(i % 3 == 1) & (i < 3 * cfg.mrope_section[1])] = 1
    axis[(i % 3 == 2) & (i < 3 * cfg.mrope_section[2])] = 2
    ang = pos.astype(jnp.float32)[..., None] * inv  # [3, B, T, D/2]
    ang = jnp.moveaxis(ang[axis, :, :, i], 0, -1)  # each frequency from its own axis
    emb = jnp.concatenate([ang, ang], axis=-1)[:, :, None, :]
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)
