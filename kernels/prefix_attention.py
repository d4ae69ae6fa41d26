"""Shared-prefix attention: queries of B rows attend to ONE prefix (keys/values shared by every
row) and causally to their own keys, with grouped-query heads and ragged row lengths.

    out = prefix_attention(q, k, v, lengths, prefix_k, prefix_v)
    q [B, T, N, D]; k, v [B, T, K, D] (N = G * K query heads, G per kv head); lengths [B];
    prefix_k, prefix_v [P, K, D] (P >= 0). Query t < lengths[b] of row b sees all P prefix keys
    and its row's keys 0..t; queries at t >= lengths[b] are padding and return zeros.

`prefix_attention_reference` is the plain-jnp definition (one softmax over the concatenated
scores). `prefix_attention` is a Pallas kernel with an online softmax (flash attention). One
program per (block of rows, kv head, block of query positions) holds the queries of R rows x
block_q positions x the G query heads of one kv head together (R fills about `block_m` query
vectors when one row's short suffix does not: 32-token suffixes with G = 2 take 2 rows a
program), reads the prefix keys/values once for all of them from the shared [K, P, D] array
(never copied per row), then each row's own keys up to the block's causal end. Products in the
input dtype, accumulation and softmax in float32. Any P (the last prefix block is masked), any T
(padded to the query block), any B (padded to R rows, padding rows have length 0).
`interpret=True` runs it through Pallas' interpreter (CPU, tests); otherwise it lowers through
Triton on CUDA/ROCm GPUs (`lowers_for` checks that without a GPU) and through Pallas' default
elsewhere. This module imports neither llm_jax nor fused.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

NEG = -1e30  # finite "minus infinity": masked entries never make NaNs in the running max


def prefix_attention_reference(q, k, v, lengths, prefix_k, prefix_v):
    """The definition, written plainly: scores over [prefix keys, own keys], masked, softmax."""
    b, t, n, d = q.shape
    kh = k.shape[2]
    g = n // kh
    p = prefix_k.shape[0]
    f32 = jnp.float32
    keys = jnp.concatenate([jnp.broadcast_to(prefix_k, (b, p, kh, d)), k], axis=1)  # [B, S, K, D]
    vals = jnp.concatenate([jnp.broadcast_to(prefix_v, (b, p, kh, d)), v], axis=1)
    keys = jnp.repeat(keys, g, axis=2).astype(f32)  # query head h uses kv head h // g
    vals = jnp.repeat(vals, g, axis=2).astype(f32)
    s = jnp.einsum("btnd,bsnd->bnts", q.astype(f32), keys) * d ** -0.5
    own = jnp.arange(t)
    sees = jnp.concatenate([jnp.ones((t, p), bool), own[None, :] <= own[:, None]], axis=1)
    sees = sees[None] & (jnp.arange(p + t)[None, None, :] < (p + lengths)[:, None, None])
    s = jnp.where(sees[:, None], s, -jnp.inf)
    out = jnp.einsum("bnts,bsnd->btnd", jax.nn.softmax(s, axis=-1), vals)
    valid = jnp.arange(t)[None, :] < lengths[:, None]
    return jnp.where(valid[:, :, None, None], out, 0.0).astype(q.dtype)


def _kernel(len_ref, q_ref, k_ref, v_ref, pk_ref, pv_ref, o_ref, *, block_q: int, block_k: int,
            prefix_len: int, prefix_blocks: int):
    qi = pl.program_id(2)
    q = q_ref[...]  # [R, bq, G, D]
    rows, bq, g, d = q.shape
    per_row = bq * g
    q2 = q.reshape(rows * per_row, d)
    scale = d ** -0.5
    i = jnp.arange(rows * per_row)
    row = i // per_row  # the row (within the block) of each (row, query, head) vector
    pos = qi * block_q + (i % per_row) // g  # its query position
    lengths = [len_ref[r] for r in range(rows)]
    length = functools.reduce(lambda acc, r: jnp.where(row == r, lengths[r], acc),
                              range(rows), jnp.zeros_like(row))

    def update(carry, s, valid, vb):
        m, l, acc = carry
        s = jnp.where(valid, s * scale, NEG)
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.where(valid, jnp.exp(s - m_new[:, None]), 0.0)
        alpha = jnp.exp(m - m_new)
        l = alpha * l + p.sum(axis=-1)
        acc = alpha[:, None] * acc + jnp.dot(p.astype(vb.dtype), vb,
                                              preferred_element_type=jnp.float32)
        return m_new, l, acc

    def prefix_block(j, carry):  # one read of a prefix block serves all R rows' queries
        kb = pk_ref[pl.ds(j * block_k, block_k), :]  # [bk, D]
        vb = pv_ref[pl.ds(j * block_k, block_k), :]
        s = jnp.dot(q2, kb.T, preferred_element_type=jnp.float32)
        kpos = j * block_k + jnp.arange(block_k)
        return update(carry, s, (kpos < prefix_len)[None, :], vb)

    def own_blocks(r, carry):
        def own_block(j, carry):
            kb = k_ref[r, pl.ds(j * block_k, block_k), :]
            vb = v_ref[r, pl.ds(j * block_k, block_k), :]
            s = jnp.dot(q2, kb.T, preferred_element_type=jnp.float32)
            kpos = j * block_k + jnp.arange(block_k)
            valid = ((row == r)[:, None] & (kpos[None, :] <= pos[:, None])
                     & (kpos[None, :] < lengths[r]))
            return update(carry, s, valid, vb)

        own_end = jnp.minimum((qi + 1) * block_q, lengths[r])  # keys past both are never seen
        return jax.lax.fori_loop(0, pl.cdiv(own_end, block_k), own_block, carry)

    n = rows * per_row
    carry = (jnp.full((n,), NEG, jnp.float32), jnp.zeros((n,), jnp.float32),
             jnp.zeros((n, d), jnp.float32))
    carry = jax.lax.fori_loop(0, prefix_blocks, prefix_block, carry)
    for r in range(rows):  # R is small and static: row r's own keys, seen by its queries only
        carry = own_blocks(r, carry)
    _, l, acc = carry
    out = jnp.where((l > 0)[:, None], acc / jnp.where(l > 0, l, 1.0)[:, None], 0.0)
    out = jnp.where((pos < length)[:, None], out, 0.0)
    o_ref[...] = out.reshape(rows, bq, g, d).astype(o_ref.dtype)


def _gpu_params(platform: str):
    """Pallas lowers GPU kernels through Mosaic GPU by default (Hopper and newer, warpgroup-sized
    copies); this kernel is written for the Triton backend, which covers every CUDA and ROCm
    GPU."""
    from jax.experimental.pallas import triton as pltriton

    return pltriton.CompilerParams(num_warps=4, num_stages=2) if platform == "gpu" else None


@functools.partial(jax.jit, static_argnames=("block_q", "block_k", "block_m", "interpret"))
def prefix_attention(q, k, v, lengths, prefix_k, prefix_v, *, block_q: int = 64,
                     block_k: int = 64, block_m: int = 128, interpret: bool = False):
    """The Pallas kernel (see the module docstring); same arguments and result as
    `prefix_attention_reference`. block_q: query positions of one row a program holds; block_k:
    keys per step; block_m: query vectors a program aims to hold (rows are added while
    R x block_q x G stays within it)."""
    b, t, n, d = q.shape
    kh = k.shape[2]
    g = n // kh
    p = prefix_k.shape[0]
    block_q = min(block_q, pl.next_power_of_2(t))
    rows = max(1, min(block_m // (block_q * g), pl.next_power_of_2(b)))
    rows = 1 << (rows.bit_length() - 1)  # a power of two (Triton's block shapes)
    b_pad = pl.cdiv(b, rows) * rows
    t_pad = pl.cdiv(t, block_q) * block_q
    t_pad = pl.cdiv(t_pad, block_k) * block_k  # own keys are read in blocks of block_k too
    p_pad = max(pl.cdiv(p, block_k), 1) * block_k
    pad = ((0, b_pad - b), (0, t_pad - t), (0, 0), (0, 0))
    # head-major layouts: each program reads contiguous [positions, D] slabs of one kv head
    qh = jnp.pad(q, pad).reshape(b_pad, t_pad, kh, g, d).transpose(0, 2, 1, 3, 4)  # [B,K,T,G,D]
    kt = jnp.pad(k, pad).transpose(0, 2, 1, 3)  # [B, K, T, D]
    vt = jnp.pad(v, pad).transpose(0, 2, 1, 3)
    pk = jnp.pad(prefix_k, ((0, p_pad - p), (0, 0), (0, 0))).transpose(1, 0, 2)  # [K, P, D]
    pv = jnp.pad(prefix_v, ((0, p_pad - p), (0, 0), (0, 0))).transpose(1, 0, 2)
    lens = jnp.pad(lengths.astype(jnp.int32), (0, b_pad - b))  # padding rows: length 0
    kernel = functools.partial(_kernel, block_q=block_q, block_k=block_k, prefix_len=p,
                               prefix_blocks=p_pad // block_k)

    def call(platform: str | None):
        return pl.pallas_call(
            kernel,
            grid=(b_pad // rows, kh, t_pad // block_q),
            in_specs=[
                pl.BlockSpec((rows,), lambda i, h, j: (i,)),
                pl.BlockSpec((rows, None, block_q, g, d), lambda i, h, j: (i, h, j, 0, 0)),
                pl.BlockSpec((rows, None, t_pad, d), lambda i, h, j: (i, h, 0, 0)),
                pl.BlockSpec((rows, None, t_pad, d), lambda i, h, j: (i, h, 0, 0)),
                pl.BlockSpec((None, p_pad, d), lambda i, h, j: (h, 0, 0)),
                pl.BlockSpec((None, p_pad, d), lambda i, h, j: (h, 0, 0)),
            ],
            out_specs=pl.BlockSpec((rows, None, block_q, g, d),
                                   lambda i, h, j: (i, h, j, 0, 0)),
            out_shape=jax.ShapeDtypeStruct((b_pad, kh, t_pad, g, d), q.dtype),
            interpret=interpret,
            compiler_params=None if interpret or platform is None else _gpu_params(platform),
        )(lens, qh, kt, vt, pk, pv)

    if interpret:
        out = call(None)
    else:  # each platform lowers its own branch only
        out = jax.lax.platform_dependent(cuda=lambda: call("gpu"), rocm=lambda: call("gpu"),
                                         default=lambda: call(None))
    return out.transpose(0, 2, 1, 3, 4).reshape(b_pad, t_pad, n, d)[:b, :t]


def lowers_for(platform: str, *args, **kw) -> str:
    """The kernel lowered for `platform` ("cuda", "rocm", "tpu") on any machine, with
    `jax.export`: the Pallas backend's lowering (what rejects unsupported blocks and ops) runs,
    the device compiler does not. Returns the StableHLO text (raises on failure)."""
    from jax import export

    checks = [export.DisabledSafetyCheck.custom_call(t) for t in (
        "__gpu$xla.gpu.triton", "tpu_custom_call")]  # the kernel's calls on GPU and TPU
    fn = jax.jit(functools.partial(prefix_attention, **kw))
    return export.export(fn, platforms=(platform,), disabled_checks=checks)(*args).mlir_module()
