"""`jax.random.choice` with probabilities, drawing the same values without a loop.

`jax.random.choice(key, a, shape, p=p)` (replace=True) is a cumulative sum, one uniform draw and
`jnp.searchsorted`, whose default form is a binary search in a `lax.scan`: a while loop of
ceil(log2(n + 1)) iterations (13 for a 64 x 64 map), several kernels and copies each on a GPU.
`choice` runs the same binary search unrolled: the same comparisons in the same order, so the
same index even where a float cumulative sum is not monotone (XLA sums blocks, then blocks of
block totals: an ulp can go back at a block's edge), each level's bounds computed once
(`fence`)."""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp
# jnp.searchsorted's own comparison (a total order: NaN last, -0 before 0); private, so
# tests/test_fast_step.py checks `search_left` against jnp.searchsorted.
from jax._src.lax.lax import _sort_le_comparator

from fused.envs.grid import fence


def search_left(sorted_arr: jax.Array, query: jax.Array) -> jax.Array:
    """== `jnp.searchsorted(sorted_arr, query)` (side left, method scan) for a scalar query:
    jax's binary search, unrolled. -> int32."""
    n = sorted_arr.shape[0]
    low, high = jnp.uint32(0), jnp.uint32(n)
    for _ in range(int(np.ceil(np.log2(n + 1)))):
        mid = low + (high - low) // 2
        go_left = _sort_le_comparator(query, sorted_arr[mid])
        low, high = fence((jax.lax.select(go_left, low, mid), jax.lax.select(go_left, mid, high)))
    return high.astype(jnp.int32)


def choice(key: jax.Array, a: jax.Array, p: jax.Array, shape: tuple[int, ...] = ()):
    """== `jax.random.choice(key, a, shape, replace=True, p=p)` for a 1-D `a`."""
    p_cuml = jnp.cumsum(p)
    r = p_cuml[-1] * (1 - jax.random.uniform(key, shape, dtype=p_cuml.dtype))
    ind = search_left(p_cuml, r.reshape(-1)[0]) if r.size == 1 else \
        jax.vmap(search_left, (None, 0))(p_cuml, r.reshape(-1))
    return jnp.take(a, ind.astype(int), 0).reshape(shape)
