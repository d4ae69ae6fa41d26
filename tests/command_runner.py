"""`run_command`: `subprocess.run` for the tests, with this repository's Python commands
(`python train.py ...`, `label.py`, `offline.py`, `play.py`, `bench/*.py`, `python -m llm_jax`)
started by forking a server that has imported their libraries already (one server per test
process), not by a new interpreter. Each command skips most of its imports (a profile of the
suite: about a quarter of its CPU time was imports, in a few hundred command processes; a
`label.py generate` 7.3 s -> 5.7 s, a one-line error 2.7 s -> 0.1 s) and is still a process of its
own: its own pid, environment, working directory, streams and exit status, so the tests check
the commands as a user runs them.

The server imports nothing that touches a device (no backend starts before the fork, so each
command's XLA_FLAGS, its device count included, apply as in a new process; Craftax makes arrays
when imported, so each command imports it itself): tests/test_command_runner.py checks it. Anything
else runs through `subprocess.run` unchanged: other programs, a command given input or other
streams, or an environment whose JAX_* settings (read when jax is imported), PYTHONPATH or
LD_PRELOAD differ from the server's. Tests that signal a command start it with Popen.

With $FUSED_TEST_COMMAND_LOG set to a file, the server appends a JSON line for each command it
ran: its argv, working directory, CPU seconds (its own and its children's) and wall seconds;
every Python process the tests start (tests/startup/sitecustomize.py) appends its seconds of
tracing, lowering, compiling and reading the compilation cache."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRELOAD = ("flax.linen", "imageio.v3", "jax", "matplotlib.pyplot", "optax", "orbax.checkpoint",
           "rich.console", "tokenizers", "tyro", "zarr", "fused.commands.label",
           "fused.commands.offline", "fused.commands.play", "fused.commands.train")

_server: subprocess.Popen | None = None


def forkable(args, env: dict | None, kwargs: dict) -> bool:
    """Whether `args` (with `subprocess.run`'s `kwargs`) is one of our Python commands that the
    server can start for a caller whose child environment is `env`."""
    if set(kwargs) - {"capture_output", "text", "timeout", "check", "cwd"}:
        return False
    if not kwargs.get("capture_output") or not isinstance(args, (list, tuple)) or len(args) < 2:
        return False
    if str(args[0]) != sys.executable:
        return False
    if args[1] == "-m":  # `python -m llm_jax ...`
        if len(args) < 3 or args[2].split(".")[0] not in ("llm_jax", "fused"):
            return False
    elif not str(args[1]).endswith(".py") or ROOT not in Path(
            kwargs.get("cwd") or os.getcwd(), args[1]).resolve().parents:
        return False
    from conftest import subprocess_env

    server = subprocess_env()
    env = dict(os.environ) if env is None else env
    return all(env.get(k) == server.get(k) for k in set(env) | set(server)
               if k.startswith("JAX_") or k in ("PYTHONPATH", "LD_PRELOAD"))


def server() -> subprocess.Popen:
    """This test process's server (started at the first command; it ends with this process)."""
    global _server
    if _server is None or _server.poll() is not None:
        from conftest import subprocess_env

        _server = subprocess.Popen([sys.executable, __file__], env=subprocess_env(),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                   bufsize=1)
    return _server


def run_command(args, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    """As `subprocess.run(args, env=env, **kwargs)` (with stdout and stderr captured)."""
    if not forkable(args, env, kwargs):
        return subprocess.run(args, env=env, **kwargs)
    srv = server()
    timeout = kwargs.get("timeout")
    with tempfile.TemporaryDirectory(prefix="cmd-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        request = {"argv": [str(a) for a in args[1:]],
                   "env": dict(os.environ if env is None else env),
                   "cwd": str(kwargs.get("cwd") or os.getcwd()), "out": str(out), "err": str(err)}
        srv.stdin.write(json.dumps(request) + "\n")
        srv.stdin.flush()
        pid = json.loads(srv.stdout.readline())["pid"]
        ready, _, _ = select.select([srv.stdout], [], [], timeout)
        timed_out = not ready
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        status = json.loads(srv.stdout.readline())["status"]
        stdout, stderr = out.read_bytes(), err.read_bytes()
    if timed_out:
        raise subprocess.TimeoutExpired(args, timeout, stdout, stderr)
    if kwargs.get("text"):
        stdout, stderr = stdout.decode(), stderr.decode()
    done = subprocess.CompletedProcess(list(args), status, stdout, stderr)
    if kwargs.get("check"):
        done.check_returncode()
    return done


def serve() -> None:
    """The server: imports PRELOAD, then for each request line on stdin forks the command,
    answers its pid, waits for it and answers its status (as subprocess's returncode: the exit
    code, or -N for signal N). Ends at the end of stdin. Its answers go to its stdout as it
    started; anything else it prints, to its stderr."""
    import importlib

    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.path.insert(0, str(ROOT))
    for name in PRELOAD:
        importlib.import_module(name)
    for line in sys.stdin:
        request = json.loads(line)
        with warnings.catch_warnings():  # (Python 3.12 warns of any thread; the one here is
            # OpenBLAS's pool, which is fork-safe, and no jax backend is running: see above)
            warnings.filterwarnings("ignore", "This process .* is multi-threaded",
                                    DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            answers.close()
            command(**request)
        answers.write(json.dumps({"pid": pid}) + "\n")
        started = time.perf_counter()
        _, status, usage = os.wait4(pid, 0)
        answers.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
        if request["env"].get("FUSED_TEST_COMMAND_LOG"):  # where the suite's time goes
            with open(request["env"]["FUSED_TEST_COMMAND_LOG"], "a") as log:
                log.write(json.dumps({
                    "argv": request["argv"], "cwd": request["cwd"],
                    "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
                    "wall_s": round(time.perf_counter() - started, 2)}) + "\n")


def command(argv: list[str], env: dict, cwd: str, out: str, err: str) -> None:
    """In the forked process: the command's environment, directory, streams (stdin empty), then
    its script run as `python SCRIPT ARGS` runs it, ending as the interpreter ends (threads
    joined, atexit handlers run, streams flushed) with its status."""
    import atexit
    import runpy
    import threading

    os.environ.clear()
    os.environ.update(env)
    import sitecustomize  # (tests/startup/, on the server's PYTHONPATH)

    sitecustomize.optimised_for(argv)
    os.chdir(cwd)
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                            (1, out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        f = os.open(path, flags, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", buffering=1, errors="backslashreplace", closefd=False)
    code = 0
    try:
        if argv[0] == "-m":  # as `python -m MODULE` runs it (from the working directory)
            sys.argv = list(argv[1:])
            sys.path[0] = cwd
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = str(Path(argv[0]).resolve().parent)  # as `python SCRIPT` sets it
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:  # SystemExit("message"): printed, status 1, as the interpreter does
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:  # the interpreter's way: die of the signal
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 (printed as the interpreter prints it)
        import traceback

        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def probe() -> None:
    """`python tests/command_runner.py --probe`: what a command's process sees (JSON), for
    tests/test_command_runner.py."""
    from jax._src import xla_bridge

    started = bool(xla_bridge._backends)  # before this process asks for a device
    import jax

    print(json.dumps({"backend_before": started,
                      "craftax": "craftax.craftax_classic.constants" in sys.modules,
                      "devices": jax.device_count(), "cwd": os.getcwd(), "ppid": os.getppid(),
                      "env": os.environ.get("PROBE"), "argv": sys.argv}))


def arena() -> None:
    """`python tests/command_runner.py --arena`: whether this process's arena allocator is
    tests/startup/arena.c's, and whether that hands a freed block back for the next request of
    its size (JSON), for tests/test_command_runner.py."""
    import ctypes

    from arena_allocator import Allocator  # (tests/startup/, on the command's PYTHONPATH)

    now = Allocator()
    ctypes.pythonapi.PyObject_GetArenaAllocator(ctypes.byref(now))
    lib = ctypes.CDLL(os.environ["FUSED_TEST_ARENA"])
    lib.arena_alloc.restype = ctypes.c_void_p
    lib.arena_alloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.arena_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    # sizes CPython never asks for (its frame chunks are 16 KiB x 2^k, its arenas 1 MiB), so its
    # own calls between these cannot take the block
    size = 48 * 1024
    block = lib.arena_alloc(None, size)
    ctypes.memset(block, 7, size)  # (a block mapped anew would read 0: the kernel zeroes it)
    lib.arena_free(None, block, size)
    again = lib.arena_alloc(None, size)
    other = lib.arena_alloc(None, 80 * 1024)
    print(json.dumps({"swapped": now.alloc == ctypes.cast(lib.arena_alloc, ctypes.c_void_p).value,
                      "reused": again == block and ctypes.string_at(again, size) == b"\7" * size,
                      "other_size_new": ctypes.string_at(other, 16) == bytes(16)}))


if __name__ == "__main__":
    {"--probe": probe, "--arena": arena}.get(" ".join(sys.argv[1:]), serve)()
