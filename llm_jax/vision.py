"""Qwen3-VL's vision side in JAX: its config, the image processor on the device, the vision
tower (patch embedding, learned positions resampled to the image's grid, 2D rotary attention
blocks, the 2 x 2 merger, DeepStack mergers), as HF transformers' `models/qwen3_vl/` and the
Qwen2-VL image processor define them.

Images of one call share one size, so every shape is static: a batch [B, H, W, 3] of uint8
frames becomes patches [B, N, C * T * P * P] (N = grid_h * grid_w, in merge-block order) and
then N / merge^2 image tokens per image of the text model's width. Attention is full within an
image (HF's cu_seqlens blocks), batched over images.

Resizing is Pillow's bicubic (what HF's image processor does where torchvision is absent: the
`PilBackend`), reproduced bit for bit: Pillow's filter (a = -0.5, support 2, widened by the
scale when shrinking), its 22-bit fixed-point coefficients, one pass per axis into uint8, in
Pillow 13's order (`resize_bicubic`). The taps are gathered (no dense resampling matrix) in
int32, exact on every backend.

Letters in einsums: b images, n patches, m merged tokens, h the tower's width, f its MLP width,
e heads, d head dim, o the text model's width.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from llm_jax.vl_weights import Merger, VisionBlock, VisionWeights


class VisionConfigError(ValueError):
    """A vision config that is not Qwen3-VL's, or an image the processor cannot take."""


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """`vision_config` of a Qwen3-VL config.json (every field read, none assumed)."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    num_position_embeddings: int
    deepstack_visual_indexes: tuple[int, ...]
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    hidden_act: str = "gelu_pytorch_tanh"
    rope_theta: float = 10_000.0

    @classmethod
    def from_dict(cls, d: dict) -> "VisionConfig":
        if d.get("hidden_act", "gelu_pytorch_tanh") not in ("gelu_pytorch_tanh", "gelu"):
            raise VisionConfigError(f"vision hidden_act={d['hidden_act']!r}: Qwen3-VL uses "
                                    "gelu_pytorch_tanh")
        rope = d.get("rope_parameters") or {}
        if rope.get("rope_type", "axial") not in ("axial", "default"):
            raise VisionConfigError(f"vision rope {rope}: only Qwen3-VL's 2D (axial) rope")
        for key in ("patch_size", "temporal_patch_size"):
            if not isinstance(d.get(key, 1), int):
                raise VisionConfigError(f"vision {key}={d[key]!r}: only square patches")
        cfg = cls(depth=d["depth"], hidden_size=d["hidden_size"],
                  intermediate_size=d["intermediate_size"], num_heads=d["num_heads"],
                  out_hidden_size=d["out_hidden_size"],
                  num_position_embeddings=d["num_position_embeddings"],
                  deepstack_visual_indexes=tuple(d.get("deepstack_visual_indexes", ())),
                  patch_size=d.get("patch_size", 16),
                  temporal_patch_size=d.get("temporal_patch_size", 2),
                  spatial_merge_size=d.get("spatial_merge_size", 2),
                  in_channels=d.get("in_channels", 3), hidden_act=d.get("hidden_act",
                                                                        "gelu_pytorch_tanh"),
                  rope_theta=float(rope.get("rope_theta", 10_000.0)))
        side = math.isqrt(cfg.num_position_embeddings)
        if side * side != cfg.num_position_embeddings:
            raise VisionConfigError(f"num_position_embeddings={cfg.num_position_embeddings} is "
                                    "not a square grid")
        if cfg.hidden_size % cfg.num_heads or (cfg.hidden_size // cfg.num_heads) % 4:
            raise VisionConfigError(f"vision hidden_size={cfg.hidden_size} / num_heads="
                                    f"{cfg.num_heads}: the head dim must be a multiple of 4")
        bad = [i for i in cfg.deepstack_visual_indexes if not 0 <= i < cfg.depth]
        if bad:
            raise VisionConfigError(f"deepstack_visual_indexes {bad} outside 0..{cfg.depth - 1}")
        return cfg

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def num_params(self) -> int:
        """Parameters of the tower: patch embedding, positions, blocks, the mergers."""
        h, f, g = self.hidden_size, self.intermediate_size, self.merged_size
        block = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
        merger = g * g + g + g * self.out_hidden_size + self.out_hidden_size
        n_deep = len(self.deepstack_visual_indexes)
        return (self.patch_dim * h + h + self.num_position_embeddings * h + self.depth * block
                + merger + 2 * h + n_deep * (merger + 2 * g))

    @property
    def patch_dim(self) -> int:
        """Values per patch: channels x frames x P x P."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merged_size(self) -> int:
        """Width of a merged token before the merger's MLP (merge^2 patches side by side)."""
        return self.hidden_size * self.spatial_merge_size ** 2


@dataclasses.dataclass(frozen=True)
class ProcessorConfig:
    """The image processor's settings (`preprocessor_config.json`; Qwen3-VL's released values
    as defaults): images are resized to multiples of patch x merge with min_pixels <= H x W <=
    max_pixels, rescaled by 1/255 and normalised per channel."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 65_536
    max_pixels: int = 16_777_216
    image_mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    image_std: tuple[float, ...] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255

    @classmethod
    def from_dict(cls, d: dict) -> "ProcessorConfig":
        size = d.get("size") or {}
        off = [k for k in ("do_resize", "do_rescale", "do_normalize") if d.get(k) is False]
        if off:
            raise VisionConfigError(f"preprocessor_config.json sets {', '.join(off)} false: "
                                    "only Qwen3-VL's processing (resize, rescale, normalise)")
        # as HF: top-level min_pixels / max_pixels win over size
        return cls(patch_size=d.get("patch_size", 16),
                   temporal_patch_size=d.get("temporal_patch_size", 2),
                   merge_size=d.get("merge_size", 2),
                   min_pixels=d.get("min_pixels") or size.get("shortest_edge", 65_536),
                   max_pixels=d.get("max_pixels") or size.get("longest_edge", 16_777_216),
                   image_mean=tuple(d.get("image_mean", (0.5,) * 3)),
                   image_std=tuple(d.get("image_std", (0.5,) * 3)),
                   rescale_factor=d.get("rescale_factor", 1 / 255))

    def resized(self, height: int, width: int) -> tuple[int, int]:
        """HF's `smart_resize`: the size an image of (height, width) is resized to."""
        factor = self.patch_size * self.merge_size
        if max(height, width) / min(height, width) > 200:
            raise VisionConfigError(f"image {height} x {width}: aspect ratio above 200")
        h = round(height / factor) * factor
        w = round(width / factor) * factor
        if h * w > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            h = max(factor, math.floor(height / beta / factor) * factor)
            w = max(factor, math.floor(width / beta / factor) * factor)
        elif h * w < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            h = math.ceil(height * beta / factor) * factor
            w = math.ceil(width * beta / factor) * factor
        return h, w

    def grid(self, height: int, width: int) -> tuple[int, int, int]:
        """(t, grid_h, grid_w) of one image of that size: HF's `image_grid_thw` row."""
        h, w = self.resized(height, width)
        return 1, h // self.patch_size, w // self.patch_size

    def num_tokens(self, height: int, width: int) -> int:
        """Image tokens (`<|image_pad|>`) one image of that size takes in the prompt."""
        _, gh, gw = self.grid(height, width)
        return gh * gw // self.merge_size ** 2


# Pillow's resampling (libImaging/Resample.c): 8-bit images use coefficients in fixed point
# with PRECISION_BITS = 32 - 8 - 2.
_PRECISION = 22


def _pil_bicubic(x: np.ndarray) -> np.ndarray:
    a = -0.5
    x = np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def pil_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow's bicubic taps along one axis: (first input index [out], fixed-point coefficients
    [out, k] int32, zero past each output's own taps), as `precompute_coeffs` and
    `normalize_coeffs_8bpc` compute them (float64, then rounded away from zero)."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    first = np.zeros(out_size, np.int32)
    coeffs = np.zeros((out_size, ksize), np.int32)
    ss = 1.0 / filterscale
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        w = _pil_bicubic((np.arange(xmax) + xmin - center + 0.5) * ss)
        total = 0.0
        for v in w:  # in order, as Pillow's loop adds them
            total += float(v)
        if total != 0.0:
            w = w / total
        fixed = np.where(w < 0, -0.5 + w * (1 << _PRECISION), 0.5 + w * (1 << _PRECISION))
        coeffs[xx, :xmax] = np.trunc(fixed).astype(np.int32)  # C's (int) cast
        first[xx] = xmin
    return first, coeffs


def _resample_axis(img: jax.Array, axis: int, in_size: int, out_size: int) -> jax.Array:
    """One Pillow pass along `axis` of a uint8 image batch: int32 taps, +half, >> 22, clipped."""
    first, coeffs = pil_taps(in_size, out_size)
    idx = np.minimum(first[:, None] + np.arange(coeffs.shape[1]), in_size - 1)  # [out, k]
    taps = jnp.take(img.astype(jnp.int32), jnp.asarray(idx), axis=axis)  # axis -> (out, k)
    shape = [1] * taps.ndim
    shape[axis], shape[axis + 1] = coeffs.shape
    acc = jnp.sum(taps * jnp.asarray(coeffs).reshape(shape), axis=axis + 1)
    acc = acc + (1 << (_PRECISION - 1))
    return jnp.clip(acc >> _PRECISION, 0, 255).astype(jnp.uint8)


def resize_bicubic(images: jax.Array, height: int, width: int) -> jax.Array:
    """Pillow's `Image.resize((width, height), BICUBIC)` of uint8 images [B, H, W, C], bit for
    bit: one pass per axis, the first into uint8; an axis whose size does not change is not
    resampled (as Pillow skips it). Pillow 13 runs the vertical pass first when the height
    shrinks and loses more than twice as many pixels as the width (python-pillow/Pillow#9549;
    found equal to it on shapes either side of that line), else the horizontal one (every
    older Pillow: horizontal first)."""
    _, h, w, _ = images.shape
    x = images
    if width != w and height < h and h - height > 2 * (w - width):
        return _resample_axis(_resample_axis(x, 1, h, height), 2, w, width)
    if width != w:
        x = _resample_axis(x, 2, w, width)
    if height != h:
        x = _resample_axis(x, 1, h, height)
    return x


def preprocess(images: jax.Array, pc: ProcessorConfig) -> tuple[jax.Array, tuple[int, int, int]]:
    """Qwen2-VL's image processor on the device: uint8 images [B, H, W, 3] -> pixel values
    [B, N, 3 * T * P * P] float32 (N = grid_h * grid_w patches in merge-block order, each image
    repeated over the T temporal slots) and the grid (1, grid_h, grid_w), as HF's processor
    gives `pixel_values` (per image) and `image_grid_thw`."""
    if images.dtype != jnp.uint8 or images.ndim != 4 or images.shape[-1] != 3:
        raise VisionConfigError(f"images {images.dtype}{list(images.shape)}: give uint8 "
                                "[B, H, W, 3] (frames as round(255 x))")
    b, h, w, c = images.shape
    rh, rw = pc.resized(h, w)
    x = resize_bicubic(images, rh, rw).astype(jnp.float32)
    # as HF: x * (1/255) (float64 there; the same float32 here to within 1 ulp), then (x - m) / s
    x = x * jnp.float32(pc.rescale_factor)
    x = (x - jnp.asarray(pc.image_mean, jnp.float32)) / jnp.asarray(pc.image_std, jnp.float32)
    p, m, t = pc.patch_size, pc.merge_size, pc.temporal_patch_size
    gh, gw = rh // p, rw // p
    x = x.reshape(b, gh // m, m, p, gw // m, m, p, c)
    x = x.transpose(0, 1, 4, 2, 5, 7, 3, 6)  # b, H/m, W/m, m, m, c, p, p
    x = jnp.broadcast_to(x[:, :, :, :, :, :, None], (*x.shape[:6], t, p, p))
    return x.reshape(b, gh * gw, c * t * p * p), (1, gh, gw)


# --------------------------------------------------------------------------- the tower


class VisionOutput(NamedTuple):
    embeds: jax.Array  # [B, M, O] image tokens for the text model (M = N / merge^2)
    deepstack: jax.Array  # [S, B, M, O] one per deepstack_visual_indexes entry (S may be 0)


def _block_order(gh: int, gw: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of each patch in merge-block order (HF's `get_vision_position_ids`)."""
    rows, cols = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    shape = (gh // m, m, gw // m, m)
    return (rows.reshape(shape).transpose(0, 2, 1, 3).ravel(),
            cols.reshape(shape).transpose(0, 2, 1, 3).ravel())


def position_taps(cfg: VisionConfig, gh: int, gw: int) -> tuple[np.ndarray, np.ndarray]:
    """Bilinear (align_corners) resampling of the square learned position table to the grid,
    per patch in merge-block order: (indices [N, 4], weights [N, 4] float32)."""
    side = math.isqrt(cfg.num_position_embeddings)
    row, col = _block_order(gh, gw, cfg.spatial_merge_size)

    def axis(i, size):
        src = i.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
        lo = np.floor(src)
        taps = np.clip(lo.astype(np.int64)[:, None] + np.arange(2), 0, side - 1)
        wts = np.clip(1 - np.abs(src[:, None] - lo[:, None] - np.arange(2)), 0, None)
        return taps, wts.astype(np.float32)

    ht, hw = axis(row, gh)
    wt, ww = axis(col, gw)
    idx = (ht[:, :, None] * side + wt[:, None, :]).reshape(-1, 4)
    wts = (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4)
    return idx.astype(np.int32), wts


def rotary(cfg: VisionConfig, gh: int, gw: int) -> tuple[jax.Array, jax.Array]:
    """cos, sin [N, D] of the tower's 2D rope: the head dim's first half turns with the row,
    its second half with the column, each half rotate-half style."""
    d = cfg.head_dim // 2
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float32) / d))
    row, col = _block_order(gh, gw, cfg.spatial_merge_size)
    ang = np.concatenate([row[:, None] * inv, col[:, None] * inv], axis=-1).astype(np.float32)
    ang = np.concatenate([ang, ang], axis=-1)
    return jnp.asarray(np.cos(ang)), jnp.asarray(np.sin(ang))


def layer_norm(x, w, b, eps=1e-6):
    xf = x.astype(jnp.float32)
    mu = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mu), axis=-1, keepdims=True)
    return ((xf - mu) * jax.lax.rsqrt(var + eps)).astype(x.dtype) * w + b


def _rope(x, cos, sin):
    d = x.shape[-1]
    xf = x.astype(jnp.float32)
    turned = jnp.concatenate([-xf[..., d // 2:], xf[..., : d // 2]], axis=-1)
    return (xf * cos[:, None] + turned * sin[:, None]).astype(x.dtype)


def vision_block(cfg: VisionConfig, bp: VisionBlock, x, cos, sin):
    """One pre-LayerNorm block over x [B, N, h]: full attention within each image."""
    b, n, _ = x.shape
    h = layer_norm(x, bp.norm1_w, bp.norm1_b)
    qkv = (jnp.einsum("bnh,hc->bnc", h, bp.qkv_w) + bp.qkv_b).reshape(
        b, n, 3, cfg.num_heads, cfg.head_dim)
    q, k, v = _rope(qkv[:, :, 0], cos, sin), _rope(qkv[:, :, 1], cos, sin), qkv[:, :, 2]
    a = jax.nn.dot_product_attention(q, k, v).reshape(b, n, cfg.hidden_size)
    x = x + jnp.einsum("bnh,hg->bng", a, bp.proj_w) + bp.proj_b
    h = layer_norm(x, bp.norm2_w, bp.norm2_b)
    f = jax.nn.gelu(jnp.einsum("bnh,hf->bnf", h, bp.fc1_w) + bp.fc1_b,
                    approximate=cfg.hidden_act == "gelu_pytorch_tanh")
    return x + jnp.einsum("bnf,fh->bnh", f, bp.fc2_w) + bp.fc2_b


def merger(cfg: VisionConfig, mp: Merger, x, postshuffle: bool):
    """Each merge-block's patches side by side -> one token of the text model's width:
    LayerNorm (per patch, or after grouping for the DeepStack mergers), Linear, GELU, Linear."""
    b, n, _ = x.shape
    g = cfg.spatial_merge_size ** 2
    if postshuffle:
        x = layer_norm(x.reshape(b, n // g, g * cfg.hidden_size), mp.norm_w, mp.norm_b)
    else:
        x = layer_norm(x, mp.norm_w, mp.norm_b).reshape(b, n // g, g * cfg.hidden_size)
    x = jax.nn.gelu(jnp.einsum("bmh,hg->bmg", x, mp.fc1_w) + mp.fc1_b, approximate=False)
    return jnp.einsum("bmg,go->bmo", x, mp.fc2_w) + mp.fc2_b


def vision_tower(params: VisionWeights, cfg: VisionConfig, pixels: jax.Array,
                 grid: tuple[int, int, int]) -> VisionOutput:
    """Image tokens of pixel values [B, N, patch_dim] (`preprocess`) of one grid."""
    _, gh, gw = grid
    dtype = params.patch_w.dtype
    x = jnp.einsum("bnp,ph->bnh", pixels.astype(dtype), params.patch_w) + params.patch_b
    idx, wts = position_taps(cfg, gh, gw)
    pos = jnp.einsum("nkh,nk->nh", params.pos_embed[idx].astype(jnp.float32), wts)
    x = x + pos.astype(dtype)
    cos, sin = rotary(cfg, gh, gw)
    # The DeepStack layers' outputs land in slots of a carried buffer; other layers write the
    # spare last slot (no [depth, ...] stack of every layer's states is kept).
    n_deep = len(cfg.deepstack_visual_indexes)
    slot = np.full(cfg.depth, n_deep, np.int32)
    slot[list(cfg.deepstack_visual_indexes)] = np.arange(n_deep)

    def step(carry, a):
        x, buf = carry
        bp, s = a
        x = vision_block(cfg, bp, x, cos, sin)
        return (x, jax.lax.dynamic_update_index_in_dim(buf, x, s, 0)), None

    buf = jnp.zeros((n_deep + 1, *x.shape), x.dtype)
    (x, buf), _ = jax.lax.scan(step, (x, buf), (params.blocks, jnp.asarray(slot)))
    if n_deep:
        deep = jax.vmap(lambda mp, y: merger(cfg, mp, y, True))(params.deepstack, buf[:n_deep])
    else:
        deep = jnp.zeros((0, x.shape[0], x.shape[1] // cfg.spatial_merge_size ** 2,
                          cfg.out_hidden_size), dtype)
    return VisionOutput(merger(cfg, params.merger, x, False), deep)


def vision_flops(cfg: VisionConfig, patches: int) -> float:
    """Matmul FLOPs of the tower on one image of `patches` patches: the patch embedding, each
    block's projections, MLP and full attention, the merger and the DeepStack mergers."""
    h, f, g, o = cfg.hidden_size, cfg.intermediate_size, cfg.merged_size, cfg.out_hidden_size
    merged = patches // cfg.spatial_merge_size ** 2
    block = 2 * patches * (4 * h * h + 2 * h * f) + 4 * patches * patches * h
    mergers = (1 + len(cfg.deepstack_visual_indexes)) * 2 * merged * (g * g + g * o)
    return 2 * patches * cfg.patch_dim * h + cfg.depth * block + mergers
