"""Fault injection: each fault a user meets (odd row counts, filters that keep nothing, damaged or
hand-edited data, unreadable manifests, unwritable folders, weights without safetensors, Ctrl-C,
damaged checkpoints, runs stopped before their first checkpoint, hub ids) ends in a result or in
one line naming the problem and the fix, and every file written before is unchanged after
(sha256 of each file), except what the fix is meant to rewrite."""

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from command_runner import run_command
from conftest import LENGTHS, ROOT, subprocess_env
from fused.data.store import CHUNK_ROWS, Dataset, DatasetError, commit_group, read_group

ENV = "Craftax-Classic-Symbolic-v1"
# 100 envs (not a power of two), 40 steps, 1,500-row shards: shards and resume points hold more
# than one 1,024-row chunk and not a multiple of it.
GEN = ["smoke", "--num-envs", "100", "--steps", "80", "--shard-rows", "1500", "--seed", "3",
       "--env.max-episode-steps", "30"]


def tree(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` by relative path."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def run(tool: str, *args, timeout=600, **kw) -> subprocess.CompletedProcess:
    return run_command([sys.executable, str(ROOT / tool), *args], env=subprocess_env(),
                       capture_output=True, text=True, timeout=timeout, **kw)


def one_line_error(p: subprocess.CompletedProcess) -> str:
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode not in (0, None) and len(lines) == 1 and lines[0].startswith("error: "), \
        (p.returncode, p.stdout[-1500:], p.stderr[-3000:])
    return lines[0]


def flip_byte(path: Path) -> None:
    b = bytearray(path.read_bytes())
    b[len(b) // 2] ^= 0xFF
    path.write_bytes(bytes(b))


def data_file(folder: Path, column: str) -> Path:
    """The one chunk file of a zarr array (zarr's sharding codec: one file per array)."""
    return next(p for p in (folder / column).rglob("*") if p.is_file() and p.name != "zarr.json")


@contextlib.contextmanager
def read_only(folder: Path):
    """`folder` unwritable even for root (chattr +i), else by its mode bits."""
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode:
            pytest.skip("running as root on a file system without chattr +i")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
    else:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(mode)


@pytest.mark.parametrize("rows", [0, 1, CHUNK_ROWS - 1, CHUNK_ROWS, CHUNK_ROWS + 1, 6149])
def test_groups_of_any_row_count_round_trip(tmp_path, rows):
    """The chunking adapts to the row count (zarr's sharding needs whole chunks per shard) and
    to empty columns (an env without achievements stores 0 bytes of them per row); a rerun with
    the same rows leaves the committed files untouched."""
    cols = {"a": np.arange(rows * 22, dtype=np.int32).reshape(rows, 22),
            "b": (np.arange(rows) % 3 == 0), "empty": np.zeros((rows, 0), np.uint8)}
    entry = commit_group(tmp_path / "g", cols)
    got = read_group(tmp_path / "g")
    assert entry["rows"] == rows
    for k in cols:
        np.testing.assert_array_equal(got[k], cols[k])
        assert got[k].shape == cols[k].shape
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "g").rglob("*")}
    assert commit_group(tmp_path / "g", cols) == entry
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "g").rglob("*")} == before


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """GEN generated with a --min-return filter and a resume point after every block (rows
    waiting in the resume point > 1,024 and not a multiple), plus a returns set."""
    root = tmp_path_factory.mktemp("faults") / "d"
    p = run("label.py", "generate", *GEN, "--min-return", "0", "--resume-seconds", "0",
            "--out", str(root))
    assert p.returncode == 0, p.stderr[-3000:]
    p = run("label.py", "returns", "--data", str(root), "--gamma", "0.9")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [s["rows"] for s in Dataset(root).manifest()["shards"]]
    assert max(rows) > CHUNK_ROWS and any(r % CHUNK_ROWS for r in rows), rows
    return root


def copy_of(dataset: Path, tmp_path: Path) -> Path:
    out = tmp_path / "d"
    shutil.copytree(dataset, out)
    return out


@pytest.mark.slow
def test_filter_that_keeps_nothing_is_one_line(tmp_path):
    msg = one_line_error(run("label.py", "generate", *GEN, "--min-return", "1000",
                             "--out", str(tmp_path / "none")))
    assert "no episode was kept" in msg and "episodes finished (best return" in msg \
        and "--min-return 1000" in msg


@pytest.mark.slow
def test_damaged_trajectory_shard_is_named_and_its_command_repairs_it(dataset, tmp_path):
    d = copy_of(dataset, tmp_path)
    before = tree(d)
    shard = Dataset(d).shard_names()[1]
    flip_byte(data_file(d / "shards" / shard, "reward"))
    damaged = tree(d)
    msg = one_line_error(run("label.py", "returns", "--data", str(d), "--gamma", "0.5",
                             "--name", "other"))
    assert f"shard {shard} is damaged" in msg and "python label.py generate --out" in msg
    assert tree(d) == damaged  # nothing written
    p = run("label.py", "verify", "--data", str(d))
    assert p.returncode == 1 and "is damaged" in p.stdout, p.stdout[-2000:]
    command = msg.split("rerun `")[1].rstrip("`")
    assert "--min-return 0.0" in command and "--num-envs 100" in command
    p = subprocess.run(command.replace("python label.py", f"{sys.executable} "
                                       f"{ROOT / 'label.py'}", 1), shell=True,
                       env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    after = tree(d)
    # the shard has its bytes back, the returns set is kept, the rest is as it was
    assert {k: v for k, v in after.items() if not k.startswith(("work/", "card.json"))} == \
        {k: v for k, v in before.items() if not k.startswith(("work/", "card.json"))}
    assert run("label.py", "verify", "--data", str(d)).returncode == 0


@pytest.mark.slow
def test_damage_is_named_before_a_missing_returns_set(dataset, tmp_path):
    """A damaged shard in a dataset without a returns set: `offline.py bc` names the damage
    and its repair, not `label.py returns` (which would stop at the damage)."""
    d = copy_of(dataset, tmp_path)
    ds = Dataset(d)
    ds.write_manifest({k: v for k, v in ds.manifest().items() if k != "returns"})
    shard = ds.shard_names()[0]
    flip_byte(data_file(d / "shards" / shard, "action"))
    msg = one_line_error(run("offline.py", "bc", "smoke", "--data", str(d)))
    assert f"shard {shard} is damaged" in msg and "label.py generate --out" in msg, msg
    assert "returns" not in msg.split("rerun")[0], msg


def hand_label_set(d: Path, name: str = "h") -> None:
    """A label set written through the store (random hidden states, one per row)."""
    ds = Dataset(d)
    m = ds.manifest()
    entries = []
    for s in m["shards"]:
        ds.label_dir(name).mkdir(parents=True, exist_ok=True)
        hidden = np.random.default_rng(0).normal(size=(s["rows"], 8)).astype(np.float16)
        entries.append(commit_group(ds.label_dir(name, s["name"]), {
            "hidden": hidden, "label_row": np.arange(s["rows"], dtype=np.int32)}))
    m["labels"][name] = {"shards": entries}
    ds.write_manifest(m)
    card = ds.card()
    ds.write_card(dict(card, labels={name: {"dtype": "float16", "llm": {}}}))


@pytest.mark.slow
def test_damaged_label_shard_and_edited_row_counts_stop_training_reads(dataset, tmp_path):
    from fused.data.loader import load_training_data

    d = copy_of(dataset, tmp_path)
    hand_label_set(d)
    load_training_data(str(d), labels="h")  # intact: reads
    shard = Dataset(d).shard_names()[0]
    flip_byte(data_file(d / "labels" / "h" / shard, "hidden"))
    with pytest.raises(DatasetError, match=f"label set 'h' shard {shard} is damaged.*"
                                           "python label.py label --data"):
        load_training_data(str(d), labels="h")
    m = json.loads((d / "manifest.json").read_text())
    m["shards"][1]["rows"] -= 28
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DatasetError, match=r"holds \d+ rows but the manifest says"):
        load_training_data(str(d))


@pytest.mark.slow
def test_awr_on_a_damaged_label_shard_is_one_line(dataset, tmp_path):
    d = copy_of(dataset, tmp_path)
    hand_label_set(d)
    flip_byte(data_file(d / "labels" / "h" / Dataset(d).shard_names()[0], "hidden"))
    runs = tmp_path / "runs"
    msg = one_line_error(run("offline.py", "awr", "smoke", "--data", str(d), "--labels", "h",
                             "--out-dir", str(runs)))
    assert "is damaged" in msg and "label.py label" in msg
    assert not any(runs.rglob("checkpoints/[0-9]*"))


@pytest.mark.slow
def test_unreadable_manifest_is_one_line_and_generate_rebuilds_it(dataset, tmp_path):
    d = copy_of(dataset, tmp_path)
    before = json.loads((d / "manifest.json").read_text())
    (d / "manifest.json").write_text('{"shards": [')
    msg = one_line_error(run("label.py", "returns", "--data", str(d), "--gamma", "0.5"))
    assert "manifest.json is unreadable" in msg and "label.py generate --out" in msg
    p = run("label.py", "generate", *GEN, "--min-return", "0", "--out", str(d))
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((d / "manifest.json").read_text()) == before  # returns set kept


@pytest.mark.slow
def test_unwritable_outputs_fail_first(dataset, tmp_path):
    d = copy_of(dataset, tmp_path)
    before = tree(d)
    with read_only(d):
        msg = one_line_error(run("label.py", "returns", "--data", str(d), "--gamma", "0.5"))
        assert "--data" in msg and "not writable" in msg
    assert tree(d) == before
    ro = tmp_path / "ro"
    ro.mkdir()
    with read_only(ro):
        msg = one_line_error(run("label.py", "generate", "smoke", "--out", str(ro / "x")))
        assert "--out" in msg and "not writable" in msg
        msg = one_line_error(run("train.py", "smoke", "--out-dir", str(ro)))
        assert "--out-dir" in msg and "not writable" in msg


@pytest.mark.slow  # the weights are checked after --data: it needs the generated `dataset`
def test_weights_without_safetensors_is_one_line(dataset, tmp_path):
    w = tmp_path / "w"
    w.mkdir()
    (w / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "vocab_size": 320, "hidden_size": 48,
        "intermediate_size": 104, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": True}))
    msg = one_line_error(run("label.py", "label", "--data", str(dataset), "--name", "x",
                             "--llm.weights", str(w)))
    assert "no model.safetensors" in msg and "llm.weights" in msg


@pytest.mark.slow  # (the generated `dataset`)
def test_weights_without_a_chat_template_is_one_line(dataset, tmp_path):
    """A folder whose tokenizer has no chat template anywhere transformers looks: one line
    naming the files looked for, and the dataset untouched."""
    from qwen_fixtures import build_tiny_qwen3

    w = tmp_path / "w"
    build_tiny_qwen3(w, layers=2, vocab=151_680, tokenizer=True)
    (w / "chat_template.jinja").unlink()
    before = tree(dataset)
    msg = one_line_error(run("label.py", "label", "--data", str(dataset), "--name", "x",
                             "--llm.weights", str(w)))
    assert "no chat template" in msg and "chat_template.jinja" in msg and "llm.weights" in msg
    assert tree(dataset) == before


def test_hub_ids_resolve_from_the_local_cache(tmp_path, monkeypatch):
    """`--llm.weights Org/Name` finds the snapshot in the HF cache laid out as huggingface_hub
    does; an id neither cached nor reachable is one line."""
    from fused.errors import ConfigError
    from fused.llm.config import LLMConfig, model_config
    from qwen_fixtures import build_tiny_qwen3

    cache = tmp_path / "hub"
    snap = cache / "models--Org--Tiny-Qwen3" / "snapshots" / ("a" * 40)
    build_tiny_qwen3(snap, layers=2)
    (cache / "models--Org--Tiny-Qwen3" / "refs").mkdir()
    (cache / "models--Org--Tiny-Qwen3" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    q = model_config(LLMConfig(backend="jax", weights="Org/Tiny-Qwen3"))
    assert q.num_layers == 2 and q.hidden_size == 48
    from llm_jax.loader import load_params

    cfg, params = load_params("Org/Tiny-Qwen3")
    assert cfg.num_layers == 2 and params.layers.common.attn.q_norm.shape[0] == 2
    with pytest.raises(ConfigError, match="neither a folder nor a model in the Hugging Face"):
        model_config(LLMConfig(backend="jax", weights="Org/Missing"))


SIGNAL_IN_A_CALLBACK = """
import gc, os, signal
from rich.console import Console
from fused.runs.interrupts import interrupts_exit, stop_if_interrupted

def callback(phase, info):
    if phase == "start" and not getattr(callback, "sent", False):
        callback.sent = True
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(100))  # the handler runs here, inside the callback

with interrupts_exit(Console(), "python job.py"):
    gc.callbacks.append(callback)
    gc.collect()
    gc.callbacks.remove(callback)
    print("past the callback")
    stop_if_interrupted()
    print("ran to the end")
"""


def test_a_signal_landing_in_a_callback_still_stops_the_job():
    """A SIGTERM whose handler runs inside a garbage-collection callback (as one did inside
    jax's, 1 s into `label.py label`): an exception raised there is dropped by Python, so the
    job stops at its next safe point instead, with its one line and exit 130."""
    p = subprocess.run([sys.executable, "-c", SIGNAL_IN_A_CALLBACK], cwd=ROOT,
                       env=subprocess_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 130, (p.stdout, p.stderr)
    assert "past the callback" in p.stdout and "ran to the end" not in p.stdout
    assert "resume with `python job.py`" in p.stdout and "Traceback" not in p.stderr
    assert p.stderr.strip() == "SIGTERM: stopping after this batch (again to stop at once)"


@pytest.mark.slow
def test_sigint_during_generate_is_one_line_and_the_rerun_is_exact(dataset, tmp_path):
    out = tmp_path / "k"
    cmd = [sys.executable, str(ROOT / "label.py"), "generate", *GEN, "--min-return", "0",
           "--resume-seconds", "0", "--out", str(out)]
    # Ctrl-C in a terminal: the job must not inherit SIGINT ignored, as it does when the suite
    # itself runs as a background job of a script (`pytest ... &`), where it ran to its end.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if list((out / "work").glob("*/resume-*")):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout[-1500:], stderr[-1500:])
    assert "Traceback" not in stderr and "interrupted" in stdout and "label.py generate" in stdout
    p = run_command(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert Dataset(out).manifest()["shards"] == Dataset(dataset).manifest()["shards"]


@pytest.mark.slow
def test_damaged_checkpoint_is_one_warning_and_kept_aside(smoke_run, tmp_path):
    r = tmp_path / "r"
    shutil.copytree(smoke_run, r)
    latest = max(int(p.name) for p in (r / "checkpoints").iterdir() if p.name.isdigit())
    for f in (r / "checkpoints" / str(latest) / "state").rglob("d/*"):
        flip_byte(f)
    damaged = tree(r / "checkpoints" / str(latest))
    p = run("train.py", "--resume", str(r), "--total-timesteps", str(8 * 8 * 8))
    assert p.returncode == 0, p.stderr[-3000:]
    warnings = [x for x in (p.stdout + p.stderr).splitlines() if "warning" in x.lower()]
    assert len(warnings) == 1 and f"checkpoint {latest}" in warnings[0], p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    aside = next((r / "damaged-checkpoints").iterdir())
    assert tree(aside) == damaged  # kept, byte for byte
    assert f"resumed from checkpoint at update {latest - 2}" in p.stdout


@pytest.mark.slow
def test_run_stopped_before_its_first_checkpoint_resumes_from_zero(smoke_run, tmp_path):
    r = tmp_path / "r"
    r.mkdir()
    shutil.copy(smoke_run / "config.json", r / "config.json")
    msg = one_line_error(run("train.py", "smoke", "--out-dir", str(tmp_path), "--run-name", "r"))
    assert "stopped before its first checkpoint" in msg and "--resume" in msg
    msg = one_line_error(run("offline.py", "eval", "--run", str(r), "--episodes", "2"))
    assert "train.py --resume" in msg
    p = run("train.py", "--resume", str(r))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "no checkpoint yet" in p.stdout and "starting from update 0" in p.stdout
    assert (r / "checkpoints" / "6").is_dir()


@pytest.mark.slow
def test_eval_into_an_unwritable_run_fails_before_playing(smoke_run, tmp_path):
    r = tmp_path / "r"
    shutil.copytree(smoke_run, r)
    with read_only(r):
        t = time.time()
        msg = one_line_error(run("offline.py", "eval", "--run", str(r), "--episodes", "4"))
    assert "--run" in msg and "not writable" in msg
    assert not (r / "eval.json").exists()
    assert time.time() - t < 60


@pytest.mark.slow
def test_label_sigterm_then_rerun_and_a_damaged_label_shard_redone(dataset, tmp_path):
    """SIGTERM during `label`: one line with the resume command (exit 130); the rerun finishes.
    A flipped byte in one label shard: `verify` names it, rerunning `label` redoes that shard
    alone (the other shards' files keep their bytes) and everything verifies."""
    d = copy_of(dataset, tmp_path)
    cmd = [sys.executable, str(ROOT / "label.py"), "label", "--data", str(d), "--name", "h",
           "--llm.skip-n", "20", "--batch", "16", *LENGTHS]
    proc = subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300  # the signal once the first of its 4 label shards is in
    while time.time() < deadline and proc.poll() is None and not any(
            p.is_dir() for p in (d / "labels" / "h").glob("s*")):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout[-1500:], stderr[-1500:])
    assert "Traceback" not in stderr and "resume with `python label.py label" in stdout
    p = run_command(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    names = Dataset(d).shard_names()
    before = tree(d / "labels" / "h")
    flip_byte(data_file(d / "labels" / "h" / names[1], "hidden"))
    v = run("label.py", "verify", "--data", str(d))
    assert v.returncode == 1 and f"rerun `python label.py label --data {d} --name h" in v.stdout
    p = run_command(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0 and "1 redone" in p.stdout, (p.stdout[-1500:], p.stderr[-1500:])
    assert tree(d / "labels" / "h") == before  # the redone shard has its bytes back
    assert run("label.py", "verify", "--data", str(d)).returncode == 0


@pytest.mark.slow
def test_regenerated_shard_with_other_bytes_marks_derived_sets_stale(dataset, tmp_path):
    """A trajectory shard regenerated with bytes other than the manifest recorded (here: the
    recorded digest is what differs) keeps the returns set but marks it stale for that shard,
    with one line naming `returns`; reads refuse the stale shard; rerunning `returns` redoes
    it and clears the mark."""
    d = copy_of(dataset, tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    shard = m["shards"][1]["name"]
    m["shards"][1]["digest"] = "0" * 64  # as if generated with other bytes before
    (d / "manifest.json").write_text(json.dumps(m))
    p = run("label.py", "generate", *GEN, "--min-return", "0", "--out", str(d))
    assert p.returncode == 0, p.stderr[-3000:]
    stale_lines = [x for x in p.stdout.splitlines() if "stale" in x]
    assert len(stale_lines) == 1 and "python label.py returns --data" in stale_lines[0]
    assert Dataset(d).manifest()["returns"]["gamma0.9"]["stale"] == [shard]
    msg = one_line_error(run("offline.py", "bc", "smoke", "--data", str(d), "--out-dir",
                             str(tmp_path / "runs")))
    assert f"shard {shard} is stale" in msg
    p = run("label.py", "returns", "--data", str(d), "--gamma", "0.9")
    assert p.returncode == 0 and "1 rewritten" in p.stdout, p.stdout[-2000:]
    assert "stale" not in Dataset(d).manifest()["returns"]["gamma0.9"]
    assert run("label.py", "verify", "--data", str(d)).returncode == 0


def assert_one_typo_line(main, argv, named, nearest, capsys) -> None:
    """`main(argv)` exits with one line naming `named` and suggesting `nearest`, printing
    nothing else."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    out = capsys.readouterr()
    assert out.out == "" and out.err == "", out
    msg = str(e.value.code)
    assert msg.startswith("error: ") and "\n" not in msg, msg
    assert named in msg and f"did you mean {nearest}" in msg, msg


@pytest.mark.parametrize("module, argv, named, nearest", [
    ("train", ["--env.name", "Craftax-Clasic-Symbolic-v1"], "--env.name",
     "'Craftax-Classic-Symbolic-v1'"),
    ("train", ["cpu_pixels"], "no preset 'cpu_pixels'", "'cpu-pixels'"),
    ("train", ["smoke", "--ppo.num-step", "8"], "no flag --ppo.num-step", "'--ppo.num-steps'"),
    ("label", ["generate", "--num-env", "4"], "no flag --num-env", "'--num-envs'"),
    ("offline", ["awr", "--dat", "d"], "no flag --dat", "'--data'"),
    ("offline", ["awr", "cpux", "--data", "d"], "no preset 'cpux'", "'cpu'"),
    ("play", ["llm", "--env.name", "Craftax-Symbolic"], "--env.name", "'Craftax-Symbolic-v1'"),
    ("play", ["human", "--seeed", "3"], "no flag --seeed", "'--seed'"),
])
def test_typos_are_one_line_naming_the_closest_values(module, argv, named, nearest, capsys):
    """A mistyped preset, flag or choice: one line naming the closest valid ones (difflib),
    not tyro's box, before anything is set up."""
    import importlib

    main = importlib.import_module(f"fused.commands.{module}").main
    assert_one_typo_line(main, argv, named, nearest, capsys)


@pytest.mark.parametrize("argv, named, nearest", [
    (["generate", "--weights", "w", "--attention", "blocky"], "--attention 'blocky'",
     "'blocked'"),
    (["generate", "--weights", "w", "--cuda-graphs", "loop"], "--cuda-graphs 'loop'", "'loops'"),
    (["generate", "--promt", "hi"], "no flag --promt", "'--prompt'"),
    (["encode", "--pool", "last", "--post-norms"], "no flag --post-norms", "'--post-norm'"),
    (["generat", "--weights", "w"], "no subcommand 'generat'", "'generate'"),
])
def test_llm_jax_typos_are_one_line_too(argv, named, nearest, capsys):
    """`python -m llm_jax`'s subcommands, flags and choices mistyped: the same one line."""
    from llm_jax.__main__ import main

    assert_one_typo_line(main, argv, named, nearest, capsys)
    with pytest.raises(SystemExit) as e:  # no subcommand at all
        main(argv[1:])
    assert str(e.value.code).startswith("error: name a subcommand first"), e.value.code


def test_eval_of_a_run_that_is_not_there_leaves_nothing(tmp_path, monkeypatch):
    """`offline.py eval --run runs/does-not-exist`: one line, and no empty folder made."""
    from fused.commands.offline import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["eval", "--run", "runs/does-not-exist"])
    assert str(e.value.code).startswith("error: ") and "no config.json" in str(e.value.code)
    assert list(tmp_path.iterdir()) == []


def test_intervals_print_as_brackets():
    """A confidence interval with negative bounds reads as two numbers."""
    from fused.rl.evaluate import ci_text

    assert ci_text(-0.812, -0.19) == "[-0.81, -0.19]" and ci_text(1, 2.5) == "[1.00, 2.50]"
