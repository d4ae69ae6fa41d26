"""Qwen3-VL (dense, and the MoE variant) in JAX: config, safetensors loader, and the text pass
with images: image tokens from the vision tower (`llm_jax.vision`) in place of `<|image_pad|>`,
interleaved M-RoPE over (t, row, col) positions, DeepStack states added after the first decoder
layers; the text model otherwise is Qwen3's or Qwen3-MoE's (`llm_jax.model`, the same blocks and
weights tables; a VL-MoE checkpoint's stacked expert tensors are read through
`stacked_experts`).

Positions (HF `get_rope_index`): text runs count on from the previous position on all three
axes; an image of llm grid (1, h, w) starting at position p puts its tokens at (p, p + row,
p + col) in merge-block order; text after it continues at p + max(h, w).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from llm_jax.config import Qwen3Config, Qwen3ConfigError
from llm_jax.loader import (TensorReader, WeightsError, check_tensors, expected_tensors,
                            model_kind, read_params, resolve_folder)
from llm_jax.model import HiddenStates, PrefixCache, Visual, hidden_states
from llm_jax.vision import ProcessorConfig, VisionConfig, VisionConfigError, vision_tower


# config.json model_type -> its text model's
TEXT_TYPES = {"qwen3_vl": "qwen3", "qwen3_vl_moe": "qwen3_moe"}


@dataclasses.dataclass(frozen=True)
class VLConfig:
    text: Qwen3Config
    vision: VisionConfig
    processor: ProcessorConfig
    image_token_id: int = 151655
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    mrope_section: tuple[int, int, int] = (24, 20, 20)

    @classmethod
    def from_dict(cls, d: dict, processor: dict | None = None) -> "VLConfig":
        arch = d.get("model_type")
        if arch not in TEXT_TYPES:
            raise Qwen3ConfigError(f"model_type={arch!r}, not 'qwen3_vl' or 'qwen3_vl_moe' (a "
                                   "Qwen3-VL model)")
        t = dict(d["text_config"])
        # HF's VL-MoE router always renormalises the top-k weights, whatever the config says
        moe = {"norm_topk_prob": True} if arch == "qwen3_vl_moe" else {}
        # transformers 5 writes rope_parameters; released configs (4.57) rope_scaling
        rope = t.get("rope_parameters") or t.get("rope_scaling") or {}
        section = tuple(rope.get("mrope_section", (24, 20, 20)))
        # the text model is Qwen3's; tie_word_embeddings lives at the top level of VL configs
        text = Qwen3Config.from_dict(dict(
            {k: v for k, v in t.items() if k != "rope_scaling"}, model_type=TEXT_TYPES[arch],
            **moe,
            tie_word_embeddings=d.get("tie_word_embeddings", t.get("tie_word_embeddings", False)),
            rope_parameters=dict({k: v for k, v in rope.items()
                                  if k not in ("mrope_section", "mrope_interleaved", "type")},
                                 rope_type="default")))
        if len(section) != 3 or 2 * sum(section) != text.head_dim:
            raise Qwen3ConfigError(f"mrope_section={list(section)} must be 3 numbers summing to "
                                   f"head_dim / 2 = {text.head_dim // 2}")
        vision = VisionConfig.from_dict(d["vision_config"])
        if vision.out_hidden_size != text.hidden_size:
            raise VisionConfigError(f"vision out_hidden_size={vision.out_hidden_size} != the "
                                    f"text hidden_size={text.hidden_size}")
        pc = ProcessorConfig.from_dict(processor or {"patch_size": vision.patch_size,
                                                     "merge_size": vision.spatial_merge_size,
                                                     "temporal_patch_size":
                                                         vision.temporal_patch_size})
        if (pc.patch_size, pc.merge_size, pc.temporal_patch_size) != (
                vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size):
            raise VisionConfigError("preprocessor_config.json's patch / merge / temporal sizes "
                                    "differ from the vision config's")
        return cls(text=text, vision=vision, processor=pc,
                   image_token_id=d.get("image_token_id", 151655),
                   vision_start_token_id=d.get("vision_start_token_id", 151652),
                   vision_end_token_id=d.get("vision_end_token_id", 151653),
                   mrope_section=section)

    @classmethod
    def from_folder(cls, folder: str | Path) -> "VLConfig":
        folder = Path(folder).expanduser()
        path = folder / "config.json"
        if not path.is_file():
            raise Qwen3ConfigError(f"{path} not found: pass a HuggingFace Qwen3-VL model folder")
        pre = folder / "preprocessor_config.json"
        try:
            return cls.from_dict(json.loads(path.read_text()),
                                 json.loads(pre.read_text()) if pre.is_file() else None)
        except KeyError as e:
            raise Qwen3ConfigError(f"{path} lacks required field {e}") from None


# ------------------------------------------------------------------ weights

VISUAL = "model.visual."


def _linear(w, b):
    """HF Linear (weight [out, in], bias) -> ours ([in, out], bias)."""
    return {w: lambda a: a.T, b: lambda a: a}


def vision_tensors(cfg: VisionConfig) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every tensor of the vision tower."""
    h, f, g, o = cfg.hidden_size, cfg.intermediate_size, cfg.merged_size, cfg.out_hidden_size
    p, t, c = cfg.patch_size, cfg.temporal_patch_size, cfg.in_channels
    out = {VISUAL + "patch_embed.proj.weight": (h, c, t, p, p),
           VISUAL + "patch_embed.proj.bias": (h,),
           VISUAL + "pos_embed.weight": (cfg.num_position_embeddings, h)}
    for i in range(cfg.depth):
        b = f"{VISUAL}blocks.{i}."
        out.update({b + "norm1.weight": (h,), b + "norm1.bias": (h,), b + "norm2.weight": (h,),
                    b + "norm2.bias": (h,), b + "attn.qkv.weight": (3 * h, h),
                    b + "attn.qkv.bias": (3 * h,), b + "attn.proj.weight": (h, h),
                    b + "attn.proj.bias": (h,), b + "mlp.linear_fc1.weight": (f, h),
                    b + "mlp.linear_fc1.bias": (f,), b + "mlp.linear_fc2.weight": (h, f),
                    b + "mlp.linear_fc2.bias": (h,)})
    mergers = [VISUAL + "merger."] + [f"{VISUAL}deepstack_merger_list.{j}."
                                      for j in range(len(cfg.deepstack_visual_indexes))]
    for j, m in enumerate(mergers):
        norm = h if j == 0 else g
        out.update({m + "norm.weight": (norm,), m + "norm.bias": (norm,),
                    m + "linear_fc1.weight": (g, g), m + "linear_fc1.bias": (g,),
                    m + "linear_fc2.weight": (o, g), m + "linear_fc2.bias": (o,)})
    return out


BLOCK = {"norm1_w": "norm1.weight", "norm1_b": "norm1.bias", "norm2_w": "norm2.weight",
         "norm2_b": "norm2.bias", "qkv_w": "attn.qkv.weight", "qkv_b": "attn.qkv.bias",
         "proj_w": "attn.proj.weight", "proj_b": "attn.proj.bias",
         "fc1_w": "mlp.linear_fc1.weight", "fc1_b": "mlp.linear_fc1.bias",
         "fc2_w": "mlp.linear_fc2.weight", "fc2_b": "mlp.linear_fc2.bias"}
MERGER = {"norm_w": "norm.weight", "norm_b": "norm.bias", "fc1_w": "linear_fc1.weight",
          "fc1_b": "linear_fc1.bias", "fc2_w": "linear_fc2.weight", "fc2_b": "linear_fc2.bias"}


def read_vision_params(read, cfg: VisionConfig, dtype=jnp.float32) -> dict:
    """Our vision params from `read(HF name)`: Linear weights as [in, out], the patch
    embedding's Conv3d as one [C * T * P * P, h] matrix (its kernel covers a patch exactly),
    blocks and DeepStack mergers stacked on a leading axis."""
    def conv(name):
        a = read(name)
        return a.T if a.ndim == 2 else a

    def group(prefix, table):
        return {k: conv(prefix + n) for k, n in table.items()}

    def stack(prefixes, table):
        parts = [group(p, table) for p in prefixes]
        return {k: jnp.asarray(np.stack([q[k] for q in parts]).astype(dtype)) for k in table}

    w = read(VISUAL + "patch_embed.proj.weight")
    params = {"patch_w": w.reshape(w.shape[0], -1).T,
              "patch_b": read(VISUAL + "patch_embed.proj.bias"),
              "pos_embed": read(VISUAL + "pos_embed.weight"),
              "merger": group(VISUAL + "merger.", MERGER)}
    params = jax.tree.map(lambda a: jnp.asarray(np.asarray(a).astype(dtype)), params)
    params["blocks"] = stack([f"{VISUAL}blocks.{i}." for i in range(cfg.depth)], BLOCK)
    n = len(cfg.deepstack_visual_indexes)
    params["deepstack"] = (stack([f"{VISUAL}deepstack_merger_list.{j}." for j in range(n)],
                                 MERGER) if n else {})
    return params


def text_name(name: str) -> str:
    """Our text table's HF name -> its name inside a Qwen3-VL checkpoint."""
    return "model.language_model." + name[len("model."):] if name.startswith("model.") else name


def load_vl_params(folder: str | Path, dtype=jnp.float32, layers: int | None = None
                   ) -> tuple[VLConfig, dict]:
    """(config, {"text": Qwen3 params, "vision": tower params}) of a Qwen3-VL folder; every
    tensor's name and shape checked first, all problems in one line. With `layers`, only the
    text model's first `layers` layers are read (`first_layers` of the whole)."""
    folder = resolve_folder(folder)
    if not folder.is_dir():
        raise WeightsError(f"{folder} is not a folder; pass a HuggingFace Qwen3-VL model folder")
    cfg = VLConfig.from_folder(folder)
    reader = TensorReader(folder)
    expected = {text_name(n): s for n, s in expected_tensors(cfg.text).items()}
    read = reader.read
    if cfg.text.is_moe:
        expected, read = stacked_experts(reader, cfg.text, expected)
    expected.update(vision_tensors(cfg.vision))
    check_tensors(folder, reader, expected, "a Qwen3-VL " + model_kind(cfg.text),
                  ignored=("lm_head.weight",))
    text = read_params(lambda n: read(text_name(n)), cfg.text, dtype, layers)
    return cfg, {"text": text, "vision": read_vision_params(reader.read, cfg.vision, dtype)}


PER_EXPERT = re.compile(r"^(model\.language_model\.layers\.\d+\.mlp\.experts)\.(\d+)\."
                        r"(gate|up|down)_proj\.weight$")


def stacked_experts(reader: TensorReader, cfg: Qwen3Config, expected: dict):
    """A Qwen3-VL-MoE checkpoint stacks each sparse layer's experts in two tensors,
    `mlp.experts.gate_up_proj` and `down_proj`: [E, H, 2F] (gate, then up; x @ W) and [E, F, H]
    as released, or their transposes [E, 2F, H], [E, H, F] as transformers 5's save_pretrained
    writes them. Told apart by shape as HF's loader does (the transposed layout where both
    fit: a square tensor is taken as it is). Returns `expected` with the per-expert names of
    `llm_jax.weights` replaced by the stacked tensors (in the layout the file has) and a reader
    serving each per-expert HF Linear weight from them (one stacked tensor held at a time)."""
    e, h, f = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    released = {"gate_up_proj": (e, h, 2 * f), "down_proj": (e, f, h)}
    out, transposed = {}, {}
    for name, shape in expected.items():
        m = PER_EXPERT.match(name)
        if not m:
            out[name] = shape
            continue
        for proj, want in released.items():
            full = f"{m.group(1)}.{proj}"
            if full in out:
                continue
            saved = (want[0], want[2], want[1])
            transposed[full] = full in reader.files and reader.shape(full) == saved
            out[full] = saved if transposed[full] else want
    held: dict[str, np.ndarray] = {}

    def read(name: str) -> np.ndarray:
        m = PER_EXPERT.match(name)
        if not m:
            return reader.read(name)
        full = f"{m.group(1)}.{'down_proj' if m.group(3) == 'down' else 'gate_up_proj'}"
        if full not in held:
            held.clear()
            w = reader.read(full)
            held[full] = w.transpose(0, 2, 1) if transposed[full] else w
        w = held[full][int(m.group(2))]  # [H, 2F] or [F, H]: x @ w
        return {"gate": w[:, :f], "up": w[:, f:], "down": w}[m.group(3)].T  # [out, in]

    return out, read


def random_vl_params(cfg: VLConfig, seed: int = 0, dtype=jnp.float32,
                     layers: int | None = None) -> dict:
    """Random weights of `cfg`'s shape (normal, std 0.02; LayerNorms 1 and 0; biases 0), the
    text model's first `layers` layers: for speed figures of a released shape without its
    checkpoint (outputs mean nothing)."""
    from functools import partial

    from llm_jax.weights import init_params

    rng = np.random.default_rng(seed)
    shapes = vision_tensors(cfg.vision)

    def read(name):
        if name.endswith("bias"):
            return np.zeros(shapes[name], np.float32)
        if name.endswith("norm.weight") or ".norm1." in name or ".norm2." in name:
            return np.ones(shapes[name], np.float32)
        return rng.standard_normal(shapes[name], np.float32) * 0.02

    text = jax.jit(partial(init_params, cfg.text, dtype=dtype, layers=layers))(
        jax.random.PRNGKey(seed))
    return {"text": text, "vision": read_vision_params(read, cfg.vision, dtype)}


def vision_flops(cfg: VisionConfig, patches: int) -> float:
    """Matmul FLOPs of the tower on one image of `patches` patches: the patch embedding, each
    block's projections, MLP and full attention, the merger and the DeepStack mergers."""
    h, f, g, o = cfg.hidden_size, cfg.intermediate_size, cfg.merged_size, cfg.out_hidden_size
    merged = patches // cfg.spatial_merge_size ** 2
    block = 2 * patches * (4 * h * h + 2 * h * f) + 4 * patches * patches * h
    mergers = (1 + len(cfg.deepstack_visual_indexes)) * 2 * merged * (g * g + g * o)
    return 2 * patches * cfg.patch_dim * h + cfg.depth * block + mergers


# ------------------------------------------------------------------ positions and the pass


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


def vl_hidden_states(params: dict, cfg: VLConfig, tokens, lengths, layer: int, pixels,
                     grid: tuple[int, int, int], positions,
                     prefix: PrefixCache | None = None) -> HiddenStates:
    """Residual stream after `layer` text blocks of rows with images: pixels [I, N, patch_dim]
    (`vision.preprocess`, one grid), tokens [B, T] with the images' `<|image_pad|>` runs in
    order, positions [3, B, T] (`rope_index`, given the image count, checks they match). With
    `prefix` (`vl_prefill` of the text before the first image), the rows continue it: tokens
    and positions are the prompt's from the prefix's length on."""
    out = vision_tower(params["vision"], cfg.vision, pixels, grid)
    dtype = params["text"]["embed"].dtype
    vis = visual_inputs(cfg, tokens, positions, out.embeds, out.deepstack, dtype)
    return hidden_states(params["text"], cfg.text, tokens, lengths, layer, prefix, visual=vis)


def vl_prefill(text_params: dict, cfg: VLConfig, prefix_ids, layers: int
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


def vl_generate(params: dict, cfg: VLConfig, tokens, lengths, pixels, grid: tuple[int, int, int],
                positions, deltas, key, **kw):
    """`llm_jax.decode.generate` for prompts with images (pixels, positions and deltas as
    `vl_hidden_states` and `rope_index` give them; with `prefix=` (`vl_prefill` of every layer)
    tokens and positions are the prompt's after it); keyword arguments as `generate`'s."""
    from llm_jax.decode import generate

    out = vision_tower(params["vision"], cfg.vision, pixels, grid)
    vis = visual_inputs(cfg, tokens, positions, out.embeds, out.deepstack,
                        params["text"]["embed"].dtype)
    return generate(params["text"], cfg.text, tokens, lengths, key, visual=vis,
                    pos_offset=deltas, **kw)


def image_prompt_ids(tok, folder: Path, cfg: VLConfig, n_images: int, text: str, chat: bool,
                     enable_thinking: bool, image_tokens: int) -> np.ndarray:
    """Token ids of n images before `text` (as a user turn with `chat`: the folder's own chat
    template, which takes image items, else Qwen3's with the images' tokens written out), each
    `<|image_pad|>` expanded to `image_tokens` as HF's processor does. ValueError if the text
    holds image tokens of its own."""
    vision = "<|vision_start|><|image_pad|><|vision_end|>"
    if chat:
        own = tok.folder == Path(folder) and tok.template_source is not None
        content = ([{"type": "image"}] * n_images + [{"type": "text", "text": text}] if own
                   else vision * n_images + text)
        text = tok.apply_chat_template([{"role": "user", "content": content}],
                                       enable_thinking=enable_thinking)
    else:
        text = vision * n_images + text
    ids = np.asarray(tok.encode(text), np.int32)
    pad = cfg.image_token_id
    if (ids == pad).sum() != n_images:
        raise ValueError(f"the prompt holds {(ids == pad).sum()} <|image_pad|> tokens for "
                         f"{n_images} images; leave image tokens out of the text")
    return np.repeat(ids, np.where(ids == pad, image_tokens, 1)).astype(np.int32)


def image_pool_every(pool: str) -> int | None:
    """K of a pool over image tokens: `every:K` -> K, `image-mean` -> 1; None for any other."""
    if pool == "image-mean":
        return 1
    k = pool.removeprefix("every:")
    return int(k) if pool.startswith("every:") and k.isdigit() and int(k) >= 1 else None


def pool_states(text_params: dict, cfg: VLConfig, x, tokens, lengths, pool: str,
                post_norm: bool):
    """States x [B, T, H] of rows with images pooled: `none`, `last` or `mean` as for text, or
    over the image tokens (`image-mean`, `every:K`: the mean of every K-th image token of a
    row, the prior system's every:8)."""
    from llm_jax.model import _pool

    if pool in ("none", "last", "mean"):
        return _pool(text_params, cfg.text, x, lengths, pool, post_norm)
    k = image_pool_every(pool)
    if k is None:
        raise ValueError(f"pool={pool!r}; use none, last, mean, image-mean or every:K")
    if post_norm:
        x = _pool(text_params, cfg.text, x, lengths, "none", True)
    img = tokens == cfg.image_token_id
    pick = jnp.cumsum(img, axis=1) - 1
    w = (img & (pick % k == 0)).astype(jnp.float32)
    return (jnp.einsum("bth,bt->bh", x.astype(jnp.float32), w) / w.sum(1)[:, None]
            ).astype(x.dtype)
