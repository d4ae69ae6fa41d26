"""tests/command_runner.py: a command forked from the server is a process of its own, as a new
interpreter would be (its environment, device count, directory, streams and exit status), with
no device started and no Craftax imported before the fork; a timeout kills it and the server
goes on."""

import json
import os
import subprocess
import sys

import pytest

from command_runner import run_command, server
from conftest import ROOT, TWO_DEVICES, subprocess_env

RUNNER = str(ROOT / "tests" / "command_runner.py")


def test_a_forked_command_sees_what_a_new_process_sees(tmp_path):
    env = subprocess_env()
    env = dict(env, PROBE="x", XLA_FLAGS=f"{env.get('XLA_FLAGS', '')} {TWO_DEVICES}")
    seen = {}
    for how, run in (("forked", run_command), ("new", subprocess.run)):
        p = run([sys.executable, RUNNER, "--probe"], env=env, cwd=tmp_path, capture_output=True,
                text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        seen[how] = json.loads(p.stdout)
    assert seen["forked"]["ppid"] == server().pid  # (not the same path twice)
    assert seen["new"]["ppid"] == os.getpid()
    for got in seen.values():
        got.pop("ppid")
    assert seen["forked"] == seen["new"] == {
        "backend_before": False, "craftax": False, "devices": 2, "cwd": str(tmp_path),
        "env": "x", "argv": [RUNNER, "--probe"]}


@pytest.mark.parametrize("args", [["label.py", "generate", "--num-env", "4"],
                                  ["offline.py", "eval", "--run", "/nonexistent"],
                                  ["play.py", "--help"]])
def test_exit_status_and_streams_equal_a_new_process(args, tmp_path):
    cmd = [sys.executable, str(ROOT / args[0]), *args[1:]]
    new = subprocess.run(cmd, env=subprocess_env(), cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    forked = run_command(cmd, env=subprocess_env(), cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert (forked.returncode, forked.stdout, forked.stderr) == \
        (new.returncode, new.stdout, new.stderr)


def test_a_timeout_kills_the_command_and_the_server_goes_on(tmp_path):
    cmd = [sys.executable, str(ROOT / "train.py"), "smoke", "--out-dir", str(tmp_path)]
    with pytest.raises(subprocess.TimeoutExpired):
        run_command(cmd, env=subprocess_env(), capture_output=True, timeout=1)
    p = run_command([sys.executable, RUNNER, "--probe"], env=subprocess_env(),
                    capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and json.loads(p.stdout)["ppid"] == server().pid


def test_processes_run_with_the_arena_allocator_that_keeps_freed_blocks():
    """tests/startup/arena_allocator.py: a process the tests start, new or forked, has CPython's
    arena allocator swapped for arena.c's, which hands a freed block of the same size back."""
    if os.environ.get("FUSED_TEST_ARENA", "0") == "0":
        pytest.skip("no C compiler: the suite runs with CPython's own arena allocator")
    for run in (run_command, subprocess.run):
        p = run([sys.executable, RUNNER, "--arena"], env=subprocess_env(), capture_output=True,
                text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout) == {"swapped": True, "reused": True, "other_size_new": True}
