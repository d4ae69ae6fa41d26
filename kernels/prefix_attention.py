"""Shared-prefix attention: queries of B rows attend to ONE prefix (keys/values shared by every
row) and causally to their own keys, with grouped-query heads and ragged row lengths.

    out = prefix_attention(q, k, v, lengths, prefix_k, prefix_v)
    q [B, T, N, D]; k, v [B, T, K, D] (N = G * K query heads, G per kv head); lengths [B];
    prefix_k, prefix_v [P, K, D] (P >= 0). Query t < lengths[b] of row b sees all P prefix keys
    and its row's keys 0..t; queries at t >= lengths[b] are padding and return zeros.

`prefix_attention_reference` is the plain-jnp definition (one softmax over the concatenated
scores). `prefix_attention` is a Pallas kernel with an online softmax (flash attention): one
program per (row, kv head, block of queries) holds the block's G query heads together, reads the
prefix keys/values once per block from the shared [K, P, D] array (never copied per row), then
its own keys up to the block's causal end; products in the input dtype, accumulation and softmax
in float32. Any P (the last prefix block is masked) and any T (padded to the query block).
`interpret=True` runs it through Pallas' interpreter (CPU, tests); without it, it lowers for the
GPU (Triton) where Pallas supports it. This module imports neither llm_jax nor fused.
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
            prefix_len: int, prefix_blocks: int, groups: int):
    qi = pl.program_id(2)
    length = len_ref[0]
    q = q_ref[...]  # [bq, G, D]
    bq, g, d = q.shape
    q2 = q.reshape(bq * g, d)
    scale = d ** -0.5
    pos = qi * block_q + jnp.arange(bq * g) // g  # query position of each (query, head) row

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

    def prefix_block(j, carry):
        kb = pk_ref[pl.ds(j * block_k, block_k), :]  # [bk, D]
        vb = pv_ref[pl.ds(j * block_k, block_k), :]
        s = jnp.dot(q2, kb.T, preferred_element_type=jnp.float32)
        kpos = j * block_k + jnp.arange(block_k)
        return update(carry, s, (kpos < prefix_len)[None, :], vb)

    def own_block(j, carry):
        kb = k_ref[pl.ds(j * block_k, block_k), :]
        vb = v_ref[pl.ds(j * block_k, block_k), :]
        s = jnp.dot(q2, kb.T, preferred_element_type=jnp.float32)
        kpos = j * block_k + jnp.arange(block_k)
        valid = (kpos[None, :] <= pos[:, None]) & (kpos[None, :] < length)
        return update(carry, s, valid, vb)

    carry = (jnp.full((bq * g,), NEG, jnp.float32), jnp.zeros((bq * g,), jnp.float32),
             jnp.zeros((bq * g, d), jnp.float32))
    carry = jax.lax.fori_loop(0, prefix_blocks, prefix_block, carry)
    own_end = jnp.minimum((qi + 1) * block_q, length)  # keys past both are never seen
    carry = jax.lax.fori_loop(0, pl.cdiv(own_end, block_k), own_block, carry)
    _, l, acc = carry
    out = jnp.where((l > 0)[:, None], acc / jnp.where(l > 0, l, 1.0)[:, None], 0.0)
    out = jnp.where((pos < length)[:, None], out, 0.0)
    o_ref[...] = out.reshape(bq, g, d).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("block_q", "block_k", "interpret"))
def prefix_attention(q, k, v, lengths, prefix_k, prefix_v, *, block_q: int = 64,
                     block_k: int = 64, interpret: bool = False):
    """The Pallas kernel (see the module docstring); same arguments and result as
    `prefix_attention_reference`."""
    b, t, n, d = q.shape
    kh = k.shape[2]
    g = n // kh
    p = prefix_k.shape[0]
    block_q = min(block_q, pl.next_power_of_2(t))
    t_pad = pl.cdiv(t, block_q) * block_q
    t_pad = pl.cdiv(t_pad, block_k) * block_k  # own keys are read in blocks of block_k too
    p_pad = max(pl.cdiv(p, block_k), 1) * block_k
    pad_t = ((0, 0), (0, t_pad - t), (0, 0), (0, 0))
    # head-major layouts: each program reads contiguous [positions, D] slabs of one kv head
    qh = jnp.pad(q, pad_t).reshape(b, t_pad, kh, g, d).transpose(0, 2, 1, 3, 4)  # [B,K,T,G,D]
    kt = jnp.pad(k, pad_t).transpose(0, 2, 1, 3)  # [B, K, T, D]
    vt = jnp.pad(v, pad_t).transpose(0, 2, 1, 3)
    pk = jnp.pad(prefix_k, ((0, p_pad - p), (0, 0), (0, 0))).transpose(1, 0, 2)  # [K, P, D]
    pv = jnp.pad(prefix_v, ((0, p_pad - p), (0, 0), (0, 0))).transpose(1, 0, 2)
    kernel = functools.partial(_kernel, block_q=block_q, block_k=block_k, prefix_len=p,
                               prefix_blocks=p_pad // block_k, groups=g)
    out = pl.pallas_call(
        kernel,
        grid=(b, kh, t_pad // block_q),
        in_specs=[
            pl.BlockSpec((1,), lambda i, h, j: (i,)),
            pl.BlockSpec((None, None, block_q, g, d), lambda i, h, j: (i, h, j, 0, 0)),
            pl.BlockSpec((None, None, t_pad, d), lambda i, h, j: (i, h, 0, 0)),
            pl.BlockSpec((None, None, t_pad, d), lambda i, h, j: (i, h, 0, 0)),
            pl.BlockSpec((None, p_pad, d), lambda i, h, j: (h, 0, 0)),
            pl.BlockSpec((None, p_pad, d), lambda i, h, j: (h, 0, 0)),
        ],
        out_specs=pl.BlockSpec((None, None, block_q, g, d), lambda i, h, j: (i, h, j, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((b, kh, t_pad, g, d), q.dtype),
        interpret=interpret,
    )(lengths.astype(jnp.int32), qh, kt, vt, pk, pv)
    return out.transpose(0, 2, 1, 3, 4).reshape(b, t_pad, n, d)[:, :t]
