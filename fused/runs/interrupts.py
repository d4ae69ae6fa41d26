"""Ctrl-C / SIGTERM for jobs whose committed work is kept and whose rerun finishes them
(`label.py`): the job stops at its next safe point with one line naming the command that
resumes it (exit 130).

A signal only sets a flag; the job's loops call `stop_if_interrupted` between batches and
blocks. Raising KeyboardInterrupt wherever the signal lands was not enough: landing in a
callback Python calls for its own purposes (jax's garbage-collection callback) the exception is
printed as "Exception ignored" and dropped, and the job ran on to the end (measured: one
SIGTERM in five, 1 s into labelling). A second signal kills the job at once with the signal's
default action (a wait with no safe point, a long compile or another process's barrier, runs
in C++, where no Python handler can raise); what it had committed is kept and the rerun
finishes, as after SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys


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
    def on_signal(signum, frame):
        _REQUESTED.set()
        for sig in previous:  # a second signal: its default action, at once
            signal.signal(sig, signal.SIG_DFL)
        try:
            os.write(sys.stderr.fileno(), f"\n{signal.Signals(signum).name}: stopping after "
                     "this batch (again to stop at once)\n".encode())
        except OSError:  # (stderr closed: the stop still comes)
            pass

    _REQUESTED.clear()
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
        if _REQUESTED.is_set():
            console.print("(the job had finished before it could stop)")
    except KeyboardInterrupt:
        console.print(f"\ninterrupted: the work committed so far is kept; resume with "
                      f"`{resume_command}`")
        # Exit at once: the unwinding has removed every temporary, and an XLA compile still
        # running in another thread crashed the interpreter's teardown (SIGSEGV) when the
        # signal came during a compilation.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _REQUESTED.clear()
