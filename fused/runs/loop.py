"""The chunk loop every training entry point runs (train.py, offline.py): call a jitted chunk,
write its metric rows (JSONL, wandb), advance the progress bar, checkpoint every N updates or M
minutes, at the end and on SIGINT/SIGTERM, then stop cleanly with the command that resumes."""

from __future__ import annotations

import time
from typing import Any, Callable, NamedTuple

from fused.runs.progress import JobProgress
from fused.runs.run_dir import StopFlag


class Chunk(NamedTuple):
    """What one call of the entry point's step did."""

    state: Any
    rows: list[dict]  # one metrics row per update done
    update: int  # updates done after it
    info: str  # the progress bar's text


class Cadence(NamedTuple):
    every_updates: int  # 0: never by count
    every_minutes: float  # 0: never by time


def run_chunks(state, update: int, total: int, step: Callable[[Any, int, bool], Chunk], *,
               console, ckpt, log, lead: bool, wandb_run, cadence: Cadence,
               meta: Callable[[int], dict], resume_command: str,
               wandb_step: str = "update") -> tuple[Any, int]:
    """Runs `step(state, update, first)` until `total` updates; returns (state, update)."""
    stop = StopFlag(console)
    try:
        return _run(state, update, total, step, stop, console=console, ckpt=ckpt, log=log,
                    lead=lead, wandb_run=wandb_run, cadence=cadence, meta=meta,
                    resume_command=resume_command, wandb_step=wandb_step)
    finally:
        stop.restore()


def _run(state, update, total, step, stop, *, console, ckpt, log, lead, wandb_run, cadence,
         meta, resume_command, wandb_step):
    last_update, last_time = update, time.time()
    first = True
    with JobProgress(console, total, update) as progress:
        while update < total:
            out = step(state, update, first)
            state = out.state
            if lead:
                log.write(out.rows)
            if wandb_run is not None:
                for r in out.rows:
                    wandb_run.log(r, step=r[wandb_step])
            progress.advance(out.update - update, info=out.info)
            update, first = out.update, False
            due = ((cadence.every_updates and update - last_update >= cadence.every_updates)
                   or (cadence.every_minutes
                       and time.time() - last_time >= 60 * cadence.every_minutes))
            if due or stop.requested or update >= total:
                ckpt.save(update, state, meta(update))
                last_update, last_time = update, time.time()
                log.plot()
            if stop.requested:
                progress.print(f"stopped at update {update}; continue with: {resume_command}")
                break
    return state, update
