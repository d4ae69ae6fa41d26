"""Imported at start-up by the Python processes the tests start (tests/conftest.py puts this
folder on PYTHONPATH): the same garbage-collector threshold as the test processes. It hides a
system Python's own sitecustomize (Debian's and Ubuntu's install a crash reporter) in them."""

import gc

# Tracing a program makes millions of short-lived objects; with the default first threshold
# (700) the collector's passes were ~5% of a `train.py smoke` on a fresh cache.
gc.set_threshold(100_000, 10, 10)  # (700, 10, 10) by default

# With $FUSED_TEST_COMMAND_LOG set (tests/command_runner.py), each process also appends its time
# in tracing, lowering and compiling (JAX's own duration events, top-level programs and nested
# ones alike) and its CPU seconds at exit: where the suite's time goes, by command.
import os  # noqa: E402

if os.environ.get("FUSED_TEST_COMMAND_LOG"):
    import atexit
    import json
    import resource
    import sys
    import time

    import jax.monitoring

    _spent: dict = {}
    _started = time.perf_counter()

    def _count(event: str, seconds: float, **_) -> None:
        if event.startswith(("/jax/core/compile/", "/jax/compilation_cache/")):
            key = event.rsplit("/", 1)[-1]
            _spent[key] = _spent.get(key, 0.0) + seconds

    jax.monitoring.register_event_duration_secs_listener(_count)

    def _log() -> None:
        if not _spent:  # (the command server; processes that compiled nothing)
            return
        usage = resource.getrusage(resource.RUSAGE_SELF)
        with open(os.environ["FUSED_TEST_COMMAND_LOG"], "a") as log:
            log.write(json.dumps({
                "process": [os.path.basename(sys.argv[0]), *sys.argv[1:3]], "pid": os.getpid(),
                "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
                "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
                "wall_s": round(time.perf_counter() - _started, 2),
                **{k: round(v, 2) for k, v in _spent.items()}}) + "\n")

    atexit.register(_log)
