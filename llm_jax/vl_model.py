"""A Qwen3-VL's text pass with images, on the device: image tokens from the vision tower
(`llm_jax.vision`) in place of `<|image_pad|>`, interleaved M-RoPE over (t, row, col) positions
(`llm_jax.mrope`), DeepStack states added after the first decoder layers; the text model
otherwise is Qwen3's or Qwen3-MoE's (`llm_jax.model`, the same blocks and weights). States
(`vl_hidden_states`), a prefix cache of the text before the first image (`vl_prefill`),
generation (`vl_generate`) and pooling (`pool_states`, over image tokens too)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from llm_jax.decode import Generated, GenerateSpec, generate
from llm_jax.model import HiddenStates, PrefixCache, Visual, hidden_states, pool_hidden
from llm_jax.mrope import mrope_tables
from llm_jax.vision import vision_tower
from llm_jax.vl_config import VLConfig
from llm_jax.vl_weights import VLWeights
from llm_jax.weights import Weights


def visual_inputs(cfg: VLConfig, tokens, positions, embeds, deepstack, dtype) -> Visual:
    """`Visual` for a text pass: the image tokens of every image in order (embeds [I, M, H],
    deepstack [S, I, M, H]) put at the `<|image_pad|>` positions of tokens [B, T] in row-major
    order (HF's masked_scatter), with the rope tables of positions [3, B, T]."""
    b, t = tokens.shape
    mask = tokens == cfg.image_token_id
    flat = embeds.reshape(-1, embeds.shape[-1])
    idx = jnp.clip(jnp.cumsum(mask.reshape(-1)) - 1, 0, flat.shape[0] - 1).reshape(b, t)
    placed = flat[idx]
    deep = deepstack.reshape(deepstack.shape[0], -1, deepstack.shape[-1])[:, idx]
    deep = jnp.where(mask[None, ..., None], deep, 0)
    return Visual(placed, mask, mrope_tables(positions, cfg, dtype), deep)


def vl_hidden_states(params: VLWeights, cfg: VLConfig, tokens, lengths, layer: int, pixels,
                     grid: tuple[int, int, int], positions,
                     prefix: PrefixCache | None = None) -> HiddenStates:
    """Residual stream after `layer` text blocks of rows with images: pixels [I, N, patch_dim]
    (`vision.preprocess`, one grid), tokens [B, T] with the images' `<|image_pad|>` runs in
    order, positions [3, B, T] (`rope_index`, given the image count, checks they match). With
    `prefix` (`vl_prefill` of the text before the first image), the rows continue it: tokens
    and positions are the prompt's from the prefix's length on."""
    vis = _visual(params, cfg, tokens, pixels, grid, positions)
    return hidden_states(params.text, cfg.text, tokens, lengths, layer, prefix, visual=vis)


def vl_prefill(text_params: Weights, cfg: VLConfig, prefix_ids, layers: int
               ) -> tuple[PrefixCache, jax.Array]:
    """The cache of a prompt's text before its first image (`prefix_ids` [P], no image token),
    shared by every row whose prompt starts with it: (keys / values of the first `layers`
    blocks, the states [P, H] after block `layers`). Text positions are 0..P-1 on all three
    M-RoPE axes, where M-RoPE equals Qwen3's plain rope, so the text model's pass computes it."""
    if (np.asarray(prefix_ids) == cfg.image_token_id).any():
        raise ValueError("a prefix with image tokens; cache only the text before the first image")
    tokens = jnp.asarray(prefix_ids, jnp.int32)[None]
    out = hidden_states(text_params, cfg.text, tokens, jnp.array([tokens.shape[1]], jnp.int32),
                        layers)
    if out.kv is None:  # layer 0: the embeddings, no block to cache
        t = cfg.text
        empty = jnp.zeros((0, tokens.shape[1], t.num_kv_heads, t.head_dim), out.x.dtype)
        return PrefixCache(empty, empty), out.x[0]
    return PrefixCache(out.kv[0][:, 0], out.kv[1][:, 0]), out.x[0]


def _visual(params: VLWeights, cfg: VLConfig, tokens, pixels, grid: tuple[int, int, int],
            positions) -> Visual:
    """The images' part of a text pass: the tower on pixels, placed at tokens' image runs."""
    out = vision_tower(params.vision, cfg.vision, pixels, grid)
    return visual_inputs(cfg, tokens, positions, out.embeds, out.deepstack,
                         params.text.embed.dtype)


def vl_generate(params: VLWeights, cfg: VLConfig, spec: GenerateSpec, tokens, lengths, pixels,
                grid: tuple[int, int, int], positions, deltas, *, key=None,
                prefix: PrefixCache | None = None, row_keys=None) -> Generated:
    """`llm_jax.decode.generate` for prompts with images (pixels, positions and deltas as
    `vl_hidden_states` and `rope_index` give them; with `prefix` (`vl_prefill` of every layer)
    tokens and positions are the prompt's after it); `spec`, key and row_keys as
    `generate`'s."""
    vis = _visual(params, cfg, tokens, pixels, grid, positions)
    return generate(params.text, cfg.text, spec, tokens, lengths, key=key, prefix=prefix,
                    row_keys=row_keys, visual=vis, pos_offset=deltas)


def image_pool_every(pool: str) -> int | None:
    """K of a pool over image tokens: `every:K` -> K, `image-mean` -> 1; None for any other."""
    if pool == "image-mean":
        return 1
    k = pool.removeprefix("every:")
    return int(k) if pool.startswith("every:") and k.isdigit() and int(k) >= 1 else None


def pool_states(text_params: Weights, cfg: VLConfig, x, tokens, lengths, pool: str,
                post_norm: bool):
    """States x [B, T, H] of rows with images pooled: `none`, `last` or `mean` as for text, or
    over the image tokens (`image-mean`, `every:K`: the mean of every K-th image token of a
    row, the prior system's every:8)."""
    if pool in ("none", "last", "mean"):
        return pool_hidden(text_params, cfg.text, x, lengths, pool, post_norm)
    k = image_pool_every(pool)
    if k is None:
        raise ValueError(f"pool={pool!r}; use none, last, mean, image-mean or every:K")
    if post_norm:
        x = pool_hidden(text_params, cfg.text, x, lengths, "none", True)
    img = tokens == cfg.image_token_id
    pick = jnp.cumsum(img, axis=1) - 1
    w = (img & (pick % k == 0)).astype(jnp.float32)
    return (jnp.einsum("bth,bt->bh", x.astype(jnp.float32), w) / w.sum(1)[:, None]
            ).astype(x.dtype)
