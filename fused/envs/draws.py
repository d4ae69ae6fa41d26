"""`jax.random.choice` with probabilities, drawing the same values without a loop.

`jax.random.choice(key, a, shape, p=p)` (replace=True) is a cumulative sum, one uniform draw and
`jnp.searchsorted`, whose default form is a binary search in a `lax.scan`: a while loop of
ceil(log2(n + 1)) iterations (13 for a 64 x 64 map), several kernels and copies each on a GPU.
`choice` runs the same binary search unrolled: the same comparisons in the same order, so the
same index even where a float cumulative sum is not monotone (XLA sums blocks, then blocks of
block totals: an ulp can go back at a block's edge), each level's bounds computed once
(`fence`), reading the cumulative sum only where the search looks (`RunningSums`)."""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
# jnp.searchsorted's own comparison (a total order: NaN last, -0 equal to 0); private, so
# tests/test_fast_step.py checks `search_left` against jnp.searchsorted.
from jax._src.lax.lax import _sort_le_comparator

from fused.envs.grid import fence


def _narrow(go_left, low, mid, high):
    return jax.lax.select(go_left, low, mid), jax.lax.select(go_left, mid, high)


def _narrow_carrying(go_left, low, mid, high, upto, before_mid):
    return (*_narrow(go_left, low, mid, high), jax.lax.select(go_left, upto, before_mid))


def search_left(value_at, n: int, query: jax.Array) -> jax.Array:
    """== `jnp.searchsorted(a, query)` (side left, method scan) for a scalar query, `a` [n]
    read through `value_at(i)`: jax's binary search, unrolled. -> int32. On a CPU each level's
    bounds are computed once (`fence`); elsewhere (a GPU) the levels are left to fuse into one
    kernel, which computes each bound once itself (the lowering platform picks)."""
    low, high = jnp.uint32(0), jnp.uint32(n)
    for _ in range(int(np.ceil(np.log2(n + 1)))):
        mid = low + (high - low) // 2
        go_left = _sort_le_comparator(query, value_at(mid))
        low, high = jax.lax.platform_dependent(
            go_left, low, mid, high, cpu=lambda *a: fence(_narrow(*a)), default=_narrow)
    return high.astype(jnp.int32)


BASE = 16  # XLA's ReduceWindowRewriter: a scan longer than this is done in blocks of 16


class RunningSums:
    """`jnp.cumsum(x)` of a 1-D float vector, bit for bit, read where asked (`at(i)`).

    XLA rewrites a long cumulative sum (a reduce-window) into blocks of 16: each block's running
    sums (a left fold from 0), the running sums of the block totals (the same rewrite one level
    up), each block's sums plus the sum of the blocks before it. On a CPU, XLA computes every
    element's window anew (16 adds each). A binary search reads 13 of the 4,096; here the block
    totals are one pass (15 adds a block), their running sums jnp.cumsum's own, and an element
    read is its block's fold up to it plus the blocks before. tests/test_fast_step.py checks
    every element against jnp.cumsum. Not on a CPU (unchecked there), or for a length that is not
    a multiple of 16 * 16: x's jnp.cumsum, read."""

    def __init__(self, x: jax.Array):
        n = x.shape[0]
        self.x = x
        self.blocked = jax.default_backend() == "cpu" and n % (BASE * BASE) == 0
        if not self.blocked:
            self.sums = jnp.cumsum(x)
            return
        # The folds add slices that keep their axis and reshape once at the end (`grid.link`).
        rows = x.reshape(n // BASE, BASE)
        total = jnp.zeros((n // BASE, 1), x.dtype)
        for k in range(BASE):
            total = total + rows[:, k:k + 1]
        total = total.reshape(n // BASE)
        self.before = jnp.concatenate([jnp.zeros((1,), x.dtype), jnp.cumsum(total)[:-1]])

    def at(self, i: jax.Array) -> jax.Array:
        if not self.blocked:
            return self.sums[i]
        block, lane = i // BASE, i % BASE
        row = jax.lax.dynamic_slice(self.x, (block * BASE,), (BASE,))
        acc = jnp.zeros((1,), self.x.dtype)
        for k in range(BASE):
            acc = jax.lax.select(k <= lane, acc + row[k:k + 1], acc)
        return acc.reshape(()) + self.before[block]

    def search_left(self, query: jax.Array) -> jax.Array:
        """== `search_left(self.at, n, query)`, each level's read cheaper. For n = 16 * 2**k, the
        search's first k levels read the first element of a block (its fold: 0 + x, plus the
        blocks before), and the last five levels read within the one block they narrowed to
        [low, high): the block's fold up to `low` is carried, so a read at mid adds the elements
        from low to mid to it (the fold's own adds, in its order)."""
        n = self.x.shape[0]
        aligned = n // BASE
        if not self.blocked or aligned & (aligned - 1):
            return search_left(self.at, n, query)
        k, zero = aligned.bit_length() - 1, jnp.zeros((1,), self.x.dtype)  # [1]: see __init__
        low, high, upto = jnp.uint32(0), jnp.uint32(n), zero  # upto: the fold before low
        for level in range(int(np.ceil(np.log2(n + 1)))):
            width = (n >> level) // 2  # mid - low: the same on every path
            mid = low + width
            if level < k:  # mid is a block's first element
                value = (zero[0] + self.x[mid]) + self.before[mid // BASE]
                before_mid = zero
            else:
                run = jax.lax.dynamic_slice(self.x, (low,), (width + 1,))  # x[low..mid]
                fold = upto
                for j in range(width + 1):
                    before_mid = fold
                    fold = fold + run[j:j + 1]
                value = fold.reshape(()) + self.before[mid // BASE]
            go_left = _sort_le_comparator(query, value)
            low, high, upto = jax.lax.platform_dependent(
                go_left, low, mid, high, upto, before_mid,
                cpu=lambda *a: fence(_narrow_carrying(*a), floats=True),
                default=_narrow_carrying)
        return high.astype(jnp.int32)


def choice(key: jax.Array, a: jax.Array, p: jax.Array, shape: tuple[int, ...] = ()):
    """== `jax.random.choice(key, a, shape, replace=True, p=p)` for a 1-D `a`."""
    n = p.shape[0]
    p_cuml = RunningSums(p)
    r = p_cuml.at(jnp.uint32(n - 1)) * (1 - jax.random.uniform(key, shape, dtype=p.dtype))
    ind = jnp.stack([p_cuml.search_left(q) for q in r.reshape(-1)])
    return jnp.take(a, ind.astype(int), 0).reshape(shape)
