"""Jobs done in blocks, beside `fused.runs.loop.run_job` (training's chunks): an evaluation's
env steps, a dataset's shards. Each block's results are committed (written whole) before the
next begins, so a job that stops, however it stops, resumes from what was committed.

`run_blocks` runs the blocks in a worker thread while the main thread waits for the end or for
Ctrl-C / SIGTERM: then the block under way is dropped (a block whose results are being committed
finishes committing first: the job's `lock`), the job writes what the blocks done give and says
so in one line, and the process exits 130 at once (`play.py human`, whose Ctrl-C is how a
person ends a session, exits 0).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Protocol

from fused.runs.interrupts import Flag, exit_now, on_signals


class Blocks(Protocol):
    """A job `run_blocks` can run."""

    lock: threading.Lock
    """Held while a block commits its results; a stop waits for it."""

    def pending(self) -> bool:
        """Whether a block is left to run."""

    def run_block(self) -> str | None:
        """Runs one block and commits its results (under `lock`); a line of progress, or
        None."""

    def stopped(self) -> str:
        """After a stop (called under `lock`): writes what the blocks done so far give (partial
        results); the line that says what was kept and how to go on."""


def run_blocks(job: Blocks, console, stop: Flag | None = None, status: int = 130) -> None:
    """`job.run_block()` until none is pending; Ctrl-C / SIGTERM: `job.stopped()`, its line,
    exit `status`. An exception in a block is raised here. `stop`: the flag of a command that
    installed its own handlers (`on_signals`) for a start that a signal may end as well; none:
    SIGINT and SIGTERM set one while the blocks run."""
    failure: list[BaseException] = []

    def work() -> None:
        try:
            while job.pending():
                line = job.run_block()
                if line:
                    console.print(line)
        except BaseException as e:  # handed to the main thread
            failure.append(e)

    own = stop is None
    stop = Flag() if own else stop
    with on_signals(lambda signum: stop.set()) if own else contextlib.nullcontext():
        worker = threading.Thread(target=work, name="blocks", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.2)
            if stop.is_set():
                with job.lock:  # (a commit under way finishes first)
                    line = job.stopped()
                console.print("\n" + line)
                exit_now(status)  # (a block may be computing in the worker thread)
    if failure:
        raise failure[0]
