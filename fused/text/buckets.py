"""Padded lengths for token sequences of varying length: each length compiled once, a call
runs the smallest that holds its longest row (`at_smallest_fit`), so padding does not make every
call cost the worst case. One home for the policy: observation packing (`fused.text.render`),
encoding (`encode_buckets`) and generation (`coarse_buckets`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

PACK_SIZES = (128, 256, 512)  # packing widths of observations tried before L_max


def at_smallest_fit(sizes, need, branch, *operands):
    """`branch(size)(*operands)` for the smallest of `sizes` (ascending; the last one is the
    bound) that is >= `need`, a traced scalar: every size is compiled, only one runs."""
    which = jnp.sum(need > jnp.array(sizes[:-1]))
    return jax.lax.switch(which, [branch(s) for s in sizes], *operands)


def pack_sizes(bound: int) -> tuple[int, ...]:
    """Widths an observation batch is packed at: PACK_SIZES below the renderer's bound, then
    the bound."""
    return tuple(s for s in PACK_SIZES if s < bound) + (bound,)


def encode_buckets(length: int, sizes: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """Padded lengths of an encoding micro-batch: steps of 64 up to 512, then doubling, then
    the bound `length` (little padding; each size is compiled at every call site of a fused
    program); `sizes` (ascending) below the bound instead, when given."""
    if sizes:
        return tuple(s for s in sizes if s < length) + (length,)
    out, b = [], 64
    while b < length:
        out.append(b)
        b = b + 64 if b < 512 else b * 2
    return tuple(out) + (length,)


def coarse_buckets(total: int) -> tuple[int, ...]:
    """Padded prompt lengths for generation: a quarter, half and all of the bound (rounded up to
    64): three decode programs compiled, while a typical prompt (observations near a quarter of
    the renderer's worst case) pays for a quarter of the worst."""
    return tuple(sorted({min(total, -(-total * k // 4 // 64) * 64) for k in (1, 2, 4)}))
