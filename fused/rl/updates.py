"""A chunk of training updates as one scan, shared by PPO (`fused.rl.trainer`) and AWR / BC
(`fused.rl.awr`): updates past the end of the run are skipped, so the last chunk runs the same
program as the others."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp


def scan_updates(update: Callable, state, args: Any, length: int,
                 active: Callable) -> tuple[Any, Any]:
    """`length` steps of `update(state, args) -> (state, metrics)`, each run while
    `active(state)` holds; a skipped step keeps the state and reports zero metrics.

    The update is traced once: the skipped branch needs the metrics' shapes, and asking them
    of one closure while the branch runs another traced the update twice (a whole PPO update,
    env step included: about a second of every run's start on a CPU). The shapes and the
    branch share one `jax.jit` of it, and so its trace; XLA inlines the call."""
    step = jax.jit(update)

    def body(s, _):
        zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(step, s, args)[1])
        return jax.lax.cond(active(s), lambda s: step(s, args), lambda s: (s, zeros), s)

    return jax.lax.scan(body, state, None, length=length)
