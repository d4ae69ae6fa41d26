"""A small random-policy Classic dataset made once for the session and shared by the tests that
label "a dataset" (test_imagine's imagination labels, test_moe_commands' MoE labels,
test_encoders' registered encoder): before, each generated its own (two of them in-process on
the test process's 2 devices, one by the command), three pipelines compiling three programs for
the same kind of data.

`label.py generate` in a process of its own, under a file lock, as conftest's `shared_run` makes
a run: the xdist workers share it; a test that writes into it (a label set) copies it first.
8 envs x 24 steps (two blocks of the preset's 16), episodes cut at 20 steps, seed 5: the block
program of test_label's `SMOKE` dataset, so one of the two compiles and the other reads the
persistent compilation cache. Its 192 rows make two shards (128 + 64: test_imagine redoes one of
them), an episode running across the boundary; test_imagine generated these sizes itself."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

SMALL = ["smoke", "--env.max-episode-steps", "20", "--seed", "5", "--steps", "24"]


def shared_dataset(tmp_path_factory, name: str, args: list[str]) -> Path:
    """`label.py generate *args` once for the whole session, shared by the xdist workers (the
    first to ask generates it under a file lock, the others wait and read the same folder)."""
    from filelock import FileLock

    from command_runner import run_command
    from conftest import ROOT, subprocess_env

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # (each worker's is a folder of the session's)
        base = base.parent
    data, lock = base / f"shared-data-{name}" / "d", base / f"shared-data-{name}.lock"
    with FileLock(str(lock)):
        if not (data / "manifest.json").is_file():
            staging = base / f"shared-data-{name}.staging"
            shutil.rmtree(staging, ignore_errors=True)  # (an earlier try's, cut off)
            p = run_command([sys.executable, str(ROOT / "label.py"), "generate", *args,
                             "--out", str(staging)], env=subprocess_env(),
                            capture_output=True, text=True, timeout=600)
            assert p.returncode == 0, p.stderr[-3000:]
            data.parent.mkdir(exist_ok=True)
            os.replace(staging, data)  # whole, or not there: a later test generates it again
    return data


@pytest.fixture(scope="session")
def small_data(tmp_path_factory) -> Path:
    """`label.py generate` + `SMALL` (192 rows in two shards), once for the session. Tests that
    label it copy it (`shutil.copytree`)."""
    return shared_dataset(tmp_path_factory, "small", SMALL)
