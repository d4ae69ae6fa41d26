"""What a command sets up for its whole process, once, before any work; library code never
touches process-wide state. Warnings as one line each, JAX's persistent compilation cache, the
library's notices through the command's console (quiet on non-lead processes), and several hosts
through JAX's own multi-process runtime, `jax.distributed`, configured from the environment:
JAX_COORDINATOR_ADDRESS (host:port of process 0), JAX_NUM_PROCESSES and JAX_PROCESS_ID, or a
SLURM job of several tasks (JAX reads its variables itself); CPU processes use gloo collectives."""

from __future__ import annotations

import functools
import logging
import os
import sys
import warnings

import jax
from rich.console import Console

from fused.runs.files import DEFAULT_CACHE


def ends_in_one_line(main):
    """A command's `main` that ends quietly (exit 1) when its reader goes away, as in
    `craftax-label generate --help | head`, and in one line where a GPU's driver refuses the
    CUDA graph a `--cuda-graphs` setting asked for (`llm_jax.graphs.refused`), instead of a
    traceback."""
    @functools.wraps(main)
    def run(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error
            sys.exit(1)                                                       # at exit's flush
        except Exception as e:
            from llm_jax.graphs import refused

            line = refused(e)
            if line is None:
                raise
            sys.exit(f"error: {line}")
    return run


def console_script(main):
    """`main` as a console script's entry point (`craftax-train` is `fused.commands.train:cli`).
    The wrapper pip writes ends with `sys.exit(entry_point())`: handed main's result (a run
    folder, an evaluation's figures), it printed that to stderr and exited 1 after a finished
    command. This one drops the result, so a finished command exits 0 as `python train.py`
    does; errors and interrupts keep their own status (`sys.exit` inside main)."""
    def cli() -> None:
        main()
    cli.__doc__ = main.__doc__
    return cli


def subcommands(prog: str, descriptions: dict[str, str], argv: list[str]) -> None:
    """The top level of a command with subcommands: `--help` lists them under the command's
    own name (exit 0); no subcommand or an unknown one is one usage line (exit 1)."""
    names = "|".join(descriptions)
    if argv and argv[0] in ("-h", "--help"):
        width = max(map(len, descriptions))
        print(f"usage: {prog} {{{names}}} [--flags]\n\ncommands:\n" + "".join(
            f"  {k:<{width}}  {v}\n" for k, v in descriptions.items())
            + f"\n`{prog} COMMAND --help` lists a command's flags.")
        sys.exit(0)
    if not argv or argv[0] not in descriptions:
        got = f"unknown command {argv[0]!r}; " if argv else ""
        sys.exit(f"usage: {prog} {names} [--flags] ({got}{prog} --help lists them)")

def one_line_warnings() -> None:
    """Warnings as one `warning: ...` line each (entry points call this once): a skipped
    checkpoint or a redone shard is news for the user, not a source listing."""
    warnings.formatwarning = lambda message, *args, **kwargs: f"warning: {message}\n"


def setup_compilation_cache(default: str = DEFAULT_CACHE) -> str:
    """Turn on JAX's persistent compilation cache ($JAX_COMPILATION_CACHE_DIR, else `default`):
    a Craftax-Symbolic PPO chunk then compiles once per machine, not once per process. Programs
    that compile in under a second are kept too where $JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS
    says so (the test suite: 0)."""
    folder = os.path.expanduser(os.environ.get("JAX_COMPILATION_CACHE_DIR", default))
    jax.config.update("jax_compilation_cache_dir", folder)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:  # (jax reads it itself)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    return folder


def join_cluster() -> bool:
    """Join the cluster described by the environment, if any; True when part of one."""
    env = os.environ
    slurm = int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in env
    if not env.get("JAX_COORDINATOR_ADDRESS") and not slurm:
        return False
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kw = {}
    if env.get("JAX_COORDINATOR_ADDRESS"):
        kw = {"coordinator_address": env["JAX_COORDINATOR_ADDRESS"],
              "num_processes": int(env["JAX_NUM_PROCESSES"]) if "JAX_NUM_PROCESSES" in env
              else None,
              "process_id": int(env["JAX_PROCESS_ID"]) if "JAX_PROCESS_ID" in env else None}
    jax.distributed.initialize(**kw)
    return True


class ConsoleHandler(logging.Handler):
    """Log records as plain, unwrapped lines on a rich console (quiet consoles print nothing)."""

    def __init__(self, console: Console):
        super().__init__()
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        self.console.print(self.format(record), markup=False, highlight=False, soft_wrap=True)


def log_to(console: Console) -> None:
    """The library's notices (`logging` under `fused`) as lines on the command's console."""
    logger = logging.getLogger("fused")
    logger.handlers[:] = [ConsoleHandler(console)]
    logger.setLevel(logging.INFO)
    logger.propagate = False

