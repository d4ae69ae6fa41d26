"""Grouped matmul by tiles: row tile i of x times the weights of its group, all tiles in one
kernel launch (a mixture-of-experts layer's experts: groups are experts, rows their tokens).

    out = grouped_matmul(x, w, tile_group, tile=64)
    x [T * tile, K]; w [G, K, N]; tile_group [T] int32, the group of each tile of `tile` rows,
    or -1 for a tile that is not in use (its rows of `out` are zeros, and no weight is read).

`grouped_matmul_reference` is the plain-jnp definition. `grouped_matmul` is a Pallas kernel: one
program per (tile, block of N columns) reads its group's [K, block_n] weights straight from `w`
in blocks of `block_k` rows (never copied out per tile, as XLA's dynamic slice of `w[g]` does in
a loop over tiles) and accumulates in float32; a tile not in use returns at once. Products in
the input dtype. Written for GPUs: it lowers through Triton on CUDA/ROCm, and `interpret=True`
runs it through Pallas' interpreter (CPU, tests); Pallas' CPU backend refuses it otherwise, and
on a TPU its weight block (every group's [K, block_n]) would not fit VMEM at real sizes. Where K
or N is not a multiple of its block, `w` is padded, a copy of all groups' weights a call (none
at Qwen3-30B-A3B's shapes). This module imports neither llm_jax nor fused.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def grouped_matmul_reference(x, w, tile_group, tile: int):
    """The definition: each tile's rows times its group's weights (zeros for group -1)."""
    t = tile_group.shape[0]
    xt = x.reshape(t, tile, x.shape[-1])
    out = jnp.einsum("tmk,tkn->tmn", xt, w[jnp.maximum(tile_group, 0)],
                     preferred_element_type=jnp.float32)
    out = jnp.where((tile_group >= 0)[:, None, None], out, 0.0)
    return out.reshape(t * tile, -1).astype(x.dtype)


def _kernel(group_ref, x_ref, w_ref, o_ref, *, block_k: int, k_blocks: int):
    g = group_ref[0]

    @pl.when(g < 0)
    def _():
        o_ref[...] = jnp.zeros(o_ref.shape, o_ref.dtype)

    @pl.when(g >= 0)
    def _():
        def step(j, acc):
            xb = x_ref[:, pl.ds(j * block_k, block_k)]  # [tile, bk]
            wb = w_ref[g, pl.ds(j * block_k, block_k), :]  # [bk, bn] of group g
            return acc + jnp.dot(xb, wb, preferred_element_type=jnp.float32)

        acc = jax.lax.fori_loop(0, k_blocks, step,
                                jnp.zeros((x_ref.shape[0], o_ref.shape[1]), jnp.float32))
        o_ref[...] = acc.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("tile", "block_n", "block_k", "interpret"))
def grouped_matmul(x, w, tile_group, *, tile: int = 64, block_n: int = 128, block_k: int = 64,
                   interpret: bool = False):
    """The Pallas kernel (module docstring); same arguments and result as
    `grouped_matmul_reference`. K and N are padded to the blocks (Triton's block shapes are
    powers of two); `tile` must be one (16 or more on a GPU: Triton's smallest dot)."""
    for name, v in (("tile", tile), ("block_n", block_n), ("block_k", block_k)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name}={v}: a power of two (Triton's block shapes)")
    t = tile_group.shape[0]
    k, n = w.shape[1], w.shape[2]
    if x.shape != (t * tile, k):
        raise ValueError(f"x {x.shape}: ({t} tiles x {tile} rows, K={k}) for {t} tile groups "
                         f"and weights {w.shape}")
    block_n = min(block_n, pl.next_power_of_2(n))
    block_k = min(block_k, pl.next_power_of_2(k))
    k_pad, n_pad = pl.cdiv(k, block_k) * block_k, pl.cdiv(n, block_n) * block_n
    xp = jnp.pad(x, ((0, 0), (0, k_pad - k)))
    wp = jnp.pad(w, ((0, 0), (0, k_pad - k), (0, n_pad - n)))
    kernel = functools.partial(_kernel, block_k=block_k, k_blocks=k_pad // block_k)

    def call(platform: str | None):
        params = None
        if platform == "gpu" and not interpret:
            from jax.experimental.pallas import triton as pltriton

            params = pltriton.CompilerParams(num_warps=4, num_stages=2)
        return pl.pallas_call(
            kernel,
            grid=(t, n_pad // block_n),
            in_specs=[
                pl.BlockSpec((1,), lambda i, j: (i,)),
                pl.BlockSpec((tile, k_pad), lambda i, j: (i, 0)),
                pl.BlockSpec((w.shape[0], k_pad, block_n), lambda i, j: (0, 0, j)),
            ],
            out_specs=pl.BlockSpec((tile, block_n), lambda i, j: (i, j)),
            out_shape=jax.ShapeDtypeStruct((t * tile, n_pad), x.dtype),
            interpret=interpret, compiler_params=params,
        )(tile_group.astype(jnp.int32), xp, wp)

    if interpret:
        out = call(None)
    else:  # each platform lowers its own branch only
        out = jax.lax.platform_dependent(cuda=lambda: call("gpu"), rocm=lambda: call("gpu"),
                                         default=lambda: call(None))
    return out[:, :n]
