"""label.py: datasets of whole episodes in zarr shards (generate), LLM label sets (label) and
returns-to-go (returns): hand-computed returns across shards, the episode assembler, resuming
after SIGKILL with identical bytes, two processes equal to one, labels equal to encoding the
prompt from scratch and to the online path's carried states, one-line errors."""

import json
import shutil
import signal
import subprocess
import sys
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rich.console import Console

from command_runner import run_command
from conftest import (ENCODE_LENGTHS, LENGTHS, ROOT, TWO_DEVICES, console_script, free_port,
                      subprocess_env)
from fused.data.config import ReturnsConfig
from fused.data.episodes import EpisodeAssembler
from fused.data.returns import compute_returns
from fused.data.store import Dataset, commit_group

QUIET = Console(quiet=True)
ENV = "Craftax-Classic-Symbolic-v1"
# 8 envs x 64 steps, episodes cut at 20 steps, 48-row shards: episodes cross shard boundaries.
SMOKE = ["smoke", "--env.max-episode-steps", "20", "--shard-rows", "48", "--seed", "5"]


def label_cmd(*args):
    return [sys.executable, str(ROOT / "label.py"), *args]


def manifest(path):
    return json.loads((path / "manifest.json").read_text())


def hand_dataset(root, shards: list[dict]) -> Dataset:
    """A dataset written through the store's own API from hand-made columns."""
    ds = Dataset(root)
    ds.write_card({"env": ENV, "generate": {}, "labels": {}, "returns": {}})
    entries = []
    for i, cols in enumerate(shards):
        n = len(cols["reward"])
        full = {"terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool),
                "value": np.zeros(n, np.float32), "truncation_value": np.zeros(n, np.float32),
                **cols}
        kinds = {"reward": np.float32, "value": np.float32, "truncation_value": np.float32,
                 "terminated": bool, "truncated": bool}
        full = {k: np.asarray(v, kinds.get(k)) for k, v in full.items()}
        (root / "shards").mkdir(parents=True, exist_ok=True)
        entries.append(commit_group(ds.shard_dir(f"s000-{i:06d}"), full))
    ds.write_manifest({"shards": entries, "labels": {}, "returns": {}})
    return ds


def test_returns_by_hand_across_three_shards(tmp_path):
    """Episode 7 runs through all three shards (7 rows, terminated); episode 3 ends by the time
    limit in shard 0 (bootstrapped from V(final obs) = 10); episode 9 is cut by the end of the
    data. gamma = 0.5."""
    ds = hand_dataset(tmp_path / "d", [
        {"episode_id": [3, 3, 7, 7], "reward": [1, 2, 0, 1], "truncated": [0, 1, 0, 0],
         "truncation_value": [0, 10, 0, 0]},
        {"episode_id": [7, 7, 7], "reward": [0, 2, 0]},
        {"episode_id": [7, 7, 9, 9], "reward": [4, 8, 1, 1], "terminated": [0, 1, 0, 0],
         "value": [0, 0, 0, 6]},
    ])
    compute_returns(ReturnsConfig(data=str(ds.root), gamma=0.5), QUIET)
    got = np.concatenate([ds.read_returns("gamma0.5", f"s000-{i:06d}")["rtg"] for i in range(3)])
    # ep 3: last = 2 + .5 * 10 = 7; first = 1 + .5 * 7 = 4.5
    # ep 7 (0, 1, 0, 2, 0, 4, 8): from the end 8, 4 + 4 = 8, 0 + 4 = 4, 2 + 2 = 4,
    #      0 + 2 = 2, 1 + 1 = 2, 0 + 1 = 1
    # ep 9 (cut): 1, 1 + .5 = 1.5, flagged
    np.testing.assert_allclose(got, [4.5, 7, 1, 2, 2, 4, 4, 8, 8, 1.5, 1], rtol=1e-6)
    valid = np.concatenate([ds.read_returns("gamma0.5", f"s000-{i:06d}")["valid"]
                            for i in range(3)])
    assert valid.tolist() == [True] * 9 + [False] * 2
    card = ds.card()["returns"]["gamma0.5"]
    assert card["episodes"] == 3 and card["episodes_incomplete"] == 1
    # bootstrap: the cut episode ends with its last row's stored value 6: 6, 1 + 3 = 4
    compute_returns(ReturnsConfig(data=str(ds.root), gamma=0.5, incomplete="bootstrap",
                                  name="boot"), QUIET)
    last = ds.read_returns("boot", "s000-000002")
    np.testing.assert_allclose(last["rtg"], [8, 8, 4, 6])
    assert last["valid"].all() and not last["complete"][2:].any()


def block(t, n, done_at, offset, reward=1.0):
    """Columns [t, n] of a synthetic block: env e ends an episode at the steps done_at[e];
    `row` numbers the (step, env) pairs time-major from `offset`."""
    done = np.zeros((t, n), bool)
    for e, steps in done_at.items():
        done[steps, e] = True
    return {"reward": np.full((t, n), reward, np.float32), "terminated": done,
            "truncated": np.zeros((t, n), bool),
            "row": offset + np.arange(t * n).reshape(t, n).astype(np.int32)}


def test_episode_assembler_keeps_whole_episodes_and_resumes():
    """Episodes leave in the order they end (ties by env), whole and contiguous, cut into
    fixed shards; --min-return drops short ones and the cut ones; a state saved mid-way and
    restored continues with the same shards."""
    blocks = [block(4, 2, {0: [1], 1: [3]}, 0), block(4, 2, {0: [2]}, 8),
              block(4, 2, {1: [0, 3]}, 16)]

    def run(min_return, restore_after=None):
        asm = EpisodeAssembler(2, shard_rows=3, stream=1, num_streams=2, min_return=min_return)
        shards = []
        for i, b in enumerate(blocks):
            shards += list(asm.add_block(b))
            if i == restore_after:
                rows, meta = asm.state()
                asm = EpisodeAssembler(2, 3, 1, 2, min_return)
                asm.restore(rows, json.loads(json.dumps(meta)))
        shards += list(asm.finish())
        return shards, asm.stats

    shards, stats = run(None)
    rows = np.concatenate([s["row"] for s in shards])
    ids = np.concatenate([s["episode_id"] for s in shards])
    # env 0: rows 0,2 (ends t1); env 1: 1,3,5,7 (t3); env 0: 4,6,8,10,12 (t2 of block 2 = t6);
    # env 1: 9,11,13,15,17 (t8); env 1: 19,21,23 (t11); env 0 cut: 14, 16, 18, 20, 22
    assert rows.tolist() == [0, 2, 1, 3, 5, 7, 4, 6, 8, 10, 12, 9, 11, 13, 15, 17, 19, 21, 23,
                             14, 16, 18, 20, 22]
    assert ids.tolist() == [1] * 2 + [3] * 4 + [5] * 5 + [7] * 5 + [9] * 3 + [11] * 5
    assert [len(s["row"]) for s in shards] == [3] * 8
    assert stats["episodes_finished"] == 5 and stats["episodes_incomplete"] == 1
    filtered, fstats = run(min_return=4.0)
    assert np.concatenate([s["row"] for s in filtered]).tolist() == [
        1, 3, 5, 7, 4, 6, 8, 10, 12, 9, 11, 13, 15, 17]
    assert fstats["rows_dropped"] == 10 and fstats["episodes_kept"] == 3
    resumed, _ = run(None, restore_after=1)
    for a, b in zip(shards, resumed):
        assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def smoke_data(tmp_path_factory):
    """A random-policy Classic dataset generated by the CLI (once per module)."""
    out = tmp_path_factory.mktemp("data") / "d"
    p = run_command(label_cmd("generate", *SMOKE, "--out", str(out)), env=subprocess_env(),
                    capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


@pytest.mark.slow
def test_generated_rows_are_whole_ordered_episodes(smoke_data):
    ds = Dataset(smoke_data)
    m, card = ds.manifest(), ds.card()
    assert card["counts"]["rows"] == 8 * 64 == sum(s["rows"] for s in m["shards"])
    assert [s["rows"] for s in m["shards"]] == [48] * 10 + [32]
    cols = {k: np.concatenate([ds.read(s["name"], [k])[k] for s in m["shards"]])
            for k in ("episode_id", "step", "t", "env", "terminated", "truncated", "reward",
                      "unlocked", "log_prob", "value", "obs_aux")}
    start = np.r_[True, cols["episode_id"][1:] != cols["episode_id"][:-1]]
    assert (cols["step"][start] == 0).all()  # episodes start at their step 0 ...
    assert (np.diff(cols["step"])[~start[1:]] == 1).all()  # ... and are contiguous
    assert (np.diff(cols["t"])[~start[1:]] == 1).all()
    assert len(np.unique(cols["episode_id"])) == start.sum()  # each episode in one piece
    last = np.r_[start[1:], True]
    ended = cols["terminated"] | cols["truncated"]
    assert not (ended & ~last).any() and ended.sum() == card["counts"]["episodes_finished"]
    cut = np.flatnonzero(last & ~ended)  # 64 = 3 x 20 + 4: every env's last 4 steps, at the end
    assert len(cut) == card["counts"]["episodes_incomplete"] == 8
    assert cut.tolist() == np.flatnonzero(last)[-8:].tolist()
    assert (cols["truncated"][last & ended] == (cols["step"][last & ended] == 19)).all()
    np.testing.assert_allclose(cols["log_prob"], -np.log(17), rtol=1e-6)
    assert np.isnan(cols["value"]).all()  # a random policy has no critic
    # Classic: +1 per achievement unlocked, + 0.1 x change in health
    n_unlocked = np.unpackbits(cols["unlocked"], axis=-1).sum(-1)
    frac = (cols["reward"] - n_unlocked) / 0.1
    np.testing.assert_allclose(frac, np.round(frac), atol=1e-3)


@pytest.mark.slow
def test_sigkill_then_rerun_writes_identical_bytes(smoke_data, tmp_path):
    """Killed at a random moment (after a few commits), the same command finishes with every
    shard once and the digests of the uninterrupted run; a damaged shard is found by its
    digest (one warning) and redone."""
    env = subprocess_env()
    out = tmp_path / "k"
    cmd = label_cmd("generate", *SMOKE, "--resume-seconds", "0", "--out", str(out))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if len(list((out / "shards").glob("s*"))) >= 4:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists(), "finished before it could be killed"
    assert list((out / "work").glob("*/resume-*")), "no resume point to continue from"
    p = run_command(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert manifest(out)["shards"] == manifest(smoke_data)["shards"]
    victim = next((out / "shards" / "s000-000003").rglob("c/*"))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    p = run_command(label_cmd("generate", *SMOKE, "--out", str(out)), env=env,
                    capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    warned = [x for x in p.stderr.splitlines() if "s000-000003" in x and "damaged" in x]
    assert len(warned) == 1, p.stderr
    assert manifest(out)["shards"] == manifest(smoke_data)["shards"]


@pytest.mark.slow
def test_two_processes_equal_one(tmp_path):
    """Two processes on localhost (jax.distributed, gloo) split the streams and the label
    shards; the dataset and its labels equal a one-process run's, digest for digest; so do
    two --part runs (a job array) finished by the command without --part."""
    args = ["generate", *SMOKE, "--streams", "2", "--steps", "32"]  # 3 shards a stream
    lab = ["label", "--name", "h", "--llm.skip-n", "5", "--batch", "16", *LENGTHS]
    one, two = tmp_path / "one", tmp_path / "two"
    env = subprocess_env()
    for cmd in (args + ["--out", str(one)], lab + ["--data", str(one)]):
        run_command(label_cmd(*cmd), env=env, check=True, capture_output=True, timeout=600)
    for cmd in (args + ["--out", str(two)], lab + ["--data", str(two)]):
        port = free_port()
        procs = [subprocess.Popen(label_cmd(*cmd), env=dict(
            env, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
            JAX_PROCESS_ID=str(i)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for i in range(2)]
        outs = [p.communicate(timeout=600)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), outs[0][-2000:] + outs[1][-2000:]
    a, b = manifest(one), manifest(two)
    assert len(a["shards"]) == 6 and a["shards"] == b["shards"]
    assert a["labels"]["h"] == b["labels"]["h"]
    # a SLURM job array: independent parts, then the command without --part finishes
    arr = tmp_path / "array"
    for cmd in (args + ["--out", str(arr)], lab + ["--data", str(arr)]):
        for part in ("1/2", "0/2"):
            p = run_command(label_cmd(*cmd, "--part", part), env=env, capture_output=True,
                            text=True, timeout=600)
            assert p.returncode == 0, p.stderr[-2000:]
            if cmd[0] == "generate":
                assert not (arr / "manifest.json").exists()
        run_command(label_cmd(*cmd), env=env, check=True, capture_output=True, timeout=600)
    c = manifest(arr)
    assert c["shards"] == a["shards"] and c["labels"]["h"] == a["labels"]["h"]


@pytest.mark.slow
def test_bad_inputs_are_one_line_errors(tmp_path):
    env = subprocess_env()

    def error(*args):
        p = run_command(label_cmd(*args), env=env, capture_output=True, text=True,
                        timeout=300)
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        assert p.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), \
            p.stderr[-2000:]
        return lines[0]

    assert "no card.json" in error("label", "--data", str(tmp_path / "nothing"))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "card.json").write_text('{"format": "something/else"}')
    assert "not a craftax-fused" in error("returns", "--data", str(foreign))
    ds = hand_dataset(tmp_path / "d", [{"episode_id": [1, 1], "reward": [0, 1]}])
    assert "env_name='Craftax-Symbolic-v1'" in error(
        "label", "--data", str(ds.root), "--env-name", "Craftax-Symbolic-v1")
    assert "llm.weights" in error("label", "--data", str(ds.root), "--llm.weights",
                                  str(tmp_path))
    assert "llm.skip_n=0" in error("label", "--data", str(ds.root), "--llm.skip-n", "0")
    manifest_ = ds.manifest()
    manifest_["labels"]["h"] = {"shards": []}
    ds.write_manifest(manifest_)
    assert "does not say how it was made" in error("label", "--data", str(ds.root), "--name",
                                                   "h")
    assert "gamma=1.5" in error("returns", "--data", str(ds.root), "--gamma", "1.5")
    assert "holds a dataset" in error("generate", "smoke", "--out", str(ds.root))
    assert "streams=3" in error("generate", "smoke", "--out", str(tmp_path / "x"), "--streams",
                                "3")
    assert "part='2/2'" in error("generate", "smoke", "--out", str(tmp_path / "x"), "--part",
                                 "2/2")
    assert "overwrite with part" in error("label", "--data", str(ds.root), "--name", "g",
                                          "--part", "0/2", "--overwrite")
    # a policy folder that is not a run: the flag named, `random` offered (here alone), and
    # no dataset folder left behind
    assert error("generate", "smoke", "--out", str(tmp_path / "y"), "--policy",
                 str(tmp_path / "nothing")) == (
        f"error: --policy {tmp_path / 'nothing'}: no config.json there; pass a run folder "
        "written by train.py or offline.py, or `random`")
    assert not (tmp_path / "y").exists()


def test_disk_full_keeps_committed_shards(tmp_path, monkeypatch):
    """A write that fails half-way (ENOSPC) leaves no shard behind it marked done."""
    import errno

    import fused.data.store as store

    real = store.write_group
    calls = []

    def failing(folder, columns, attrs=None):
        calls.append(folder)
        if len(calls) == 2:
            real(folder, {k: v[:1] for k, v in columns.items()})  # a partial write, then full
            raise OSError(errno.ENOSPC, "No space left on device", str(folder))
        real(folder, columns, attrs)

    monkeypatch.setattr(store, "write_group", failing)
    ds = Dataset(tmp_path)
    (tmp_path / "shards").mkdir()
    cols = {"reward": np.arange(5, dtype=np.float32)}
    store.commit_group(ds.shard_dir("s000-000000"), cols)
    with pytest.raises(OSError):
        store.commit_group(ds.shard_dir("s000-000001"), cols)
    assert [p.name for p in (tmp_path / "shards").iterdir()] == ["s000-000000"]
    assert store.committed(ds.shard_dir("s000-000000")) is not None


@pytest.fixture(scope="module")
def tiny_llm():
    """The tiny random Qwen3 (seed 0) the commands here encode with, at conftest's lengths (its
    weights and prefix cache made once for the module's two tests)."""
    from fused.llm.config import LLMConfig
    from fused.llm.encoders import make_encoder

    return make_encoder(LLMConfig(backend="jax", encode_lengths=ENCODE_LENGTHS), ENV)


@pytest.mark.slow
def test_labels_equal_encoding_from_scratch_and_the_online_carry(smoke_data, tiny_llm,
                                                                 tmp_path):
    """A label set at skip 7 (float16), encoded on 2 devices (`label.py label` in a process that
    sees two): every row's state equals what the online policy input (llm_step, refreshing at
    once) holds for that env at that step, replayed over the same observations; and labelled
    rows equal the full prompt encoded from scratch."""
    from fused.llm.config import LLMConfig
    from fused.llm.encoders import make_encoder
    from fused.llm.policy_input import init_llm_state, llm_step
    from fused.rl.obs_codec import ObsCodec
    from fused.envspec import spec
    from fused.text.format import render_text
    from fused.text.prompt import full_prompt
    from llm_jax.model import encode

    data = tmp_path / "d"
    shutil.copytree(smoke_data, data)
    # The command, not `label()` in this process: it labels at XLA's O1 (tests/startup/
    # sitecustomize.py), where this process runs the encodes at O0, ~3x slower (in-process
    # here: 20-24 CPU s, the command ~13); its 2 devices split each batch's rows.
    env = subprocess_env()
    p = run_command(label_cmd("label", "--data", str(data), "--name", "h", "--llm.skip-n", "7",
                              "--dtype", "float16", "--batch", "16", *LENGTHS),
                    env=dict(env, XLA_FLAGS=f"{env.get('XLA_FLAGS', '')} {TWO_DEVICES}"),
                    capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    ds = Dataset(data)
    names = ds.shard_names()
    cols = {k: np.concatenate([ds.read(n, [k])[k] for n in names])
            for k in ("t", "env", "step", "obs_bits", "obs_aux")}
    labels = [ds.read_labels("h", n) for n in names]
    hidden = np.concatenate([lab["hidden"][lab["label_row"]] for lab in labels]).astype(
        np.float32)
    obs = ObsCodec(spec(ENV)).decode(np, cols)
    grid = np.zeros((64, 8), np.int64)  # row of (t, env)
    grid[cols["t"], cols["env"]] = np.arange(len(obs))
    llm = make_encoder(LLMConfig(backend="jax", skip_n=7, refresh_wait=1, refresh_batch=8,
                                 encode_lengths=ENCODE_LENGTHS), ENV, like=tiny_llm)
    # (the frozen arrays as an argument, as the trainer passes them: closed over, the weights
    # are constants of the program, ~160 MB of HLO text, and it compiled 2.5x slower)
    jitted = jax.jit(lambda f, s, o, d, t: llm_step(llm, f, s, o, d, t,
                                                    jax.random.PRNGKey(0), 8, 8)[0])
    step = partial(jitted, llm.frozen)
    state = init_llm_state(llm.hidden_size, 8)
    scale = np.abs(hidden).max()
    for t in range(64):
        rows = grid[t]
        started = jnp.asarray((cols["step"][rows] == 0) & (t > 0))  # the previous step ended it
        state = step(state, jnp.asarray(obs[rows]), started, jnp.int32(t))
        np.testing.assert_allclose(hidden[rows], np.asarray(state.hidden), atol=2e-3 * scale,
                                   err_msg=f"t={t}")
    # some shards start mid-way between labels: their first state was encoded from a row of an
    # earlier shard (and matched the online path above)
    firsts = [ds.read(n, ["t", "step"], slice(0, 1)) for n in names]
    assert sum(f["t"][0] % 7 != 0 and f["step"][0] != 0 for f in firsts) >= 2
    tok = llm.tokenizer
    for r in grid[[0, 7, 14], 3]:
        ids = tok.encode(full_prompt(tok, ENV, render_text(spec(ENV).layout, obs[r])))
        want = encode(llm.frozen.params, llm.qcfg, jnp.asarray([ids]), jnp.array([len(ids)]),
                      llm.layer, "last")[0]
        np.testing.assert_allclose(hidden[r], np.asarray(want), atol=2e-3 * scale)
    card = ds.card()["labels"]["h"]
    assert card["skip_n"] == 7 and card["dtype"] == "float16" and card["layer"] == 2
    assert card["weights_digest"] == "random:tiny:seed0" and len(card["prompt_digest"]) == 64


@pytest.mark.slow
def test_generate_from_a_trained_run_with_epsilon(smoke_run, tmp_path):
    """A train.py run folder as the behaviour policy, mixed with uniform actions: the stored
    log-probs are the mixture's, the values the run's critic, both recomputed here from the
    checkpoint's parameters on the stored observations. (The sizes and epsilon of the manual's
    `--out data/ppo` in tests/test_readme.py: one program for the two.)"""
    from fused.envspec import spec
    from fused.trained_policy import load_policy
    from fused.rl.obs_codec import ObsCodec

    env = subprocess_env()
    shutil.copytree(smoke_run, tmp_path / "run")  # `train.py smoke --run-name run`
    out = tmp_path / "d"
    p = subprocess.run([console_script("craftax-label"), "generate", "smoke", "--policy",
                        str(tmp_path / "run"), "--epsilon", "0.05", "--env.reset-pool", "8",
                        "--env.max-episode-steps", "16", "--out", str(out)],
                       env=dict(env, JAX_LOG_COMPILES="1"), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]  # (the console script: 0 once done)
    # its blocks compile once: the first block's inputs are committed, as the later ones' are
    # (jax logs the compile whether or not the persistent cache held it)
    blocks = p.stderr.count("Finished XLA compilation of jit(block)")
    assert blocks == 1 and p.stderr.count("Compiling jit(block)") == 1, blocks
    ds = Dataset(out)
    card = ds.card()
    assert card["policy"] == str(tmp_path / "run") and card["checkpoint"] == 6
    assert card["epsilon"] == 0.05 and card["run_config"]["policy"]["layer_width"] == 32
    cols = ds.read(ds.shard_names()[1])
    pol = load_policy(tmp_path / "run", 8)
    net = pol.agent.network
    obs = ObsCodec(spec(ENV)).decode(np, cols)
    logits, value = net.apply(pol.params, jnp.asarray(obs))
    probs = 0.95 * np.asarray(jax.nn.softmax(logits)) + 0.05 / 17
    want = np.log(probs[np.arange(len(obs)), cols["action"]])
    np.testing.assert_allclose(cols["log_prob"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cols["value"], np.asarray(value), rtol=1e-5, atol=1e-6)
    bad = run_command(label_cmd("generate", "smoke", "--policy", str(tmp_path / "run"),
                                "--env.name", "Craftax-Symbolic-v1", "--out",
                                str(tmp_path / "e")), env=env, capture_output=True,
                      text=True, timeout=300)
    assert bad.returncode != 0 and "was trained on 'Craftax-Classic" in bad.stderr


@pytest.mark.slow
def test_an_llm_run_records_the_hidden_states_it_acted_on(llm_smoke_run, tiny_llm, tmp_path):
    """Generating with an LLM-augmented run (conftest's shared `train.py smoke --llm.backend
    jax ...`): the label set `behaviour` holds, for every row, the raw hidden state the policy
    acted on; at stream step 0 every env's is the encoding of its first observation."""
    from fused.envspec import spec
    from fused.rl.obs_codec import ObsCodec

    env = subprocess_env()
    shutil.copytree(llm_smoke_run, tmp_path / "run")
    out = tmp_path / "d"
    p = run_command(label_cmd("generate", "smoke", "--policy", str(tmp_path / "run"),
                              "--steps", "32", "--out", str(out)), env=env,
                    capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    ds = Dataset(out)
    assert ds.manifest()["labels"]["behaviour"]["shards"][0]["rows"] == 128
    assert ds.card()["labels"]["behaviour"]["llm"]["backend"] == "jax"
    names = ds.shard_names()
    cols = {k: np.concatenate([ds.read(n, [k])[k] for n in names])
            for k in ("t", "obs_bits", "obs_aux")}
    hidden = np.concatenate([ds.read_labels("behaviour", n)["hidden"] for n in names])
    first = np.flatnonzero(cols["t"] == 0)
    assert len(first) == 8 and len(hidden) == len(cols["t"])
    obs = ObsCodec(spec(ENV)).decode(np, {k: v[first] for k, v in cols.items()})
    llm = tiny_llm  # LLMConfig(backend="jax") at conftest's lengths
    want = jax.jit(lambda f, o: llm.encode(f, o, 8)[0])(llm.frozen, jnp.asarray(obs))
    got = hidden[first].astype(np.float32)
    np.testing.assert_allclose(got, np.asarray(want), atol=1e-2 * np.abs(want).max())
    # the same on 2 devices (envs split, the checkpoint's parameters and normaliser replicated
    # over them): the same actions and episodes, values and states up to float rounding
    two = tmp_path / "d2"
    p = run_command(label_cmd("generate", "smoke", "--policy", str(tmp_path / "run"),
                              "--steps", "32", "--out", str(two)),
                    env=dict(env, XLA_FLAGS=f"{env.get('XLA_FLAGS', '')} {TWO_DEVICES}"),
                    capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    ds2 = Dataset(two)
    assert "2 devices" in p.stdout and ds2.shard_names() == names
    for n in names:
        a, b = ds.read(n), ds2.read(n)
        assert a.keys() == b.keys()
        for k in a:
            if k in ("value", "log_prob"):
                np.testing.assert_allclose(b[k], a[k], rtol=1e-5, atol=1e-5, err_msg=k)
            else:
                np.testing.assert_array_equal(b[k], a[k], err_msg=k)
        np.testing.assert_allclose(
            ds2.read_labels("behaviour", n)["hidden"].astype(np.float32),
            ds.read_labels("behaviour", n)["hidden"].astype(np.float32),
            atol=1e-2 * np.abs(want).max())


@pytest.mark.parametrize("value, fix", [(np.nan, "no critic"), (0.5, "--incomplete bootstrap")])
def test_data_with_every_episode_cut_names_the_fix_that_applies(tmp_path, value, fix):
    """Training data without one valid return-to-go: the error suggests bootstrapping only when
    the behaviour policy had a critic (random and LLM play store no values)."""
    from fused.data.loader import no_return_error

    ds = hand_dataset(tmp_path / "d", [{"episode_id": [1, 1], "reward": [0, 1],
                                        "value": [np.nan, np.nan]},
                                       {"episode_id": [1, 1], "reward": [0, 1],
                                        "value": [np.nan, value]}])
    msg = str(no_return_error(ds, ds.shard_names()))
    assert "no row has a valid return-to-go" in msg and fix in msg
    assert ("--incomplete bootstrap" in msg) == (fix != "no critic")
