"""The settings every training run has, whatever it trains (train.py's PPO, offline.py's AWR /
BC): seed, run folder, resume, chunking, checkpoint cadence, plotting, wandb. Declared once here;
each command's config extends `RunSettings` with its own fields (the flags and config.json keys
stay flat: `--seed`, `--out-dir`, `--resume`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Annotated, Literal

import tyro

from fused.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class WandbConfig:
    mode: Literal["offline", "online", "disabled"] | None = None
    """wandb mode: offline (sync later with `wandb sync`), online, or disabled. Unset: wandb's
    own variables decide (WANDB_MODE; WANDB_DISABLED=true is disabled), offline where they are
    unset."""

    @property
    def resolved_mode(self) -> str:
        """The mode used: --wandb.mode, else wandb's environment variables, else offline."""
        if self.mode is not None:
            return self.mode
        if os.environ.get("WANDB_DISABLED", "").strip().lower() in ("true", "1", "yes"):
            return "disabled"
        mode = os.environ.get("WANDB_MODE", "").strip().lower()
        return {"dryrun": "offline", "run": "online"}.get(mode, mode) if mode in (
            "online", "offline", "disabled", "dryrun", "run") else "offline"
    project: str = "craftax-fused"
    """wandb project."""
    entity: str | None = None
    """wandb entity (team or user)."""


# A command's setting for how its loop programs launch their kernels on a GPU (llm_jax/graphs.py;
# the same three values as llm_jax.graphs.GRAPHS): one field of each command's config.
CudaGraphs = Annotated[Literal["loops", "unrolled", "default"], tyro.conf.arg(help=(
    "On a GPU, the loop programs' kernels launched as CUDA graphs: loops (loops and "
    "conditionals inside the graphs; a loop that slices at its counter runs from the host), "
    "unrolled (such loops unrolled too: fewer, far larger graphs), default (XLA's own: each "
    "loop iteration from the host). Only the launching differs; nothing changes off an NVIDIA "
    "GPU."))]


@dataclasses.dataclass(frozen=True)
class RunSettings:
    seed: int = 0
    """PRNG seed."""
    out_dir: str = "runs"
    """Folder under which each run gets its own folder."""
    run_name: str | None = None
    """Run folder name; default from the command, the seed and the time."""
    resume: str | None = None
    """Resume from this run folder's latest good checkpoint: its saved config, with the flags
    given now applied over it (printed); what fixes the saved state's shapes cannot change."""
    updates_per_chunk: int = 10
    """Updates compiled into one jitted chunk; the host logs and checkpoints between chunks."""
    checkpoint_every_updates: int = 50
    """Checkpoint after at least this many updates (checked at chunk boundaries); 0 disables."""
    checkpoint_every_minutes: float = 10.0
    """Also checkpoint when this many minutes passed since the last one; 0 disables."""
    keep_checkpoints: int = 3
    """Checkpoints kept on disk."""
    plot: bool = True
    """Write a learning-curve PNG into the run folder at each log."""
    wandb: WandbConfig = WandbConfig()
    """Weights & Biases logging."""
    cuda_graphs: CudaGraphs = "loops"


# On resume these cannot change: they name the run.
RESUME_FIXED = ("seed", "out_dir", "run_name")


def validate_run_settings(c: RunSettings) -> None:
    """One line naming the field and the fix for a value that cannot work."""
    for name in ("updates_per_chunk", "keep_checkpoints"):
        if getattr(c, name) <= 0:
            raise ConfigError(f"{name}={getattr(c, name)} must be positive")
    if c.checkpoint_every_updates < 0 or c.checkpoint_every_minutes < 0:
        raise ConfigError("checkpoint_every_updates and checkpoint_every_minutes must be >= 0")
