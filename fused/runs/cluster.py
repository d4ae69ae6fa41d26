"""Several processes (`jax.distributed`, joined by `fused.commands.process.join_cluster`)
waiting for one another."""

from __future__ import annotations

import jax
from jax.experimental import multihost_utils

from fused.runs.interrupts import stop_if_interrupted


def barrier(name: str) -> None:
    """Wait for every process (no-op alone). A safe point first: a process asked to stop must
    not wait for peers that stopped."""
    stop_if_interrupted()
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
