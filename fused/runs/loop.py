"""The one job loop of every training command (train.py's PPO, offline.py's AWR / BC): save the
run's config, start or resume from the newest good checkpoint, then call the jitted chunk, write
its metric rows (JSONL, wandb), advance the progress bar, checkpoint every N updates or M
minutes, at the end and on SIGINT/SIGTERM, and stop cleanly with the command that resumes."""

from __future__ import annotations

import signal
import time
from typing import Any, Callable, NamedTuple

from fused.runs.files import atomic_write
from fused.runs.interrupts import on_signals
from fused.runs.progress import JobProgress
from fused.runs.run_dir import RunDir


class Chunk(NamedTuple):
    """What one call of the entry point's step did."""

    state: Any
    rows: list[dict]  # one metrics row per update done
    update: int  # updates done after it
    info: str  # the progress bar's text


class Cadence(NamedTuple):
    every_updates: int  # 0: never by count
    every_minutes: float  # 0: never by time


class Job(NamedTuple):
    """A training run as a command hands it to `run_job`."""

    cfg: Any  # the run's config (config.json): keep_checkpoints, plot, wandb and the
    #           checkpoint_every_* fields are read
    total: int  # updates of the whole run
    header: str  # printed before the first chunk
    init: Callable[[], Any]  # the fresh state, placed where it runs
    abstract: Callable[[Any], Any]  # the restore target of a state like the given one
    step: Callable[[Any, int, bool], Chunk]  # (state, updates done, first call) -> Chunk
    update_of: Callable[[Any], int]  # updates done in a state
    meta: Callable[[int], dict]  # saved with the checkpoint after that many updates
    resume_command: str
    lead: bool = True  # this process writes the run folder's files (all checkpoint)
    wandb_step: str = "update"  # the row field wandb steps by
    files: tuple[tuple[str, str], ...] = ()  # more files beside config.json: (name, text)


class StopFlag:
    """SIGINT/SIGTERM ask for a checkpoint and a clean exit at the next chunk boundary;
    a second SIGINT interrupts at once."""

    def __init__(self, console):
        self.requested = False
        self.console = console

    def handle(self, signum: int) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.console.print(f"\nsignal {signal.Signals(signum).name}: checkpointing at the end "
                           "of this chunk")


class JobResult(NamedTuple):
    state: Any
    update: int  # updates done
    curve: Any  # the learning curve's path (None without one)
    checkpoints: list[int]


def run_job(job: Job, run: RunDir, console) -> JobResult:
    cfg = job.cfg
    if job.lead:
        run.save_config(cfg)
        for name, text in job.files:
            atomic_write(run.path / name, text)
    log = run.log(cfg.plot and job.lead)
    ckpt = run.checkpointer(cfg.keep_checkpoints)
    console.print(job.header)
    state = job.init()
    state = run.starting_state(ckpt, state, job.abstract(state), log if job.lead else None,
                               console)
    wandb_run = run.start_wandb(cfg.wandb, cfg) if job.lead else None
    try:
        state, update = run_chunks(
            state, job.update_of(state), job.total, job.step, console=console, ckpt=ckpt,
            log=log, lead=job.lead, wandb_run=wandb_run, wandb_step=job.wandb_step,
            cadence=Cadence(cfg.checkpoint_every_updates, cfg.checkpoint_every_minutes),
            meta=job.meta, resume_command=job.resume_command)
    finally:
        ckpt.close()
    if wandb_run is not None:
        wandb_run.finish()
    return JobResult(state, update, log.plot(), ckpt.steps())


def run_chunks(state, update: int, total: int, step: Callable[[Any, int, bool], Chunk], *,
               console, ckpt, log, lead: bool, wandb_run, cadence: Cadence,
               meta: Callable[[int], dict], resume_command: str,
               wandb_step: str = "update") -> tuple[Any, int]:
    """Runs `step(state, update, first)` until `total` updates; returns (state, update)."""
    stop = StopFlag(console)
    with on_signals(stop.handle):
        return _run(state, update, total, step, stop, console=console, ckpt=ckpt, log=log,
                    lead=lead, wandb_run=wandb_run, cadence=cadence, meta=meta,
                    resume_command=resume_command, wandb_step=wandb_step)


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
