"""One run's folder, shared by every entry point that trains (train.py, offline.py):
config.json (read back with flags applied on resume), metrics.jsonl, curve.png, checkpoints/,
wandb/, and the chores around them (signals, the progress bar, the console).

    run = RunDir.create(cfg.out_dir, name)   or   RunDir.reopen(Path(cfg.resume))
    run.save_config(cfg); ckpt = run.checkpointer(keep); log = run.log(plot)
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from fused.runs.settings import WandbConfig
from fused.errors import ConfigError
from fused.runs.checkpoint import Checkpointer
from fused.runs.config_io import to_dict, to_json
from fused.runs.files import atomic_write
from fused.runs.metrics import RunLog


def default_name(*parts) -> str:
    """`<parts joined by ->-<time>`, e.g. Craftax-Classic-Symbolic-v1-s0-20261124-101500."""
    return "-".join(str(p) for p in parts) + "-" + datetime.datetime.now().strftime(
        "%Y%m%d-%H%M%S")


class RunDir:
    def __init__(self, path: Path, resuming: bool):
        self.path = path
        self.resuming = resuming

    @classmethod
    def create(cls, out_dir: str, name: str) -> RunDir:
        """A new run's folder (made when the config is saved); an existing run there is an
        error that names --resume."""
        path = Path(out_dir).expanduser() / name
        if (path / "config.json").exists() or (path / "checkpoints").exists():
            state = ("with checkpoints" if any((path / "checkpoints").glob("[0-9]*"))
                     else "stopped before its first checkpoint")
            raise ConfigError(f"run folder {path} already holds a run ({state}); continue it "
                              f"with --resume {path} or pick another --run-name")
        return cls(path, resuming=False)

    @classmethod
    def reopen(cls, path: str | Path) -> RunDir:
        path = Path(path).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(f"--resume {path}: no config.json there; pass a run folder "
                              "written by this tool")
        return cls(path, resuming=True)

    def check_total(self, updates: int, asked: str) -> None:
        """When resuming: a one-line ConfigError where the run's newest checkpoint is already
        past the `updates` the flags now ask for (`asked` names them), since nothing would be
        trained."""
        done = max((int(p.name) for p in (self.path / "checkpoints").glob("[0-9]*")
                    if p.name.isdigit()), default=0) if self.resuming else 0
        if done > updates:
            raise ConfigError(f"--resume {self.path}: the run is at update {done:,} already and "
                              f"{asked} makes {updates:,}; ask for more to train on")

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    def save_config(self, cfg) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write(self.config_path, to_json(cfg))

    def checkpointer(self, keep: int) -> Checkpointer:
        return Checkpointer(self.path / "checkpoints", keep)

    def starting_state(self, ckpt: Checkpointer, fresh, abstract, log, console):
        """The state a run starts from: `fresh` for a new run; when resuming, the newest good
        checkpoint (the metrics log cut after it), or `fresh` with one line when the run stopped
        before its first checkpoint. `log` None: not the lead process."""
        if not self.resuming:
            return fresh
        if not ckpt.steps():
            console.print(f"resume: {self.path} has no checkpoint yet (it stopped before its "
                          "first); starting from update 0")
            if log is not None:
                log.truncate_after(0)
            return fresh
        restored, state, _ = ckpt.restore_latest(abstract, set_aside=True)
        if log is not None:
            log.truncate_after(restored)
        console.print(f"resumed from checkpoint at update {restored}")
        return state

    def log(self, plot: bool) -> RunLog:
        return RunLog(self.path, plot)

    def start_wandb(self, w: WandbConfig, cfg):
        """An offline (default), online or no wandb run in `wandb/`, resumed with the folder."""
        mode = w.resolved_mode
        if mode == "disabled":
            return None
        import wandb  # (a slow import: only where wandb logs)

        os.environ.setdefault("WANDB_SILENT", "true")
        return wandb.init(project=w.project, entity=w.entity, mode=mode, dir=str(self.path),
                          config=to_dict(cfg), name=self.path.name,
                          id=self.path.name.replace("/", "_")[:120], resume="allow")
