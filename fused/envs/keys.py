"""Craftax's PRNG keys with the hash unrolled: the same bits, no loop on a CPU.

Craftax's keys are raw uint32[2] threefry keys. On a CPU, jax lowers the threefry hash as a
5-iteration while loop (for compile time): every split and draw a loop, a few thunks and copies
of its carry each. `wrap` gives the same key under `UNROLLED`, a PRNG implementation whose split
and random bits are jax's threefry ones (partitionable form, jax's default) computed by jax's own
unrolled hash (the form jax lowers for a GPU); jax.random's draws (uniform, randint, choice)
built on them are jax's own code. tests/test_fast_step.py checks the bits against jax.random's.
Where this jax lacks the private functions used (they moved), keys stay raw: the same draws,
the loop kept."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fused.envs.grid import fence

try:  # (jax's own threefry pieces: private, stable over jax 0.4-0.11)
    from jax._src.random.prng import iota_2x32_shape
    from jax.extend.random import define_prng_impl
    from jax._src.random.threefry2x32 import (
        _threefry2x32_lowering, threefry_fold_in, threefry_seed)
except ImportError:  # pragma: no cover
    _threefry2x32_lowering = None


def _hash(k1, k2, x1, x2):
    return _threefry2x32_lowering(k1, k2, x1, x2, use_rolled_loops=False)


def _split(key: jax.Array, shape) -> jax.Array:
    k1, k2 = key
    counts1, counts2 = iota_2x32_shape(shape)
    bits1, bits2 = _hash(k1, k2, counts1, counts2)
    return jnp.stack([bits1, bits2], axis=bits1.ndim)


def _random_bits(key: jax.Array, bit_width: int, shape) -> jax.Array:
    k1, k2 = key
    counts1, counts2 = iota_2x32_shape(shape)
    bits1, bits2 = _hash(k1, k2, counts1, counts2)
    if bit_width == 64:
        return (bits1.astype(jnp.uint64) << jnp.uint64(32)) | bits2.astype(jnp.uint64)
    if bit_width == 32:
        return bits1 ^ bits2
    return (bits1 ^ bits2).astype({8: jnp.uint8, 16: jnp.uint16}[bit_width])


UNROLLED = None if _threefry2x32_lowering is None else define_prng_impl(
    key_shape=(2,), seed=threefry_seed, split=_split, random_bits=_random_bits,
    fold_in=threefry_fold_in, name="threefry2x32_unrolled", tag="fru")


def wrap(raw: jax.Array) -> jax.Array:
    """A raw threefry key (uint32[2], Craftax's) as an `UNROLLED` key: the same draws."""
    if UNROLLED is None:
        return raw
    if not jax.config.jax_threefry_partitionable:
        raise NotImplementedError("fused.envs.keys follows jax_threefry_partitionable=True")
    return jax.random.wrap_key_data(raw, impl=UNROLLED)


def unwrap(key: jax.Array) -> jax.Array:
    """Back to a raw uint32[2] key."""
    if UNROLLED is None:
        return key
    return jax.random.key_data(key)


def fence_keys(tree):
    """`fence` for a tree of `UNROLLED` keys (a chain of splits computed once)."""
    if UNROLLED is None:
        return fence(tree)
    data = fence(jax.tree.map(unwrap, tree))
    return jax.tree.map(lambda d: jax.random.wrap_key_data(d, impl=UNROLLED), data)
