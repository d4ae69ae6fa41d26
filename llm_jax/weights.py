"""Qwen3's weights (dense and MoE) as typed pytrees, and every weight described once: its HF
safetensors names and shapes, and the conversion to our layout. The loader, random init, shape
checks, `first_layers` and the `truncate` command derive from that one description (`WEIGHTS`);
nothing else names an HF tensor.

Types (frozen dataclasses registered as pytrees, each with `replace`): `Attention` (q, k and v
projections as one matrix, so one GEMM; o; the q/k norms), `DenseMLP` (gate and up as one
matrix, down), `MoE` (router and experts), `Layer` (one block: its two norms, its attention and
its MLP) and `Weights` (the whole model: embedding, final norm, layers, lm_head of untied models).
`WEIGHTS` is a `Weights` whose leaves are `WeightSpec`s, each describing one layer's array.

The layers come in two layouts (`Weights.layers`):
- stacked (`Stacked`, what `lax.scan` runs over): `common`, a `Layer` of every block's attention
  and norms with a leading layer axis [L, ...] (its `mlp` None); `dense`, the dense MLPs
  [L_dense, ...]; `moe`, the sparse ones [L_sparse, ...]; each in layer order, None where no
  layer has it;
- per layer (a tuple of `Layer`s, each with its own MLP, dense or sparse: `per_layer`): the
  same arrays for the unrolled decode loop, no slice of a stack inside it.
"""

from __future__ import annotations

import dataclasses
import os
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from llm_jax.config import Qwen3Config


def _replace(self, **changes):
    """A copy with the fields in `changes` replaced."""
    return dataclasses.replace(self, **changes)


def weights_type(cls):
    """`cls` as a frozen dataclass registered as a pytree (every field a child; a None field
    an empty subtree), with `replace(**fields)`."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    cls.replace = _replace
    return jax.tree_util.register_dataclass(cls)


@weights_type
class Attention:
    """A block's self-attention (every array with a leading layer axis in `Stacked`)."""

    qkv: jax.Array  # [H, (N + 2K) * D]: q heads, then k heads, then v heads
    o: jax.Array  # [N, D, H]
    q_norm: jax.Array  # [D] per-head RMSNorm of the queries
    k_norm: jax.Array  # [D] ... of the keys


@weights_type
class DenseMLP:
    """A dense layer's SwiGLU (every layer of a dense Qwen3; `mlp_only_layers` of a MoE)."""

    gate_up: jax.Array  # [H, 2F]: gate, then up
    down: jax.Array  # [F, H]


@weights_type
class MoE:
    """A sparse layer's router and experts (`llm_jax.moe`)."""

    router: jax.Array  # [H, E]
    gate_up: jax.Array  # [E, H, 2F]: each expert's gate, then up
    down: jax.Array  # [E, F, H]


@weights_type
class Layer:
    """One block: x + attention(RMSNorm(x)), then x + MLP(RMSNorm(x)). In `Stacked.common` the
    arrays have a leading layer axis and `mlp` is None (the MLPs are stacked by kind); a forward
    pass's step gets one block's `Layer` with its MLP (`llm_jax.model.scan_layers`, which may
    put a `MixedMLP` there)."""

    attn_norm: jax.Array  # [H]
    attn: Attention
    mlp_norm: jax.Array  # [H]
    mlp: DenseMLP | MoE | None = None


@weights_type
class Stacked:
    """The layers stacked by group for `lax.scan`, each group in layer order; None where no
    layer (of those held) has it."""

    common: Layer | None = None  # [L, ...]: every block's attention and norms (mlp None)
    dense: DenseMLP | None = None  # [L_dense, ...]: the layers of `cfg.dense_layers`
    moe: MoE | None = None  # [L_sparse, ...]: the sparse layers


@weights_type
class Weights:
    """A Qwen3 (or a Qwen3-VL's text model): the first layers it holds, stacked or per layer."""

    embed: jax.Array  # [V, H]
    final_norm: jax.Array  # [H]
    layers: Stacked | tuple[Layer, ...]
    # [V, H] as HF stores it (the embedding's layout), untied models only (Qwen3-8B, MoE): tied
    # ones (0.6B-4B) take their logits from `embed`. Only decoding reads it (`lm_logits`).
    lm_head: jax.Array | None = None


@dataclasses.dataclass(frozen=True)
class WeightSpec:
    """One of our arrays, made from one or more HF tensors: each converted by `to_ours`, then
    concatenated along the last axis (q, k, v projections become one GEMM, gate and up another).
    With `experts`, each name holds "{j}" and stands for one tensor per expert, converted and
    stacked on a new leading axis ([E, ...]) before the concatenation. A pytree leaf."""

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
HF_LAYER = "model.layers.{i}."
HF_EXPERT = HF_LAYER + "mlp.experts.{j}."
WEIGHTS = Weights(
    embed=_one("model.embed_tokens.weight", lambda c: (c.vocab_size, c.hidden_size), _same),
    final_norm=_one("model.norm.weight", lambda c: (c.hidden_size,), _same),
    layers=Stacked(
        common=Layer(
            attn_norm=_one(HF_LAYER + "input_layernorm.weight", lambda c: (c.hidden_size,),
                           _same),
            attn=Attention(
                qkv=WeightSpec(tuple(HF_LAYER + f"self_attn.{x}_proj.weight" for x in "qkv"),
                               lambda c: ((c.num_heads * c.head_dim, c.hidden_size),
                                          (c.num_kv_heads * c.head_dim, c.hidden_size),
                                          (c.num_kv_heads * c.head_dim, c.hidden_size)), _t),
                o=_one(HF_LAYER + "self_attn.o_proj.weight",
                       lambda c: (c.hidden_size, c.num_heads * c.head_dim),
                       lambda w, c: w.T.reshape(c.num_heads, c.head_dim, c.hidden_size)),
                q_norm=_one(HF_LAYER + "self_attn.q_norm.weight", lambda c: (c.head_dim,), _same),
                k_norm=_one(HF_LAYER + "self_attn.k_norm.weight", lambda c: (c.head_dim,), _same)),
            mlp_norm=_one(HF_LAYER + "post_attention_layernorm.weight",
                          lambda c: (c.hidden_size,), _same)),
        dense=DenseMLP(
            gate_up=WeightSpec((HF_LAYER + "mlp.gate_proj.weight", HF_LAYER + "mlp.up_proj.weight"),
                               lambda c: ((c.intermediate_size, c.hidden_size),) * 2, _t),
            down=_one(HF_LAYER + "mlp.down_proj.weight",
                      lambda c: (c.hidden_size, c.intermediate_size), _t)),
        # named as HF's released checkpoints and transformers 5's save_pretrained write them:
        # one tensor per expert and projection
        moe=MoE(
            router=_one(HF_LAYER + "mlp.gate.weight", lambda c: (c.num_experts, c.hidden_size), _t),
            gate_up=WeightSpec((HF_EXPERT + "gate_proj.weight", HF_EXPERT + "up_proj.weight"),
                               lambda c: ((c.moe_intermediate_size, c.hidden_size),) * 2, _t,
                               experts=True),
            down=WeightSpec((HF_EXPERT + "down_proj.weight",),
                            lambda c: ((c.hidden_size, c.moe_intermediate_size),), _t,
                            experts=True))),
    lm_head=_one("lm_head.weight", lambda c: (c.vocab_size, c.hidden_size), _same,
                 lambda c: not c.tie_word_embeddings))
# The layers of a model that have each of `Stacked`'s groups, in layer order.
GROUP_LAYERS: dict[str, Callable[[Qwen3Config], tuple[int, ...]]] = {
    "common": lambda c: tuple(range(c.num_layers)),
    "dense": lambda c: c.dense_layers,
    "moe": lambda c: tuple(i for i, s in enumerate(c.sparse_layers) if s),
}
# Accepted in a checkpoint but not read: a tied model's copy of the embedding saved as lm_head.
IGNORED = ("lm_head.weight",)


def present_weights(cfg: Qwen3Config) -> dict[str, WeightSpec]:
    """The top-level weights a model of `cfg` has, by field of `Weights` (lm_head: untied)."""
    top = {"embed": WEIGHTS.embed, "final_norm": WEIGHTS.final_norm, "lm_head": WEIGHTS.lm_head}
    return {name: s for name, s in top.items() if s.present(cfg)}


def layer_groups(cfg: Qwen3Config, layers: int | None = None
                 ) -> dict[str, tuple[object, tuple[int, ...]]]:
    """The groups of `Stacked` a model of `cfg` has among its first `layers` layers (default
    all): field -> (its description in `WEIGHTS`, a pytree of `WeightSpec`s; the layer
    indices), groups with no layer left out."""
    n = cfg.num_layers if layers is None else layers
    out = {}
    for name, which in GROUP_LAYERS.items():
        idx = tuple(i for i in which(cfg) if i < n)
        if idx:
            out[name] = (getattr(WEIGHTS.layers, name), idx)
    return out


def mlp_rows(cfg: Qwen3Config, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Of the first n layers: (sparse [n] bool, index [n] int32: each layer's row in its MLP's
    stack, `Stacked.moe` for a sparse layer, `Stacked.dense` for a dense one)."""
    sparse = np.asarray(cfg.sparse_layers[:n], bool)
    index = np.where(sparse, np.cumsum(sparse) - 1, np.cumsum(~sparse) - 1)
    return sparse, index.astype(np.int32)


def init_params(cfg: Qwen3Config, key: jax.Array, dtype=jnp.float32,
                layers: int | None = None, per_layer: bool = False) -> Weights:
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
    n_keys = len(top) + sum(len(jax.tree.leaves(desc)) for desc, _ in groups.values())
    keys = iter(jax.random.split(key, n_keys))
    # lm_head's key comes last, so a tied model gets the same weights as before it existed.
    embed, final_norm = one(top["embed"], next(keys)), one(top["final_norm"], next(keys))
    stacks, blocks = {}, {}
    for group, (desc, _) in groups.items():
        specs, tree = jax.tree.flatten(desc)
        group_keys = tree.unflatten([next(keys) for _ in specs])
        for i in kept[group][1] if group in kept and per_layer else ():
            arrays = jax.tree.map(lambda s, k: one(s, jax.random.fold_in(k, i)), desc, group_keys)
            blocks[i] = arrays if group == "common" else blocks[i].replace(mlp=arrays)
        if group in kept and not per_layer:
            lead = (len(kept[group][1]),)
            stacks[group] = jax.tree.map(lambda s, k: one(s, k, lead), desc, group_keys)
    lm_head = one(top["lm_head"], next(keys)) if "lm_head" in top else None
    held = tuple(blocks[i] for i in sorted(blocks)) if per_layer else Stacked(**stacks)
    return Weights(embed, final_norm, held, lm_head)


def random_params(cfg: Qwen3Config, key: jax.Array, dtype=jnp.float32,
                  layers: int | None = None, per_layer: bool = False) -> Weights:
    """`init_params` jitted (a released shape's weights made on the device, without float32
    copies), its program optimised by LLVM even in a process whose XLA_FLAGS skip that
    (`--xla_backend_optimization_level=0`, the test suite's setting): the draws run over every
    weight, which unoptimised code makes slow. The weights are those a process at XLA's default
    level draws (unoptimised code rounds a few differently)."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    options = ({"xla_backend_optimization_level": 1}
               if "--xla_backend_optimization_level=0" in flags else None)
    return jax.jit(partial(init_params, cfg, dtype=dtype, layers=layers, per_layer=per_layer),
                   compiler_options=options)(key)


def held_layers(params: Weights) -> int:
    """How many layers `params` holds (a model cut by `first_layers` holds its first ones)."""
    if isinstance(params.layers, tuple):
        return len(params.layers)
    common = params.layers.common
    return 0 if common is None else common.attn_norm.shape[0]


def layer_blocks(params: Weights, cfg: Qwen3Config, n: int | None = None) -> tuple[Layer, ...]:
    """The first n layers' weights (default all), one `Layer` per layer with its MLP (dense or
    sparse): the per-layer layout's own, else static slices of the stacks."""
    n = cfg.num_layers if n is None else n
    if isinstance(params.layers, tuple):
        return params.layers[:n]
    st = params.layers
    sparse, index = mlp_rows(cfg, n)
    out = []
    for i in range(n):
        common = jax.tree.map(lambda a: a[i], st.common)
        mlp = jax.tree.map(lambda a, j=index[i]: a[j], st.moe if sparse[i] else st.dense)
        out.append(common.replace(mlp=mlp))
    return tuple(out)


def per_layer(params: Weights, cfg: Qwen3Config) -> Weights:
    """The per-layer layout of `params` (the layers it holds): `layer_blocks` in place of the
    stacks. Jit it, or load the weights so (`load_params(..., per_layer=True)` never holds the
    stacks)."""
    if isinstance(params.layers, tuple):
        return params
    return params.replace(layers=layer_blocks(params, cfg, held_layers(params)))


def first_layers(params: Weights, cfg: Qwen3Config, n: int) -> Weights:
    """The weights of a model cut after its first n layers (the top-level weights kept): each
    stack sliced to the layers it has among the first n, stacks with none None.
    `hidden_states(..., layer=n)` on the result equals it on the whole model."""
    if isinstance(params.layers, tuple):
        return params.replace(layers=params.layers[:n])
    sparse, _ = mlp_rows(cfg, n)

    def cut(stack, m):
        return None if stack is None or m == 0 else jax.tree.map(lambda a: a[:m], stack)

    st = params.layers
    return params.replace(layers=Stacked(cut(st.common, n), cut(st.dense, int((~sparse).sum())),
                                         cut(st.moe, int(sparse.sum()))))
