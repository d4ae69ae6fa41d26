"""Imported at start-up by the Python processes the tests start (tests/conftest.py puts this
folder on PYTHONPATH): the same garbage-collector threshold and arena allocator as the test
processes, and `label.py label`'s optimisation level (`optimised_for`). It hides a system
Python's own sitecustomize (Debian's and Ubuntu's install a crash reporter) in them."""

import gc

# Tracing a program makes millions of short-lived objects; with the default first threshold
# (700) the collector's passes were ~5% of a `train.py smoke` on a fresh cache.
gc.set_threshold(100_000, 10, 10)  # (700, 10, 10) by default

import os  # noqa: E402
import sys  # noqa: E402

# CPython's arena allocator kept from unmapping its frame-stack chunks over and over (the library
# tests/conftest.py built and named here: tests/startup/arena_allocator.py).
if os.environ.get("FUSED_TEST_ARENA", "0") != "0":
    import arena_allocator

    arena_allocator.keep(os.environ["FUSED_TEST_ARENA"])


def optimised_for(argv: list[str]) -> None:
    """`label.py label` (or `craftax-label label`) runs at LLVM's O1 where the suite's O0 is set
    (tests/conftest.py's FAST_COMPILE): it runs an LLM over a dataset, and at O0 running it, not
    compiling, was most of its time (`tests/test_faults.py`'s SIGTERM test, run beside itself
    with the labelling at O0: its two labellings 26.9 + 12.2 -> 8.9 + 4.5 CPU s, the test 76 s
    -> 45 s; in a suite run the command's 14 runs 151 -> 95 CPU s). Every label set a test
    compares with another comes from this command too, or is compared to a tolerance. Called
    here, at start-up, and by tests/command_runner.py for the commands it forks."""
    name = os.path.basename(argv[0]) if argv else ""
    flags = os.environ.get("XLA_FLAGS", "").split()
    if name in ("label.py", "craftax-label") and argv[1:2] == ["label"] and (
            "--xla_backend_optimization_level=0" in flags):
        os.environ["XLA_FLAGS"] = " ".join(
            "--xla_backend_optimization_level=1" if f == "--xla_backend_optimization_level=0"
            else f for f in flags)


optimised_for(sys.argv)

# With $FUSED_TEST_COMMAND_LOG set (tests/command_runner.py), each process also appends at exit
# its seconds of tracing, lowering, compiling and reading the compilation cache (JAX's duration
# events, top-level programs and nested ones alike), its CPU seconds, its compile seconds by
# program, and those seconds by the test that ran it ($PYTEST_CURRENT_TEST): where the suite's
# time goes.
_monitoring = None
if os.environ.get("FUSED_TEST_COMMAND_LOG"):
    try:  # (not in a process without JAX: the vLLM server's venv)
        import jax.monitoring as _monitoring
    except ImportError:
        pass

if _monitoring is not None:
    import atexit
    import collections
    import json
    import resource
    import time

    _spent: dict = collections.Counter()
    _programs: dict = collections.Counter()  # compile seconds by program name
    _tests: dict = collections.defaultdict(collections.Counter)  # ... by test, by event
    _started = time.perf_counter()

    def _count(event: str, seconds: float, fun_name: str = "", **_) -> None:
        if event.startswith(("/jax/core/compile/", "/jax/compilation_cache/")):
            key = event.rsplit("/", 1)[-1]
            _spent[key] += seconds
            if key == "backend_compile_duration":
                _programs[fun_name] += seconds
            test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
            if test:
                _tests[test][key] += seconds

    _monitoring.register_event_duration_secs_listener(_count)

    def _log() -> None:
        if not _spent:  # (the command server; processes that compiled nothing)
            return
        usage = resource.getrusage(resource.RUSAGE_SELF)
        r2 = lambda d: {k: round(v, 2) for k, v in d.items()}  # noqa: E731
        with open(os.environ["FUSED_TEST_COMMAND_LOG"], "a") as log:
            log.write(json.dumps({
                "process": [os.path.basename(sys.argv[0]), *sys.argv[1:3]], "pid": os.getpid(),
                "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
                "wall_s": round(time.perf_counter() - _started, 2), **r2(_spent),
                "programs": r2(dict(_programs.most_common(8))),
                "tests": {t: r2(v) for t, v in _tests.items()}}) + "\n")

    atexit.register(_log)
