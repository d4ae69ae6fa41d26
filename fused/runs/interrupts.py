"""Ctrl-C / SIGTERM, handled in one place for every command: `on_signals` installs a command's
handler and puts the previous ones back; what a signal means is the command's (training
checkpoints at the end of its chunk, `fused.runs.blocks` ends a block job keeping every block
done, `play.py human` commits and stops serving).

For jobs whose committed work is kept and whose rerun finishes them (`label.py generate`,
`returns`), `interrupts_exit`: the job stops at its next safe point with one line naming the
command that resumes it (exit 130). A signal only sets a flag; the job's loops call
`stop_if_interrupted` between batches and blocks. Raising KeyboardInterrupt wherever the signal
lands was not enough: landing in a callback Python calls for its own purposes (jax's
garbage-collection callback) the exception is printed as "Exception ignored" and dropped, and
the job ran on to the end. A second signal kills the job at once with the signal's default
action (a wait with no safe point, a long compile or another process's barrier, runs in C++,
where no Python handler can raise); what it had committed is kept and the rerun finishes, as
after SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Callable, Iterator


class Flag:
    """A flag a signal handler sets, without a lock (a lock, such as an Event's, taken by a
    handler that interrupted its own thread inside it would deadlock). Also play.py human's."""

    def __init__(self):
        self.asked = False

    def set(self):
        self.asked = True

    def clear(self):
        self.asked = False

    def is_set(self) -> bool:
        return self.asked


_REQUESTED = Flag()  # a signal asked the running job to stop


@contextlib.contextmanager
def on_signals(handler: Callable[[int], None]) -> Iterator[None]:
    """`handler(signum)` on SIGINT and SIGTERM while the block runs (the one place a command's
    handlers are installed); the handlers before it are put back after."""
    previous = {s: signal.signal(s, lambda signum, frame: handler(signum))
                for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def default_next() -> None:
    """The next SIGINT / SIGTERM takes its default action: the process ends at once (a wait
    with no safe point runs in C++, where no Python handler can raise)."""
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, signal.SIG_DFL)


def say(text: str) -> None:
    """A line on stderr from a signal handler (no lock taken; a closed stderr is ignored)."""
    try:
        os.write(sys.stderr.fileno(), text.encode())
    except OSError:
        pass


def exit_now(code: int = 130) -> None:
    """Flush and leave at once: an XLA compile or computation still running in another thread
    crashed the interpreter's teardown (SIGSEGV) when a signal came during one."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def interrupt_requested() -> bool:
    """Whether a signal asked the job to stop (a loop may first save what it would lose)."""
    return _REQUESTED.is_set()


def stop_if_interrupted() -> None:
    """A safe point: KeyboardInterrupt if a signal asked the job to stop."""
    if _REQUESTED.is_set():
        raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_exit(console, resume_command: str):
    """SIGINT / SIGTERM end the job at its next `stop_if_interrupted` with one line naming the
    command that resumes it (exit 130); the previous handlers are restored afterwards."""
    def on_signal(signum):
        _REQUESTED.set()
        default_next()  # a second signal: its default action, at once
        say(f"\n{signal.Signals(signum).name}: stopping after this batch (again to stop at "
            "once)\n")

    _REQUESTED.clear()
    try:
        with on_signals(on_signal):
            yield
            if _REQUESTED.is_set():
                console.print("(the job had finished before it could stop)")
    except KeyboardInterrupt:
        console.print(f"\ninterrupted: the work committed so far is kept; resume with "
                      f"`{resume_command}`")
        exit_now(130)  # (the unwinding has removed every temporary)
    finally:
        _REQUESTED.clear()
