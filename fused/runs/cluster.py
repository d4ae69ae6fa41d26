"""Several hosts through JAX's own multi-process runtime, `jax.distributed`, configured from the
environment: JAX_COORDINATOR_ADDRESS (host:port of process 0), JAX_NUM_PROCESSES and
JAX_PROCESS_ID, or a SLURM job of several tasks (JAX reads its variables itself). CPU processes
use gloo collectives."""

from __future__ import annotations

import os


def initialize() -> bool:
    """Join the cluster described by the environment, if any; True when part of one."""
    env = os.environ
    slurm = int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in env
    if not env.get("JAX_COORDINATOR_ADDRESS") and not slurm:
        return False
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kw = {}
    if env.get("JAX_COORDINATOR_ADDRESS"):
        kw = {"coordinator_address": env["JAX_COORDINATOR_ADDRESS"],
              "num_processes": int(env["JAX_NUM_PROCESSES"]) if "JAX_NUM_PROCESSES" in env
              else None,
              "process_id": int(env["JAX_PROCESS_ID"]) if "JAX_PROCESS_ID" in env else None}
    jax.distributed.initialize(**kw)
    return True


def barrier(name: str) -> None:
    """Wait for every process (no-op alone)."""
    import jax

    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
