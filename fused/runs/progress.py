"""Progress of a long job in units (updates, shards, states): rich's progress bar with its rate
and ETA columns on a terminal; one plain line per step where output goes to a file or CI log."""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)


class JobProgress:
    """`with JobProgress(console, total, done=...) as p: p.advance(n, info="...")`. The ETA
    comes from rich's estimate over recent steps (the first, compiling step excluded by starting
    the clock at the first `advance`)."""

    def __init__(self, console: Console, total: int, done: int = 0, unit: str = "updates",
                 description: str = "training", rate: bool = False):
        self.console, self.total, self.unit, self.rate = console, total, unit, rate
        self.since: tuple[float, int] | None = None  # (time, done) at the first advance
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                            MofNCompleteColumn(), TextColumn(unit), TextColumn("{task.fields[info]}"),
                            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                            console=console, disable=not console.is_terminal)
        self.task = self.bar.add_task(description, total=total, completed=done, info="",
                                      start=False)
        self.done = done

    def __enter__(self) -> JobProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def advance(self, n: int, info: str = "") -> None:
        """`n` more units done; `info` is shown beside the bar (with a rate, when asked for,
        over the steps after the first: it excludes compilation)."""
        now = time.perf_counter()
        if self.rate and self.since is not None and now > self.since[0]:
            per_s = (self.done + n - self.since[1]) / (now - self.since[0])
            info = f"{per_s:,.0f} {self.unit}/s  {info}".rstrip()
        self.done += n
        if self.since is None:
            self.since = (now, self.done)
        self.bar.start_task(self.task)
        self.bar.update(self.task, advance=n, info=info)
        if not self.console.is_terminal:
            self.console.print(f"{self.unit} {self.done:>6}/{self.total}  {info}")

    def print(self, *args, **kw) -> None:
        """A line above the bar (or in the log)."""
        self.console.print(*args, **kw)
