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


def part_done(console, part: str | None, work: str, name: str) -> bool:
    """The end of a job's own work: with `--part` (an independent run doing a share), says so
    and returns True (the caller stops: the manifest waits for the run without --part); else
    waits for every process (`barrier(name)`) and returns False."""
    if part is not None:
        console.print(f"part {part} done ({work}); when every part is, run the same command "
                      "without --part to write the manifest")
        return True
    barrier(name)
    return False
