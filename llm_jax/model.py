"""Qwen3 (dense and mixture-of-experts) as pure functions over its typed weights
(`llm_jax.weights.Weights`), with a hidden-state API and prefix cache.

Each weight is described once in `llm_jax.weights` (HF names and shapes, conversion); the
loader, random init, shape checks and `first_layers` derive from that description. The q, k, v
projections are stored as one matrix, and gate and up as another, so each is one GEMM.

Layers. Stacked weights (`Stacked`) hold every block's attention and norms `[L, ...]`, the dense
MLPs `[L_dense, ...]` and the sparse ones `[L_sparse, ...]` (router and experts), each group in
layer order and None when no layer has it. The blocks run under one `lax.scan`
(`scan_layers`), so compile time does not grow with depth and asking for layer L computes only
the first L blocks. When the first L layers mix dense and sparse MLPs (`mlp_only_layers`,
`decoder_sparse_step` > 1), the scan carries each layer's kind and its index in its group, and
`mlp_block` picks the MLP with `lax.cond` (both compiled once, one run per layer): one scan and
one compiled block whatever the pattern, where runs of same-kind layers as separate scans would
compile a block per run (48 for an alternating 48-layer model).

Letters in einsums: b batch, t query positions, s key positions, p prefix positions, h hidden,
n query heads, k kv heads, g query heads per kv head, d head dim, f MLP width, v vocab,
c q, k and v columns together.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from typing import Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from einops import rearrange

from llm_jax.config import Qwen3Config
from llm_jax.moe import MoEForm, moe_mlp
from llm_jax.weights import (DenseMLP, Layer, MoE, Stacked, Weights, first_layers,  # noqa: F401
                             init_params, mlp_rows)


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """As HF: normalise in float32, cast back, then scale by the weight as stored."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return w * y.astype(x.dtype)


def rope_tables(pos: jax.Array, d: int, theta: float, dtype) -> tuple[jax.Array, jax.Array]:
    """cos, sin of rotate-half RoPE for positions pos [B or 1, T]: each [., T, 1, D] in `dtype`
    (computed once per forward pass and shared by every layer)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    ang = pos.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
    emb = jnp.concatenate([ang, ang], axis=-1)[:, :, None, :]
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half RoPE. x: [B, T, heads, D]; cos, sin from `rope_tables`."""
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


AttentionForm = Literal["auto", "cudnn", "blocked", "row", "pallas"]
FORMS: tuple[str, ...] = ("cudnn", "blocked", "row", "pallas")  # the concrete forms


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """How `attention` (and a MoE model's experts, `moe_form`) is computed: static (part of the traced program, never a global).
    `form` "auto" picks row by row on CPU; on an NVIDIA GPU in bf16/fp16 where cuDNN compiles,
    the Pallas kernel for calls after a shared prefix (heads permitting, `kernel_suits`) and
    cuDNN otherwise; blocked elsewhere (`resolve_form`); the block sizes matter only to the
    forms that use them."""

    form: AttentionForm = "auto"
    query_block: int = 64  # causal block of the blocked form
    row_query_block: int = 128  # causal block of the row form (measured best at 512 tokens)
    kernel_blocks: tuple[int, int] = (32, 64)
    """The Pallas kernel's query positions x keys a step (powers of two, Triton's tiles; the
    choice's timings: bench/prefix_kernel.py, docs/BENCHMARKS.md)."""
    moe_form: MoEForm = "auto"
    """How a mixture-of-experts MLP runs its experts (`llm_jax.moe`): auto (`ragged_dot` on
    TPU; elsewhere tiled, or gathered for calls with few tokens: decode steps), ragged, tiled,
    gathered, pallas (`kernels.grouped_matmul`; not yet timed on a GPU), or dense (the test
    oracle). Carried here with the
    attention form: both are the static "how" of a forward pass, passed everywhere it goes."""

    def __post_init__(self):
        if not all(map(_pow2, self.kernel_blocks)):
            raise ValueError(f"kernel_blocks {self.kernel_blocks}: powers of two, as Triton's "
                             "tiles must be")


def _pow2(x: int) -> bool:
    return x >= 1 and not x & (x - 1)


class PrefixCache(NamedTuple):
    """Keys/values of a shared prompt prefix, one entry per computed layer."""

    k: jax.Array  # [L, P, K, D] (after k-norm and RoPE)
    v: jax.Array  # [L, P, K, D]


def attention(q, k, v, mask, lengths, prefix_k=None, prefix_v=None,
              cfg: AttentionConfig = AttentionConfig()):
    """q: [B, T, N, D]; k, v: [B, T, K, D]; mask: [B, T, T] bool (True = attend: causal and
    padding); lengths: [B] valid positions per row (the padding of `mask`).
    prefix_k/v: [P, K, D] shared by the whole batch, visible to every query.

    This is the one function a Pallas kernel can replace. Four forms (`cfg.form`; "auto" is
    resolved by `resolve_form`):
    - "cudnn" (GPU, bf16/fp16): cuDNN's fused flash attention through
      `jax.nn.dot_product_attention(implementation="cudnn")`, padding from `lengths`; with a
      prefix, the prefix keys go in front of each row's own and one [T, P + T] mask, shared by
      all rows and heads, lets query i see the prefix and its own keys up to i; no score matrix
      goes through memory;
    - "blocked" (other accelerators, float32): `jax.nn.dot_product_attention` on blocks of
      `cfg.query_block` queries, each against only the keys up to its own end (later keys are
      masked anyway); with a prefix, a joint softmax over prefix and own keys that never copies
      the prefix per batch row (products in the input dtype, accumulated in float32);
    - "row" (CPU): one (batch row, kv head) pair at a time, so that a block's scores stay in
      cache instead of a [B, heads, T, S] array going through memory (see
      `_causal_attention_by_row`, `_prefix_attention_by_row`);
    - "pallas": `kernels.prefix_attention`, a flash-style kernel that reads the shared prefix
      once per block of queries (through Pallas' interpreter on CPU: exact, slow; for tests).
      "auto" picks it on an NVIDIA GPU for calls after a prefix, where it was measured faster
      than cuDNN's form; causal calls stay on cuDNN (docs/BENCHMARKS.md)."""
    form = resolve_form(cfg.form, q.dtype, prefix=prefix_k is not None
                        and kernel_suits(q.shape[2] // k.shape[2], q.shape[3]))
    if form == "pallas":
        from kernels import prefix_attention

        if prefix_k is None:
            prefix_k = prefix_v = jnp.zeros((0, *k.shape[2:]), k.dtype)
        bq, bk = cfg.kernel_blocks
        return prefix_attention(q, k, v, lengths, prefix_k, prefix_v, block_q=bq, block_k=bk,
                                interpret=jax.default_backend() == "cpu")
    if form == "cudnn":
        return _cudnn_attention(q, k, v, lengths, prefix_k, prefix_v)
    if prefix_k is None:
        if form == "row":
            return _causal_attention_by_row(q, k, v, mask, cfg.row_query_block)
        t, blk = q.shape[1], cfg.query_block
        outs = [jax.nn.dot_product_attention(q[:, i:i + blk], k[:, :i + blk], v[:, :i + blk],
                                             mask=mask[:, None, i:i + blk, :i + blk])
                for i in range(0, t, blk)]
        return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)
    if form == "row":
        return _prefix_attention_by_row(q, k, v, mask, prefix_k, prefix_v)
    kh = k.shape[2]
    f32 = jnp.float32
    # Products in the input dtype (bf16 on tensor cores), accumulated and softmaxed in float32.
    qg = rearrange(q, "b t (k g) d -> b t k g d", k=kh)
    scale = q.shape[-1] ** -0.5
    s_pre = jnp.einsum("btkgd,pkd->bkgtp", qg, prefix_k, preferred_element_type=f32) * scale
    s_own = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=f32) * scale
    s_own = jnp.where(mask[:, None, None], s_own, -jnp.inf)
    p = jax.nn.softmax(jnp.concatenate([s_pre, s_own], axis=-1), axis=-1).astype(v.dtype)
    np_ = prefix_k.shape[0]
    out = (jnp.einsum("bkgtp,pkd->btkgd", p[..., :np_], prefix_v, preferred_element_type=f32)
           + jnp.einsum("bkgts,bskd->btkgd", p[..., np_:], v, preferred_element_type=f32))
    return rearrange(out, "b t k g d -> b t (k g) d").astype(q.dtype)


def kernel_suits(group: int, head_dim: int) -> bool:
    """Whether `auto` may give the Pallas kernel these heads: Triton's tiles need powers of two
    (a GQA group of 5, as Qwen3-14B's 40 / 8 heads, does not lower), and only groups of up to 4
    were timed (0.6B: 2, 4B: 4); a group of 8 holds 256 query vectors a program, untimed."""
    return _pow2(group) and group <= 4 and _pow2(head_dim) and 16 <= head_dim <= 256


def resolve_form(form: AttentionForm, dtype, prefix: bool = False
                 ) -> Literal["row", "blocked", "cudnn", "pallas"]:
    """The concrete form `attention` traces: `form` itself unless it is "auto", which picks row
    by row on CPU; on a GPU in bf16/fp16 where cuDNN compiles (an NVIDIA GPU, where Triton runs
    the kernel too), the Pallas kernel for calls after a shared prefix whose heads suit it
    (`prefix`: `attention` passes `kernel_suits`) and cuDNN otherwise; blocked elsewhere. The
    kernel lowers for CUDA under every jax the project allows (`lowers_for`)."""
    if form != "auto":
        return form
    backend = jax.default_backend()
    if backend == "cpu":
        return "row"
    if backend == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) and _cudnn_compiles():
        return "pallas" if prefix else "cudnn"
    return "blocked"


def _cudnn_attention(q, k, v, lengths, prefix_k=None, prefix_v=None):
    """cuDNN flash attention: causal within a row, padding from `lengths`. With a prefix, its
    keys go in front of each row's own: a [B, P + T, K, D] copy of k and v per layer, far less
    memory traffic than the [B, heads, T, P + T] float32 scores of the blocked form."""
    b, t = q.shape[:2]
    lengths = lengths.astype(jnp.int32)
    if prefix_k is None:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, query_seq_lengths=lengths,
                                            key_value_seq_lengths=lengths, implementation="cudnn")
    p = prefix_k.shape[0]
    kk = jnp.concatenate([jnp.broadcast_to(prefix_k, (b, *prefix_k.shape)), k], axis=1)
    vv = jnp.concatenate([jnp.broadcast_to(prefix_v, (b, *prefix_v.shape)), v], axis=1)
    own = jnp.arange(t)
    sees = jnp.concatenate([jnp.ones((t, p), bool), own[:, None] >= own[None, :]], axis=1)
    return jax.nn.dot_product_attention(q, kk, vv, mask=sees[None, None],
                                        query_seq_lengths=lengths,
                                        key_value_seq_lengths=lengths + p, implementation="cudnn")


@functools.cache
def _cudnn_compiles() -> bool:
    """Whether this GPU's cuDNN compiles both calls of `_cudnn_attention` (tried once on small
    shapes; an old cuDNN or an unsupported GPU falls back to the blocked form, with a warning)."""
    q = jax.ShapeDtypeStruct((2, 16, 4, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 16, 2, 64), jnp.bfloat16)
    pre = jax.ShapeDtypeStruct((8, 2, 64), jnp.bfloat16)
    n = jax.ShapeDtypeStruct((2,), jnp.int32)
    try:
        jax.jit(_cudnn_attention).lower(q, kv, kv, n).compile()
        jax.jit(_cudnn_attention).lower(q, kv, kv, n, pre, pre).compile()
    except Exception as e:  # noqa: BLE001 -- whatever the failure, the blocked form is used
        warnings.warn(f"cuDNN attention unavailable ({type(e).__name__}: {str(e)[:200]}); "
                      "using the blocked XLA form", stacklevel=2)
        return False
    return True


def _causal_attention_by_row(q, k, v, mask, block: int):
    """CPU path without a prefix: `lax.map` over (batch row, kv head) pairs; each pair's query
    heads attend in blocks of `block` queries to the keys up to the block's end, scores in
    float32: on XLA:CPU faster than batched blocks or one `dot_product_attention` over the whole
    square. When the whole sequence is one block, all pairs go in one batched pass instead:
    XLA:CPU runs a `lax.map` body on one core, the batched ops on every core."""
    b, t, n, d = q.shape
    kh = k.shape[2]
    f32 = jnp.float32
    qt = rearrange(q, "b t (k g) d -> (b k) g t d", k=kh)
    kt = rearrange(k, "b t k d -> (b k) t d")
    vt = rearrange(v, "b t k d -> (b k) t d")
    scale = d ** -0.5

    if t <= block:  # one block: every pair at once, (G, T) as one query axis
        g = n // kh
        s = jnp.einsum("pqd,psd->pqs", qt.reshape(b * kh, g * t, d), kt,
                       preferred_element_type=f32).reshape(b * kh, g, t, t) * scale
        s = jnp.where(jnp.repeat(mask, kh, axis=0)[:, None], s, -jnp.inf)
        p = jnp.exp(s - s.max(-1, keepdims=True))
        o = jnp.einsum("pqs,psd->pqd", p.astype(vt.dtype).reshape(b * kh, g * t, t), vt,
                       preferred_element_type=f32) / p.sum(-1).reshape(b * kh, g * t, 1)
        o = o.astype(q.dtype).reshape(b * kh, g, t, d)
    else:
        def pair(x):
            qq, kk, vv, row = x
            m = mask[row]
            outs = []
            for i in range(0, t, block):
                j = min(i + block, t)
                s = jnp.einsum("gtd,sd->gts", qq[:, i:j], kk[:j],
                               preferred_element_type=f32) * scale
                s = jnp.where(m[None, i:j, :j], s, -jnp.inf)
                p = jnp.exp(s - s.max(-1, keepdims=True))
                o = jnp.einsum("gts,sd->gtd", p.astype(vv.dtype), vv[:j],
                               preferred_element_type=f32)
                outs.append(o / p.sum(-1, keepdims=True))
            return jnp.concatenate(outs, axis=1).astype(q.dtype)

        o = jax.lax.map(pair, (qt, kt, vt, jnp.arange(b * kh) // kh))  # [B*K, G, T, D]
    return rearrange(o, "(b k) g t d -> b t (k g) d", b=b)


def _prefix_attention_by_row(q, k, v, mask, prefix_k, prefix_v):
    """CPU path with a prefix: one batch row at a time, its own keys appended to the prefix's, so
    the scores of a row ([heads, T, P + T]) stay in cache (on XLA:CPU several times faster than
    the batched form)."""
    p, t = prefix_k.shape[0], q.shape[1]

    def row(x):
        qr, kr, vr, mr = x
        kk = jnp.concatenate([prefix_k, kr], axis=0)[None]
        vv = jnp.concatenate([prefix_v, vr], axis=0)[None]
        m = jnp.concatenate([jnp.ones((t, p), bool), mr], axis=-1)
        return jax.nn.dot_product_attention(qr[None], kk, vv, mask=m[None, None])[0]

    return jax.lax.map(row, (q, k, v, mask))


def project_qkv(cfg: Qwen3Config, lp: Layer, x, rot):
    """Queries, keys and values of one block for x: [B, T, H] (attention norm, one GEMM, per-head
    q/k RMSNorm, then RoPE from `rot`). Returns q [B, T, N, D], k and v [B, T, K, D]; shared by
    encoding (`decoder_layer`) and decoding (`llm_jax.decode`)."""
    eps = cfg.rms_norm_eps
    h = rms_norm(x, lp.attn_norm, eps)
    b, t, _ = x.shape
    nd, kd = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    # One GEMM for q, k, v and one for gate, up: fewer, larger GEMMs than five.
    qkv = jnp.einsum("bth,hc->btc", h, lp.attn.qkv)
    q = rms_norm(qkv[..., :nd].reshape(b, t, cfg.num_heads, cfg.head_dim), lp.attn.q_norm, eps)
    k = rms_norm(qkv[..., nd:nd + kd].reshape(b, t, cfg.num_kv_heads, cfg.head_dim),
                 lp.attn.k_norm, eps)
    v = qkv[..., nd + kd:].reshape(b, t, cfg.num_kv_heads, cfg.head_dim)
    return rope(q, *rot), rope(k, *rot), v


class MixedMLP(NamedTuple):
    """A block's MLP where the scanned layers mix dense and sparse ones: both stacks, whether
    this block is sparse, and its index in its own stack (`scan_layers`)."""

    dense: DenseMLP  # [L_dense, ...]
    moe: MoE  # [L_sparse, ...]
    sparse: jax.Array  # [] bool
    index: jax.Array  # [] int32


def _at(stack, i):
    return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), stack)


def dense_mlp(mp: DenseMLP, h):
    """SwiGLU of h: [B, T, H] through mp (gate_up [H, 2F], down [F, H])."""
    gate, up = jnp.split(jnp.einsum("bth,hf->btf", h, mp.gate_up), 2, axis=-1)
    return jnp.einsum("btf,fh->bth", jax.nn.silu(gate) * up, mp.down)


def mlp_block(cfg: Qwen3Config, lp: Layer, x, valid=None, form: MoEForm = "auto"):
    """x + MLP(RMSNorm(x)) for x: [B, T, H]: the one place the MLP is computed, for encoding
    and decoding alike. lp.mlp is the block's MLP as `scan_layers` gives it: a `DenseMLP`, a
    `MoE` (`llm_jax.moe`), or a `MixedMLP` (chosen by `lax.cond`). valid: [B, T] bool, the
    positions counted in the load (default all). Returns (x, load): load [E] int32, the
    assignments to each expert (`moe.expert_load`) for a sparse block, zeros for a dense one
    among mixed blocks, None in a model without experts."""
    h = rms_norm(x, lp.mlp_norm, cfg.rms_norm_eps)
    mp = lp.mlp
    if isinstance(mp, MixedMLP):
        zero = jnp.zeros(cfg.num_experts, jnp.int32)
        y, load = jax.lax.cond(mp.sparse,
                               lambda: moe_mlp(cfg, _at(mp.moe, mp.index), h, valid, form),
                               lambda: (dense_mlp(_at(mp.dense, mp.index), h), zero))
    elif isinstance(mp, MoE):
        y, load = moe_mlp(cfg, mp, h, valid, form)
    else:
        y, load = dense_mlp(mp, h), None
    return x + y, load


def decoder_layer(cfg: Qwen3Config, lp: Layer, x, rot, mask, lengths, prefix_kv=None,
                  attn: AttentionConfig = AttentionConfig()):
    """One Qwen3 block. x: [B, T, H]; rot: (cos, sin) of `rope_tables`; mask, lengths, attn: as
    `attention` takes them.
    Returns (x, (k, v) of this block's own positions, expert load of `mlp_block`)."""
    q, k, v = project_qkv(cfg, lp, x, rot)
    a = attention(q, k, v, mask, lengths, *(prefix_kv or (None, None)), cfg=attn)
    x = x + jnp.einsum("btnd,ndh->bth", a, lp.attn.o)
    valid = jnp.arange(x.shape[1])[None] < lengths[:, None]  # [B, T]
    x, load = mlp_block(cfg, lp, x, valid, attn.moe_form)
    return x, (k, v), load


def scan_layers(cfg: Qwen3Config, params: Weights, n: int, step: Callable, carry, xs=None):
    """The one loop over blocks: step(carry, lp, x) -> (carry, y) over the first n blocks, lp a
    block's `Layer` with its MLP for `mlp_block`, x the block's part of xs (a leading axis n,
    or None); returns (carry, ys stacked).
    Stacked weights run under `lax.scan`: same-kind blocks scan their MLP stack alongside;
    mixed ones carry (sparse?, index in its stack) and close over both stacks (`MixedMLP`).
    The per-layer layout (`per_layer`) runs unrolled, each block on its own arrays; there xs
    may also be a list of n per-block items (a cache kept per layer)."""
    if isinstance(params.layers, tuple):
        ys = []
        for i, lp in enumerate(params.layers[:n]):
            x = (None if xs is None else xs[i] if isinstance(xs, list)
                 else jax.tree.map(lambda a: a[i], xs))
            carry, y = step(carry, lp, x)
            ys.append(y)
        return carry, jax.tree.map(_stack_blocks, *ys, is_leaf=lambda a: a is None)
    st: Stacked = params.layers
    sparse, index = mlp_rows(cfg, n)
    common = jax.tree.map(lambda a: a[:n], st.common)
    if sparse.all() or not sparse.any():
        mlp = jax.tree.map(lambda a: a[:n], st.moe if sparse.all() else st.dense)

        def same(c, a):
            (lp, mp), x = a
            return step(c, lp.replace(mlp=mp), x)

        return jax.lax.scan(same, carry, ((common, mlp), xs))

    def mixed(c, a):
        (lp, s, i), x = a
        return step(c, lp.replace(mlp=MixedMLP(st.dense, st.moe, s, i)), x)

    return jax.lax.scan(mixed, carry, ((common, jnp.asarray(sparse), jnp.asarray(index)), xs))


def _stack_blocks(*ys):
    """The unrolled blocks' outputs of one kind stacked, as a scan stacks them; a block with
    none where others have one (a dense block's expert load among sparse ones) gives zeros,
    as the scan's `MixedMLP` does."""
    like = next((y for y in ys if y is not None), None)
    if like is None:
        return None
    return jnp.stack([jnp.zeros_like(like) if y is None else y for y in ys])


def lm_logits(params: Weights, cfg: Qwen3Config, x) -> jax.Array:
    """Next-token logits [..., V] in float32 from final-normed states x: [..., H], through
    `lm_head` for untied models and the embedding for tied ones (products in the weights' dtype,
    accumulated in float32)."""
    w = params.embed if cfg.tie_word_embeddings else params.lm_head  # [V, H]
    return jnp.einsum("...h,vh->...v", x.astype(w.dtype), w, preferred_element_type=jnp.float32)


class HiddenStates(NamedTuple):
    """What `hidden_states` returns."""

    x: jax.Array  # [B, T, H] the residual stream after the asked layer
    kv: tuple[jax.Array, jax.Array] | None  # per-layer (k, v) [L, B, T, K, D] of own positions
    # [L_sparse, E] int32 among the computed layers: assignments of valid (non-padding) tokens
    # to each expert (k per token); None when no computed layer has experts (a dense model,
    # layer 0, or only dense layers before the asked one).
    expert_load: jax.Array | None


class Visual(NamedTuple):
    """What a vision-language model adds to a text pass (`llm_jax.vl_model`): the image tokens'
    embeddings at their positions, the rope tables of its 3-axis positions, and the DeepStack
    states added to the residual stream after the first S blocks (zeros at text positions)."""

    embeds: jax.Array  # [B, T, H], read where mask
    mask: jax.Array  # [B, T] bool: image-token positions
    rot: tuple[jax.Array, jax.Array]  # cos, sin [B, T, 1, D] (M-RoPE)
    deepstack: jax.Array  # [S, B, T, H]


def hidden_states(params: Weights, cfg: Qwen3Config, tokens, lengths, layer: int,
                  prefix: PrefixCache | None = None,
                  attn: AttentionConfig = AttentionConfig(),
                  visual: Visual | None = None) -> HiddenStates:
    """Residual stream after `layer` blocks (0 = embeddings). tokens: [B, T] right-padded,
    lengths: [B]. Only the first `layer` blocks are computed. `visual`: image tokens, their
    positions and DeepStack states (`llm_jax.vl_model`); with a `prefix` too (text before the
    first image, `llm_jax.vl_model.vl_prefill`), its positions are the rows' own, continuing
    the prefix's."""
    if not 0 <= layer <= cfg.num_layers:
        raise ValueError(f"layer={layer} must lie in 0..{cfg.num_layers}")
    t = tokens.shape[1]
    x = params.embed[tokens]
    if visual is not None:  # (its rope tables hold the rows' positions, after any prefix)
        x = jnp.where(visual.mask[..., None], visual.embeds.astype(x.dtype), x)
    offset = 0 if prefix is None else prefix.k.shape[1]
    pos = (offset + jnp.arange(t))[None]  # [1, T]: the same for every row
    own = jnp.arange(t)
    # Causal; keys past a row's length are masked too (queries there are padding anyway).
    mask = (own[None, :, None] >= own[None, None, :]) & (own[None, None, :] < lengths[:, None, None])
    if layer == 0:
        return HiddenStates(x, None, None)
    if prefix is not None and prefix.k.shape[0] < layer:
        raise ValueError(f"prefix cache holds {prefix.k.shape[0]} layers, layer={layer} asked")

    rot = rope_tables(pos, cfg.head_dim, cfg.rope_theta, x.dtype) if visual is None \
        else visual.rot
    deep = None if visual is None or not visual.deepstack.shape[0] else visual.deepstack

    def block(x, lp, a):
        pkv, i = a
        x, kv, load = decoder_layer(cfg, lp, x, rot, mask, lengths, pkv, attn)
        if deep is not None:
            # HF: after decoder layer i < S the image positions get DeepStack state i; its
            # hidden_states[i + 1] is recorded before that (so the last block asked skips it),
            # except the last layer's, which the final norm then reads
            s = deep.shape[0]
            add = jax.lax.dynamic_index_in_dim(deep, jnp.minimum(i, s - 1), keepdims=False)
            keep = (i < layer - 1) | (layer == cfg.num_layers)
            x = jnp.where((i < s) & keep, x + add.astype(x.dtype), x)
        return x, (kv, load)

    pkv = None if prefix is None else (prefix.k[:layer], prefix.v[:layer])
    x, (kv, load) = scan_layers(cfg, params, layer, block, x, (pkv, jnp.arange(layer)))
    sparse = np.flatnonzero(cfg.sparse_layers[:layer])
    if load is not None and len(sparse) < layer:  # mixed: keep the sparse layers' rows
        load = load[sparse]
    return HiddenStates(x, kv, load)


def encode(params: Weights, cfg: Qwen3Config, tokens, lengths, layer: int,
           pool: Literal["last", "mean", "none"] = "last", post_norm: bool = False,
           prefix: PrefixCache | None = None,
           attn: AttentionConfig = AttentionConfig(), expert_load: bool = False):
    """Hidden state at `layer` (HF convention: 0 = embeddings, i = after block i, pre-norm;
    `post_norm` applies the final RMSNorm, equal to HF's hidden_states[num_layers] at the last
    layer). tokens: [B, T] right-padded; lengths: [B] (>= 1). With `prefix`, tokens continue the
    cached prompt; `attn` chooses the attention form. Returns [B, H] for pool last/mean,
    [B, T, H] for none; with `expert_load`, (that, the router load of `HiddenStates`)."""
    x, _, load = hidden_states(params, cfg, tokens, lengths, layer, prefix, attn)
    pooled = pool_hidden(params, cfg, x, lengths, pool, post_norm)
    return (pooled, load) if expert_load else pooled


def pool_hidden(params: Weights, cfg: Qwen3Config, x, lengths, pool: str, post_norm: bool):
    """States x [B, T, H] of right-padded rows (lengths [B]), after the final norm with
    `post_norm`, pooled as `encode` pools them."""
    if post_norm:
        x = rms_norm(x, params.final_norm, cfg.rms_norm_eps)
    if pool == "none":
        return x
    if pool == "last":
        return x[jnp.arange(x.shape[0]), lengths - 1]
    if pool == "mean":
        valid = (jnp.arange(x.shape[1])[None] < lengths[:, None]).astype(jnp.float32)
        total = jnp.einsum("bth,bt->bh", x.astype(jnp.float32), valid)
        return (total / lengths[:, None]).astype(x.dtype)
    raise ValueError(f"pool={pool!r}; use last, mean or none")


def prefill(params: Weights, cfg: Qwen3Config, prefix_tokens, num_layers: int | None = None,
            attn: AttentionConfig = AttentionConfig()) -> PrefixCache:
    """Keys/values of a shared prefix for the first `num_layers` layers (default all).
    prefix_tokens: [P]."""
    n = cfg.num_layers if num_layers is None else num_layers
    tokens = prefix_tokens[None]
    _, (k, v), _ = hidden_states(params, cfg, tokens, jnp.array([tokens.shape[1]]), n,
                                 attn=attn)
    return PrefixCache(k[:, 0], v[:, 0])
