"""The CLI end to end: bad values rejected before compiling; outputs; SIGKILL + resume gives the
same final state as an uninterrupted run; damaged checkpoints are skipped."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from command_runner import run_command
from conftest import ROOT, console_script, free_port, shared_run, subprocess_env
from fused.runs.checkpoint import CheckpointError, Checkpointer, abstract_like

SMOKE = ["smoke", "--total-timesteps", str(8 * 8 * 40), "--updates-per-chunk", "2",
         "--checkpoint-every-updates", "2", "--keep-checkpoints", "50"]


def train_cmd(*args):
    return [sys.executable, str(ROOT / "train.py"), *args]


def final_meta(run_dir: Path, step: int) -> dict:
    return json.loads((run_dir / "checkpoints" / str(step) / "meta" / "metadata").read_text())


def two_device_env() -> dict:
    """A command's environment with the suite's two CPU devices (subprocess_env drops them)."""
    return dict(subprocess_env(), XLA_FLAGS=os.environ["XLA_FLAGS"])


@pytest.fixture(scope="session")
def two_device_smoke_run(tmp_path_factory) -> Path:
    """`train.py smoke` in one process with two CPU devices, trained once for the session and
    shared by the xdist workers (conftest's `shared_run`). Read by
    test_two_processes_train_as_one_process_with_two_devices (the one-process side of its
    comparison) and by test_offline's eval test (the run it evaluates, copied first): one
    training instead of two (the second was `train.main(["smoke"])` in the test's own process,
    on the same two devices)."""
    return shared_run(tmp_path_factory, "smoke-2dev", ["smoke"], env=two_device_env())


def test_bad_value_is_one_line_error_before_compiling(tmp_path):
    t = time.time()
    p = run_command(train_cmd("smoke", "--ppo.num-minibatches", "3", "--out-dir", str(tmp_path)),
                    capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert p.returncode != 0
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "ppo.num_minibatches=3" in lines[0], p.stderr
    assert not list(tmp_path.iterdir())  # nothing written
    assert time.time() - t < 60


@pytest.mark.slow
def test_sigkill_then_resume_equals_uninterrupted_run(tmp_path):
    env = subprocess_env()
    a = tmp_path / "a"
    run_command(train_cmd(*SMOKE, "--out-dir", str(tmp_path), "--run-name", "a", "--plot"),
                check=True, env=env, timeout=600, capture_output=True)
    assert (a / "curve.png").exists() and (a / "config.json").exists()
    rows_a = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows_a] == list(range(1, 41))

    b = tmp_path / "b"
    proc = subprocess.Popen(train_cmd(*SMOKE, "--out-dir", str(tmp_path), "--run-name", "b"),
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ckpts = b / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if ckpts.exists() and any(p.name.isdigit() and int(p.name) >= 6 for p in ckpts.iterdir()):
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    killed_at = max(int(p.name) for p in ckpts.iterdir() if p.name.isdigit())
    assert killed_at < 40, "run finished before it could be killed"

    p = run_command(train_cmd("--resume", str(b)), env=env, timeout=600,
                    capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "resumed from checkpoint" in p.stdout
    # Params, optimizer, env states, RNG and counters: bit-identical to the uninterrupted run.
    assert final_meta(b, 40)["digest"] == final_meta(a, 40)["digest"]
    rows_b = [json.loads(x) for x in (b / "metrics.jsonl").read_text().splitlines()]
    strip = lambda rows: [{k: v for k, v in r.items() if k != "steps_per_s"} for r in rows]
    assert strip(rows_b) == strip(rows_a)


@pytest.mark.slow
def test_resume_applies_flags_and_refuses_shape_changes(smoke_run, tmp_path):
    """--resume with flags: what may change (total_timesteps) is applied over the saved config
    and printed; what fixes the saved state (env.num_envs), or a total the run is already past,
    is one line, and nothing changes."""
    env = subprocess_env()
    run = tmp_path / "r"
    shutil.copytree(smoke_run, run)  # `train.py smoke --run-name r`
    bad = run_command(train_cmd("--resume", str(run), "--env.num-envs", "16"), env=env,
                      timeout=120, capture_output=True, text=True)
    lines = [x for x in bad.stderr.splitlines() if x.strip()]
    assert bad.returncode != 0 and len(lines) == 1, bad.stderr
    assert lines[0].startswith("error: env.num_envs cannot change when resuming")
    assert json.loads((run / "config.json").read_text())["total_timesteps"] == 8 * 8 * 6
    # fewer updates than the run has done: one line, before anything compiles; nothing changes
    short = run_command(train_cmd("--resume", str(run), "--total-timesteps", str(8 * 8 * 4)),
                        env=env, timeout=120, capture_output=True, text=True)
    lines = [x for x in short.stderr.splitlines() if x.strip()]
    assert short.returncode != 0 and lines == [
        f"error: --resume {run}: the run is at update 6 already and --total-timesteps 256 makes "
        "4; ask for more to train on"], short.stderr
    assert json.loads((run / "config.json").read_text())["total_timesteps"] == 8 * 8 * 6
    p = subprocess.run([console_script("craftax-train"), "--resume", str(run),
                        "--total-timesteps", str(8 * 8 * 8)],
                       env=env, timeout=600, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]  # (the console script: 0 once done)
    assert "resume: total_timesteps 384 -> 512" in p.stdout
    assert "resumed from checkpoint at update 6" in p.stdout
    assert json.loads((run / "config.json").read_text())["total_timesteps"] == 8 * 8 * 8
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == list(range(1, 9))


@pytest.mark.slow
def test_sigterm_checkpoints_and_exits_cleanly(tmp_path):
    proc = subprocess.Popen(
        train_cmd("smoke", "--total-timesteps", str(8 * 8 * 100000), "--checkpoint-every-updates",
                  "0", "--checkpoint-every-minutes", "0", "--out-dir", str(tmp_path),
                  "--run-name", "t"),
        env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "t" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and metrics.stat().st_size):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    steps = Checkpointer(tmp_path / "t" / "checkpoints").steps()
    assert len(steps) == 1 and 0 < steps[0] < 100000
    assert f"--resume {tmp_path / 't'}" in out


def test_corrupt_checkpoint_is_skipped_for_previous(tmp_path):
    state = {"w": jnp.arange(1000.0), "n": jnp.int32(3)}
    c = Checkpointer(tmp_path, keep=5)
    c.save(1, state)
    c.save(2, {"w": state["w"] * 2, "n": jnp.int32(4)})
    # Damage every data file of step 2.
    for f in (tmp_path / "2" / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(os.urandom(f.stat().st_size))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        step, restored, _ = c.restore_latest(abstract_like(state))
    assert step == 1 and float(restored["w"][10]) == 10.0
    assert any("checkpoint 2 " in str(x.message) for x in w)
    for f in (tmp_path / "1" / "state").rglob("*"):
        if f.is_file() and f.parent.name == "d":
            f.write_bytes(b"")
    with pytest.raises(CheckpointError, match="no checkpoint .* reads back"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            c.restore_latest(abstract_like(state))
    c.close()


def test_checkpoint_from_before_a_field_was_added_restores(tmp_path):
    """A state saved before its dataclass gained fields that are None unless used (as
    RunnerState gained `carry` and `explore`) restores with those fields None, digest checked;
    a field with a value that the checkpoint lacks is an error, not a silent default."""
    from flax import struct

    @struct.dataclass
    class State:
        w: jax.Array
        pool: object  # None in both versions
        carry: object = None  # added later
        explore: object = None  # added later

    c = Checkpointer(tmp_path, keep=5)
    c.save(1, {"w": jnp.arange(5.0), "pool": None})  # what the older dataclass wrote
    step, restored, _ = c.restore(1, abstract_like(State(jnp.zeros(5), None)))
    assert isinstance(restored, State) and restored.carry is None and restored.explore is None
    np.testing.assert_array_equal(restored.w, np.arange(5.0))
    with pytest.raises(CheckpointError, match="does not read back"):
        c.restore(1, abstract_like(State(jnp.zeros(5), None, carry=jnp.zeros(2))))
    c.close()


def test_resume_without_checkpoints_is_clear_error(tmp_path):
    p = run_command(train_cmd("--resume", str(tmp_path / "nope")), capture_output=True,
                    text=True, env=subprocess_env(), timeout=120)
    assert p.returncode != 0 and "no config.json" in p.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_profile_trace_offline_wandb_and_progress(tmp_path):
    """--profile-dir writes a jax.profiler trace, --wandb.mode offline an offline wandb run;
    --total-timesteps that is not whole updates: said once, with what is trained; a progress
    line whose updates ended no episode shows its return as `-`, not nan."""
    env = subprocess_env()
    env.pop("WANDB_MODE", None)
    prof = tmp_path / "prof"
    p = run_command(train_cmd("smoke", "--total-timesteps", "400", "--out-dir", str(tmp_path),
                              "--run-name", "pw", "--profile-dir", str(prof), "--wandb.mode",
                              "offline", "--plot"),
                    env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert list(prof.rglob("*.xplane.pb")), "no jax.profiler trace written"
    run = tmp_path / "pw"
    assert list((run / "wandb").glob("offline-run-*")), "no offline wandb run"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(r["steps_per_s"] > 0 and "loss/value" in r for r in rows)
    notes = [x for x in p.stdout.splitlines() if x.startswith("note: --total-timesteps")]
    assert notes == ["note: --total-timesteps 400 is not a whole number of updates (64 env steps "
                     "each): training 6 updates, 384 steps"], p.stdout
    lines = [x for x in p.stdout.splitlines() if "steps/s  return" in x]
    assert len(lines) == 3 and "nan" not in p.stdout, p.stdout
    for line, chunk in zip(lines, (rows[0:2], rows[2:4], rows[4:6])):
        shown = line.split("return")[1].split()[0]
        ended = [r["return"] for r in chunk if "return" in r]
        assert shown == (f"{sum(ended) / len(ended):.2f}" if ended else "-"), (line, chunk)
    assert any(not any("return" in r for r in c) for c in (rows[0:2], rows[2:4], rows[4:6]))


@pytest.mark.slow
def test_two_processes_train_as_one_process_with_two_devices(two_device_smoke_run, tmp_path):
    """train.py on 2 processes of 1 CPU device each (jax.distributed, gloo collectives) ends
    bit-identical to 1 process with 2 devices (`two_device_smoke_run`, `train.py smoke` with
    the same flags): same checkpoint digest, same metrics."""
    env = subprocess_env()
    one = two_device_smoke_run
    assert "on 2 cpu device(s)" in (one.parent / "r.stdout").read_text()
    port = free_port()
    procs = [subprocess.Popen(train_cmd("smoke", "--out-dir", str(tmp_path), "--run-name", "two"),
                              env=dict(env, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                                       JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(i)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][-2000:] + outs[1][-2000:]
    assert "on 2 cpu device(s)" in outs[0]
    assert final_meta(tmp_path / "two", 6)["digest"] == final_meta(one, 6)["digest"]
    strip = lambda run: [{k: v for k, v in json.loads(x).items() if k != "steps_per_s"}
                         for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert strip(tmp_path / "two") == strip(one)


def test_a_resume_past_its_total_is_refused_for_every_command(tmp_path):
    """RunDir.check_total (train.py's and offline.py awr/bc's): a run whose newest checkpoint is
    past the updates now asked for is one line; at or below them, or a new run, passes."""
    from fused.errors import ConfigError
    from fused.runs.run_dir import RunDir

    (tmp_path / "checkpoints" / "4").mkdir(parents=True)
    (tmp_path / "checkpoints" / "6").mkdir()
    (tmp_path / "config.json").write_text("{}")
    run = RunDir.reopen(tmp_path)
    with pytest.raises(ConfigError, match=r"is at update 6 already and --num-updates 5 makes 5;"):
        run.check_total(5, "--num-updates 5")
    run.check_total(6, "--num-updates 6")
    RunDir(tmp_path, resuming=False).check_total(1, "--num-updates 1")
