"""Running mean / variance of hidden states across envs and steps (Chan et al.'s parallel merge),
kept in the checkpointed state so a resumed run normalises as the uninterrupted one would."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class RunningNorm:
    count: jax.Array  # []
    mean: jax.Array  # [H]
    var: jax.Array  # [H]


def init_norm(h: int) -> RunningNorm:
    return RunningNorm(jnp.zeros(()), jnp.zeros(h), jnp.ones(h))


def update_norm(n: RunningNorm, x, weight, axis_name=None) -> RunningNorm:
    """Merge a batch x [B, H] with per-row weights [B] (0/1) into the running moments
    (batch moments summed over devices when sharded, so every device keeps the same stats)."""
    psum = (lambda v: jax.lax.psum(v, axis_name)) if axis_name else (lambda v: v)
    w = weight.astype(jnp.float32)
    m = psum(w.sum())
    safe = jnp.maximum(m, 1.0)
    bmean = psum((w[:, None] * x).sum(0)) / safe
    bvar = psum((w[:, None] * (x - bmean) ** 2).sum(0)) / safe
    total = n.count + m
    frac = m / jnp.maximum(total, 1.0)
    delta = bmean - n.mean
    mean = n.mean + frac * delta
    var = jnp.where(n.count > 0, (n.count * n.var + m * bvar) / jnp.maximum(total, 1.0)
                    + delta ** 2 * n.count * m / jnp.maximum(total, 1.0) ** 2, bvar)
    keep = m > 0
    return RunningNorm(total, jnp.where(keep, mean, n.mean), jnp.where(keep, var, n.var))


def normalize(n: RunningNorm, x: jax.Array) -> jax.Array:
    """x [..., H] in units of the running standard deviation around the running mean."""
    return (x - n.mean) / jnp.sqrt(n.var + 1e-6)
