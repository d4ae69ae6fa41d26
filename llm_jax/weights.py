"""Every weight of Qwen3 (dense and MoE) described once: HF safetensors names and shapes, and
the conversion to our layout. The loader, random init, shape checks, `first_layers` and the
`truncate` command derive from these tables, nothing else names an HF tensor.

Our layout: top-level `embed`, `final_norm`, `lm_head` (untied only); per-layer groups
(`LAYER_GROUPS`) each stacked on a leading layer axis: `layers` (attention and norms, every
block), `mlp` (dense SwiGLU blocks), `moe` (router and experts of sparse blocks). The
per-layer layout (`per_layer`) holds the same arrays as `blocks`, one dict per layer (its MLP,
dense or sparse, under "mlp"), for the unrolled decode loop: no slice of a stack inside it.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from llm_jax.config import Qwen3Config


class WeightSpec(NamedTuple):
    """One of our arrays, made from one or more HF tensors: each converted by `to_ours`, then
    concatenated along the last axis (q, k, v projections become one GEMM, gate and up another).
    With `experts`, each name holds "{j}" and stands for one tensor per expert, converted and
    stacked on a new leading axis ([E, ...]) before the concatenation."""

    hf_names: tuple[str, ...]  # "{i}" is the layer index for per-layer weights
    hf_shapes: Callable[[Qwen3Config], tuple[tuple[int, ...], ...]]  # one per name (per expert)
    to_ours: Callable[[np.ndarray, Qwen3Config], np.ndarray]
    # Whether a model of this config has the weight (lm_head: untied models only).
    present: Callable[[Qwen3Config], bool] = lambda c: True
    experts: bool = False

    def names(self, cfg: Qwen3Config, i: int | None = None) -> list[tuple[str, tuple[int, ...]]]:
        """(HF name, HF shape) of every tensor this weight is made from, for layer i."""
        per = range(cfg.num_experts) if self.experts else (None,)
        return [(n.format(i=i, j=j), shape) for n, shape in zip(self.hf_names, self.hf_shapes(cfg))
                for j in per]

    def convert(self, read: Callable[[str], np.ndarray], cfg: Qwen3Config,
                i: int | None = None) -> np.ndarray:
        """Our array for layer i from the HF tensors `read(name)` returns."""
        per = range(cfg.num_experts) if self.experts else (None,)
        parts = []
        for n in self.hf_names:
            ws = [self.to_ours(read(n.format(i=i, j=j)), cfg) for j in per]
            parts.append(np.stack(ws) if self.experts else ws[0])
        return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)

    def shape(self, cfg: Qwen3Config) -> tuple[int, ...]:
        """Our array's shape (for one layer), from the HF shapes alone."""
        parts = [self.to_ours(np.broadcast_to(np.zeros((), np.bool_), s), cfg).shape
                 for s in self.hf_shapes(cfg)]
        own = parts[0][:-1] + (sum(p[-1] for p in parts),)
        return ((cfg.num_experts,) if self.experts else ()) + own


def _one(name, shape, to_ours, present=lambda c: True):
    return WeightSpec((name,), lambda c: (shape(c),), to_ours, present)


_same = lambda w, c: w  # noqa: E731
_t = lambda w, c: w.T  # noqa: E731
LAYER = "model.layers.{i}."
WEIGHTS: dict[str, WeightSpec] = {
    "embed": _one("model.embed_tokens.weight", lambda c: (c.vocab_size, c.hidden_size), _same),
    "final_norm": _one("model.norm.weight", lambda c: (c.hidden_size,), _same),
    # [V, H] as HF stores it (the embedding's layout), untied models only (Qwen3-8B, MoE): tied
    # ones (0.6B-4B) take their logits from `embed`. Only decoding reads it (`lm_logits`).
    "lm_head": _one("lm_head.weight", lambda c: (c.vocab_size, c.hidden_size), _same,
                    lambda c: not c.tie_word_embeddings),
}
# Every block: attention and the two norms.
LAYER_WEIGHTS: dict[str, WeightSpec] = {
    "attn_norm": _one(LAYER + "input_layernorm.weight", lambda c: (c.hidden_size,), _same),
    # [H, (N + 2K) * D]: q heads, then k heads, then v heads.
    "qkv": WeightSpec(tuple(LAYER + f"self_attn.{x}_proj.weight" for x in "qkv"),
                      lambda c: ((c.num_heads * c.head_dim, c.hidden_size),
                                 (c.num_kv_heads * c.head_dim, c.hidden_size),
                                 (c.num_kv_heads * c.head_dim, c.hidden_size)), _t),
    "o": _one(LAYER + "self_attn.o_proj.weight",
              lambda c: (c.hidden_size, c.num_heads * c.head_dim),
              lambda w, c: w.T.reshape(c.num_heads, c.head_dim, c.hidden_size)),
    "q_norm": _one(LAYER + "self_attn.q_norm.weight", lambda c: (c.head_dim,), _same),
    "k_norm": _one(LAYER + "self_attn.k_norm.weight", lambda c: (c.head_dim,), _same),
    "mlp_norm": _one(LAYER + "post_attention_layernorm.weight", lambda c: (c.hidden_size,), _same),
}
# A dense layer's SwiGLU (every layer of Qwen3 dense; `mlp_only_layers` of a MoE model).
MLP_WEIGHTS: dict[str, WeightSpec] = {
    # [H, 2F]: gate, then up.
    "gate_up": WeightSpec((LAYER + "mlp.gate_proj.weight", LAYER + "mlp.up_proj.weight"),
                          lambda c: ((c.intermediate_size, c.hidden_size),) * 2, _t),
    "down": _one(LAYER + "mlp.down_proj.weight", lambda c: (c.hidden_size, c.intermediate_size),
                 _t),
}
EXPERT = LAYER + "mlp.experts.{j}."
# A sparse layer's router and experts, named as HF's released checkpoints and transformers 5's
# save_pretrained write them: one tensor per expert and projection.
MOE_WEIGHTS: dict[str, WeightSpec] = {
    # [H, E]
    "router": _one(LAYER + "mlp.gate.weight", lambda c: (c.num_experts, c.hidden_size), _t),
    # [E, H, 2F]: each expert's gate, then up.
    "gate_up": WeightSpec((EXPERT + "gate_proj.weight", EXPERT + "up_proj.weight"),
                          lambda c: ((c.moe_intermediate_size, c.hidden_size),) * 2, _t,
                          experts=True),
    # [E, F, H]
    "down": WeightSpec((EXPERT + "down_proj.weight",),
                       lambda c: ((c.hidden_size, c.moe_intermediate_size),), _t, experts=True),
}
# params key -> (its per-layer weights, the layers that have them), in layer order.
LAYER_GROUPS: dict[str, tuple[dict[str, WeightSpec], Callable[[Qwen3Config], tuple[int, ...]]]] = {
    "layers": (LAYER_WEIGHTS, lambda c: tuple(range(c.num_layers))),
    "mlp": (MLP_WEIGHTS, lambda c: c.dense_layers),
    "moe": (MOE_WEIGHTS, lambda c: tuple(i for i, s in enumerate(c.sparse_layers) if s)),
}
# Accepted in a checkpoint but not read: a tied model's copy of the embedding saved as lm_head.
IGNORED = ("lm_head.weight",)


def present_weights(cfg: Qwen3Config) -> dict[str, WeightSpec]:
    """The top-level weights a model of `cfg` has (`WEIGHTS` less lm_head when tied)."""
    return {name: s for name, s in WEIGHTS.items() if s.present(cfg)}


def layer_groups(cfg: Qwen3Config, layers: int | None = None
                 ) -> dict[str, tuple[dict[str, WeightSpec], tuple[int, ...]]]:
    """The per-layer groups a model of `cfg` has among its first `layers` layers (default all):
    params key -> (weights, layer indices), groups with no layer left out."""
    n = cfg.num_layers if layers is None else layers
    out = {}
    for key, (specs, which) in LAYER_GROUPS.items():
        idx = tuple(i for i in which(cfg) if i < n)
        if idx:
            out[key] = (specs, idx)
    return out


def init_params(cfg: Qwen3Config, key: jax.Array, dtype=jnp.float32,
                layers: int | None = None, per_layer: bool = False) -> dict:
    """Random weights (normal, std 0.02; norms near 1) for benchmarks and shape tests; with
    `layers`, only the first `layers` layers are made, equal to `first_layers` of the whole
    model's (random bits depend on each element's index, `jax_threefry_partitionable`).
    `per_layer`: the per-layer layout, each layer's arrays drawn on their own (never a stack
    and its copy: a 61 GB model fits where twice that would not), other values than the
    stacked layout's."""
    def one(spec, k, lead=()):
        shape = spec.shape(cfg)
        if len(shape) == 1:
            return (1.0 + 0.1 * jax.random.normal(k, lead + shape)).astype(dtype)
        return (0.02 * jax.random.normal(k, lead + shape)).astype(dtype)

    top = present_weights(cfg)
    groups = layer_groups(cfg)  # keys are drawn for every group, kept or not
    kept = layer_groups(cfg, layers)
    n_keys = len(top) + sum(len(specs) for specs, _ in groups.values())
    keys = iter(jax.random.split(key, n_keys))
    # lm_head's key comes last, so a tied model gets the same weights as before it existed.
    params = {name: one(s, next(keys)) for name, s in top.items() if name != "lm_head"}
    blocks: dict[int, dict] = {}
    for group, (specs, _) in groups.items():
        group_keys = {name: next(keys) for name in specs}
        if group in kept and per_layer:
            for i in kept[group][1]:
                arrays = {name: one(s, jax.random.fold_in(group_keys[name], i))
                          for name, s in specs.items()}
                block = blocks.setdefault(i, {})
                block.update(arrays) if group == "layers" else block.update(mlp=arrays)
        elif group in kept:
            lead = (len(kept[group][1]),)
            params[group] = {name: one(s, group_keys[name], lead) for name, s in specs.items()}
    if per_layer:
        params["blocks"] = tuple(blocks[i] for i in sorted(blocks))
    if "lm_head" in top:
        params["lm_head"] = one(top["lm_head"], next(keys))
    return params


def layer_blocks(params: dict, cfg: Qwen3Config, n: int | None = None) -> tuple[dict, ...]:
    """The first n layers' weights (default all), one dict per layer with its MLP (dense or
    sparse) under "mlp": the per-layer layout's own, else static slices of the stacks."""
    n = cfg.num_layers if n is None else n
    if "blocks" in params:
        return tuple(params["blocks"][:n])
    index = {}
    for group, (_, idx) in layer_groups(cfg, n).items():
        index.update({i: (group, j) for j, i in enumerate(idx)} if group != "layers" else {})
    out = []
    for i in range(n):
        group, j = index[i]
        out.append(dict({k: v[i] for k, v in params["layers"].items()},
                        mlp={k: v[j] for k, v in params[group].items()}))
    return tuple(out)


def per_layer(params: dict, cfg: Qwen3Config) -> dict:
    """The per-layer layout of `params` (the layers it holds): the top-level weights and
    `blocks` (`layer_blocks`) in place of the stacked groups. Jit it, or load the weights so
    (`load_params(..., per_layer=True)` never holds the stacks)."""
    if "blocks" in params:
        return params
    n = next(iter(params["layers"].values())).shape[0]
    return dict({k: v for k, v in params.items() if k not in LAYER_GROUPS},
                blocks=layer_blocks(params, cfg, n))


def first_layers(params: dict, cfg: Qwen3Config, n: int) -> dict:
    """The params of a model cut after its first n layers (the top-level weights kept): each
    per-layer group sliced to the layers it has among the first n, groups with none dropped.
    `hidden_states(..., layer=n)` on the result equals it on the whole model."""
    if "blocks" in params:
        return dict({k: v for k, v in params.items() if k != "blocks"},
                    blocks=tuple(params["blocks"][:n]))
    out = {k: v for k, v in params.items() if k not in LAYER_GROUPS}
    for group, (_, idx) in layer_groups(cfg, n).items():
        out[group] = jax.tree.map(lambda a, m=len(idx): a[:m], params[group])
    return out


