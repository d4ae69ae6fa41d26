"""A small random-policy Classic dataset made once for the session and shared by the tests that
label "a dataset" (test_imagine's imagination labels, test_moe_commands' MoE labels,
test_encoders' registered encoder, test_vllm_parity's labels of both backends): before, each
generated its own (two of them in-process on the test process's 2 devices, one by the command),
pipelines compiling a program each for the same kind of data.

`label.py generate` in a process of its own, under a file lock (conftest's `session_once`, as
`shared_run` makes a run): the xdist workers share it; a test that writes into it copies it first.
8 envs x 24 steps (two blocks of the preset's 16), episodes cut at 20 steps, seed 5: the block
program of test_label's `SMOKE` dataset, so one of the two compiles and the other reads the
persistent compilation cache. Its 192 rows make two shards (128 + 64: test_imagine redoes one of
them), an episode running across the boundary; test_imagine generated these sizes itself."""

from __future__ import annotations

from pathlib import Path

import pytest

SMALL = ["smoke", "--env.max-episode-steps", "20", "--seed", "5", "--steps", "24"]


def shared_dataset(tmp_path_factory, name: str, args: list[str]) -> Path:
    """`label.py generate *args` once for the whole session, shared by the xdist workers
    (conftest's `session_once`)."""
    from conftest import ROOT, STAGING, session_once

    return session_once(tmp_path_factory, f"data-{name}",
                        [str(ROOT / "label.py"), "generate", *args, "--out", STAGING])


@pytest.fixture(scope="session")
def small_data(tmp_path_factory) -> Path:
    """`label.py generate` + `SMALL` (192 rows in two shards), once for the session. Tests that
    label it copy it (`shutil.copytree`)."""
    return shared_dataset(tmp_path_factory, "small", SMALL)
