"""offline.py: AWR / BC losses against hand-computed values, BC recovering a known behaviour
policy, AWR preferring the better action, exact resume, the unbiased evaluation estimator
against "first K finished", eval.json of an offline and an online run, one-line errors. (An
LLM-augmented run on a label set, its normaliser against numpy, its evaluation, a label set of
another prompt: the README walkthrough, tests/test_readme.py.)"""

import json
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from command_runner import run_command
from conftest import ROOT, subprocess_env
from rich.console import Console

from fused.rl.config import EnvConfig
from fused.data.config import ReturnsConfig
from fused.data.returns import compute_returns
from fused.data.store import Dataset, commit_group
from fused.trained_policy import load_policy
from fused.rl.awr import AWRSettings, awr_weights, offline_loss
from fused.rl.envs import make_env
from fused.rl.evaluate import make_evaluate, mean_ci95
from fused.rl.acting import random_policy
from fused.rl.policy_input import Identity
from fused.rl.vec_env import VecEnv
from test_cli_resume import two_device_smoke_run  # noqa: F401  (a session fixture: one run)

QUIET = Console(quiet=True)
ENV = "Craftax-Classic-Symbolic-v1"


def offline_main(*args):
    from fused.commands import offline

    return offline.main(list(args))


def test_awr_weights_and_losses_by_hand():
    adv = jnp.array([1.0, -1.0, 3.0, 1.0])  # mean 1: centred (0, -2, 2, 0)
    w = awr_weights(adv, beta=2.0, max_weight=2.0)
    np.testing.assert_allclose(w, [1.0, np.exp(-1.0), 2.0, 1.0], rtol=1e-6)  # e^1 clipped
    # Two rows, two actions; the "network" returns fixed logits and values.
    logits = jnp.array([[0.0, 0.0], [np.log(3.0), 0.0]])  # pi(row 1) = (0.75, 0.25)
    value = jnp.array([1.0, 3.0])
    action, rtg = jnp.array([1, 0]), jnp.array([2.0, 2.0])
    forward = lambda p, x: (p["logits"], p["v"])  # noqa: E731
    params = {"logits": logits, "v": value}
    # A = (1, -1), centred the same; beta 1: w = (e, e^-1), max 20 not reached
    s = AWRSettings("awr", beta=1.0, max_weight=20.0, value_coef=0.5)
    loss, m = offline_loss(forward, s, params, None, action, rtg)
    actor_loss = -(np.e * np.log(0.5) + np.exp(-1) * np.log(0.75)) / 2
    critic_loss = 0.5 * (1 + 1) / 2
    np.testing.assert_allclose(m["loss/actor"], actor_loss, rtol=1e-6)
    np.testing.assert_allclose(m["loss/value"], critic_loss, rtol=1e-6)
    np.testing.assert_allclose(loss, actor_loss + 0.5 * critic_loss, rtol=1e-6)
    bc, mb = offline_loss(forward, s._replace(algo="bc"), params, None, action, rtg)
    np.testing.assert_allclose(mb["loss/actor"], -(np.log(0.5) + np.log(0.75)) / 2, rtol=1e-6)
    np.testing.assert_allclose(bc, mb["loss/actor"] + 0.5 * critic_loss, rtol=1e-6)
    # the weights carry no gradient: d(actor loss)/d(value) is 0, only the critic's term
    g = jax.grad(lambda p: offline_loss(forward, s, p, None, action, rtg)[0])(params)
    np.testing.assert_allclose(g["v"], 0.5 * -(rtg - value) / 2, rtol=1e-6)
    # A mask (a recurrent policy's windows) leaves rows out of every mean: a third row masked
    # out changes nothing, its weight included (it would move the centring).
    params3 = {"logits": jnp.concatenate([logits, jnp.array([[5.0, 0.0]])]),
               "v": jnp.append(value, -50.0)}
    masked, mm = offline_loss(forward, s, params3, None, jnp.append(action, 1),
                              jnp.append(rtg, 9.0), jnp.array([True, True, False]))
    np.testing.assert_allclose(mm["loss/actor"], actor_loss, rtol=1e-6)
    np.testing.assert_allclose(masked, actor_loss + 0.5 * critic_loss, rtol=1e-6)
    np.testing.assert_allclose(mm["weight/max"], np.e, rtol=1e-6)


def probe_dataset(root, env: str, obs, action, reward, shard_rows=1000, terminated=None,
                  episode_id=None):
    """Episodes written with the store's own API, with a returns set from `label.py returns`:
    one step each (every row terminated), unless `terminated` and `episode_id` say otherwise."""
    n = len(action)
    terminated = np.ones(n, bool) if terminated is None else terminated
    episode_id = np.arange(n, dtype=np.int64) if episode_id is None else episode_id
    ds = Dataset(root)
    ds.write_card({"env": env, "generate": {}, "labels": {}, "returns": {}})
    (root / "shards").mkdir(parents=True)
    entries = []
    for i, s in enumerate(range(0, n, shard_rows)):
        sl = slice(s, min(n, s + shard_rows))
        k = sl.stop - sl.start
        entries.append(commit_group(ds.shard_dir(f"s000-{i:06d}"), {
            "obs": obs[sl].astype(np.float32), "action": action[sl].astype(np.uint8),
            "reward": reward[sl].astype(np.float32), "terminated": terminated[sl],
            "truncated": np.zeros(k, bool), "value": np.zeros(k, np.float32),
            "truncation_value": np.zeros(k, np.float32),
            "episode_id": episode_id[sl].astype(np.int64),
            "step": np.zeros(k, np.int32), "t": np.zeros(k, np.int32)}))
    ds.write_manifest({"shards": entries, "labels": {}, "returns": {}})
    compute_returns(ReturnsConfig(data=str(root), gamma=0.99), QUIET)
    return ds


def action_probs(run, obs):
    pol = load_policy(run, len(obs))
    net = pol.agent.network
    logits = net.apply(pol.params, jnp.asarray(obs, jnp.float32), method=type(net).actor)
    return np.asarray(jax.nn.softmax(logits))


SIGNS = np.array([[1.0, 1.0], [-1.0, 1.0]])


@pytest.fixture(scope="module")
def probe_data(tmp_path_factory):
    """probe-obs-action states; behaviour P(a=1 | +1) = 0.8, P(a=1 | -1) = 0.3; the reward
    is +1 for the action matching the sign (1 for +1, 0 for -1), else -1."""
    rng = np.random.default_rng(0)
    n = 4000
    sign = rng.choice([-1.0, 1.0], n)
    action = (rng.random(n) < np.where(sign > 0, 0.8, 0.3)).astype(np.int32)
    reward = np.where((action == 1) == (sign > 0), 1.0, -1.0)
    obs = np.stack([sign, np.ones(n)], 1)
    return probe_dataset(tmp_path_factory.mktemp("probe") / "d", "probe-obs-action", obs,
                         action, reward).root


@pytest.mark.slow
def test_bc_recovers_the_behaviour_policy_and_awr_prefers_the_better_action(probe_data,
                                                                           tmp_path):
    common = ["smoke", "--data", str(probe_data), "--out-dir", str(tmp_path),
              "--num-updates", "600", "--lr", "3e-3", "--batch-size", "256"]
    bc = offline_main("bc", *common, "--run-name", "bc")
    awr = offline_main("awr", *common, "--run-name", "awr", "--beta", "0.5", "--plot")
    p_bc = action_probs(bc, SIGNS)[:, 1]
    np.testing.assert_allclose(p_bc, [0.8, 0.3], atol=0.05)
    p_awr = action_probs(awr, SIGNS)
    assert p_awr[0, 1] > 0.9 and p_awr[1, 0] > 0.9, p_awr  # the rewarded action per sign
    rows = [json.loads(x) for x in (awr / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == list(range(1, 601))
    assert (awr / "curve.png").is_file() and not (awr / "policy.json").exists()
    agent = json.loads((awr / "config.json").read_text())["agent"]  # one config per run
    assert agent["env"]["name"] == "probe-obs-action" and agent["policy"]["layer_width"] == 32

    # A run folder of the version before (the policy in policy.json, widths under ppo. and at
    # the top level) acts the same.
    old = tmp_path / "old"
    shutil.copytree(awr, old)
    cfg = json.loads((old / "config.json").read_text())
    cfg.pop("agent")
    policy = cfg.pop("policy")
    cfg.update(layer_width=policy.pop("layer_width"), num_layers=policy.pop("num_layers"),
               policy=policy)
    (old / "config.json").write_text(json.dumps(cfg))
    acting = {"env": dict(agent["env"], num_envs=1), "policy": {"kind": policy["kind"]},
              "ppo": {"layer_width": 32, "num_layers": agent["policy"]["num_layers"]},
              "llm": agent["llm"], "seed": 0}
    (old / "policy.json").write_text(json.dumps(acting))
    np.testing.assert_array_equal(action_probs(old, SIGNS), p_awr)


@pytest.mark.slow
def test_resume_is_exact(probe_data, tmp_path):
    """300 updates then resumed to 600 == 600 straight: same checkpoint digest."""
    common = ["smoke", "--data", str(probe_data), "--out-dir", str(tmp_path)]
    straight = offline_main("awr", *common, "--run-name", "a", "--num-updates", "600")
    part = offline_main("awr", *common, "--run-name", "b", "--num-updates", "300")
    offline_main("awr", "--resume", str(part), "--num-updates", "600")
    assert digest(part, 600) == digest(straight, 600)
    rows = [json.loads(x)["update"] for x in (part / "metrics.jsonl").read_text().splitlines()]
    assert rows == list(range(1, 601))


def digest(run, step):
    return json.loads((run / "checkpoints" / str(step) / "meta" / "metadata").read_text())[
        "digest"]


def first_k_finished(env_name: str, k: int, seed: int) -> float:
    """The prior evaluation: k envs with auto-reset, stop at the first k episodes to finish."""
    cfg = EnvConfig(name=env_name, num_envs=k, reset="auto")
    venv = VecEnv(make_env(cfg), cfg)
    state = venv.reset(jax.random.split(jax.random.PRNGKey(seed), k), jax.random.PRNGKey(1))
    step = jax.jit(venv.step)
    returns, running = [], np.zeros(k)
    key = jax.random.PRNGKey(seed + 1)
    while len(returns) < k:
        key, ka, ks, kp = jax.random.split(key, 4)
        action = jax.random.randint(ka, (k,), 0, 2)
        state, out = step(jax.random.split(ks, k), kp, state, action)
        running += np.asarray(out.reward)
        for e in np.flatnonzero(np.asarray(out.terminated | out.truncated)):
            returns.append(running[e])
            running[e] = 0
    return float(np.mean(returns[:k]))


def test_evaluation_is_unbiased_where_first_k_finished_is_not():
    """probe-lengths: half the episodes return 1 (1 step), half 8 (8 steps): E[return] 4.5."""
    env = make_env(EnvConfig(name="probe-lengths", num_envs=1))
    n = 2000
    uniform = random_policy(2)
    ev = make_evaluate(env, uniform, Identity(), n, 4)
    s = jax.jit(ev.init)(jax.random.PRNGKey(0), None)
    while not bool(s.done.all()):
        s = jax.jit(ev.block)(s, None, None)
    m, lo, hi = mean_ci95(np.asarray(s.ret))
    assert lo < 4.5 < hi and hi - lo < 0.5
    assert sorted(set(np.asarray(s.length).tolist())) == [1, 8]
    biased = first_k_finished("probe-lengths", 256, 0)
    assert biased < 3.0, biased  # mostly the short episodes: far below 4.5
    # a step cap censors the long episodes instead of dropping them
    ev = make_evaluate(env, uniform, Identity(), 64, 4, max_steps=3)
    s = jax.jit(ev.block)(jax.jit(ev.init)(jax.random.PRNGKey(0), None), None, None)
    long = np.asarray(s.length) > 1
    assert long.any() and (np.asarray(s.length)[long] == 3).all()
    assert not np.asarray(s.done)[long].any() and np.asarray(s.done)[~long].all()
    np.testing.assert_array_equal(np.asarray(s.ret), np.where(long, 3.0, 1.0))

    # step t's key is (run key, t) alone: the same episodes whatever the block size (eval sizes
    # its blocks to end on its step cap).
    # probe-memory's return is the sampled fourth action against the episode's sign.
    memory = make_env(EnvConfig(name="probe-memory", num_envs=1))

    def returns(block_steps):
        ev = make_evaluate(memory, uniform, Identity(), 64, block_steps)
        s = jax.jit(ev.init)(jax.random.PRNGKey(1), None)
        while not bool(s.done.all()):
            s = jax.jit(ev.block)(s, None, None)
        return np.asarray(s.ret)

    one = returns(1)
    assert set(one.tolist()) == {-1.0, 1.0}
    np.testing.assert_array_equal(returns(3), one)
    np.testing.assert_array_equal(returns(8), one)


@pytest.mark.slow
def test_eval_cli_writes_eval_json_for_offline_and_online_runs(probe_data, two_device_smoke_run,
                                                              tmp_path):
    """offline.py eval of an offline run (BC on probe_data) and of an online run (`train.py
    smoke` on the suite's two devices, test_cli_resume's shared `two_device_smoke_run`, copied):
    eval.json's figures, the videos (the episodes evaluated, drawn as Craftax draws them), the
    same episodes evaluated in a process with one device, Ctrl-C there one line and exit 130."""
    run = offline_main("bc", "smoke", "--data", str(probe_data), "--out-dir", str(tmp_path),
                       "--run-name", "bc", "--num-updates", "50")
    out = offline_main("eval", "--run", str(run), "--episodes", "64", "--seed", "3")
    saved = json.loads((run / "eval.json").read_text())
    assert saved["episodes"] == 64 and saved["return_mean"] == out["return_mean"]
    lo, hi = saved["return_ci95"]
    assert lo <= saved["return_mean"] <= hi
    assert {"length_mean", "achievements", "censored"} <= set(saved)
    online = tmp_path / "ppo"
    shutil.copytree(two_device_smoke_run, online)  # `train.py smoke --run-name ppo`, 2 devices
    out = offline_main("eval", "--run", str(online), "--episodes", "8", "--max-steps", "50",
                       "--video", "2", "--video-max-steps", "5")
    saved = json.loads((online / "eval.json").read_text())
    import imageio.v3 as iio

    gifs = [iio.imread(p) for p in saved["videos"]]
    assert len(gifs) == 2 and all(g.shape[0] == 5 and g.shape[-1] == 3 for g in gifs)
    # the videos are the episodes evaluated: each first frame is Craftax's own drawing of the
    # world eval gave that episode (seed 0, episode i), up to the GIF's palette
    from craftax.craftax_classic.envs.craftax_symbolic_env import CraftaxClassicSymbolicEnv
    from craftax.craftax_classic.renderer import make_craftax_pixel_renderer

    craftax, render = CraftaxClassicSymbolicEnv(), make_craftax_pixel_renderer(16)
    draw = jax.jit(lambda k: render(craftax.reset_env(k, craftax.default_params)[1]))
    worlds = [np.asarray(draw(jax.random.fold_in(jax.random.split(jax.random.PRNGKey(0))[0], i)))
              for i in (0, 1)]
    rows, cols = worlds[0].shape[:2]  # (the frame's corner: the curves lie under it)
    err = np.array([[np.abs(g[0][:rows, :cols] - w).mean() for w in worlds] for g in gifs])
    assert err[0, 0] < 2 and err[1, 1] < 2 and err[0, 1] > 10 and err[1, 0] > 10, err
    # beside each: the MP4 and the numbers drawn, every step of the episode (not only those
    # drawn), the critic's values and the run's own gamma (test_video checks what they are)
    assert saved["video_gamma"] == 0.99
    from pathlib import Path

    for i, p in enumerate(saved["videos"]):
        z = np.load(Path(p).with_suffix(".npz"))
        assert len(z["reward"]) == saved["lengths"][i] and z["frames"] == 5
        assert z["critic"] and np.isfinite(z["value"]).all() and z["gamma"] == 0.99
        assert iio.imread(Path(p).with_suffix(".mp4"), plugin="FFMPEG").shape == gifs[i].shape
    assert saved["episodes"] == 8 and set(saved["achievements"]) >= {"collect_wood"}
    assert all(0 <= v <= 1 for v in saved["achievements"].values())
    assert max(saved["lengths"]) <= 50
    assert (online / "eval_achievements.png").is_file()
    # the run was trained on the suite's two devices (and evaluated above in this process,
    # which has them too): a process with one evaluates it alike (its parameters restored onto
    # that device), and Ctrl-C there is one line, exit 130
    import signal

    def offline_cmd(*args):
        return [sys.executable, str(ROOT / "offline.py"), *args]

    one = run_command(offline_cmd("eval", "--run", str(online), "--episodes", "8",
                                  "--max-steps", "50", "--out", str(tmp_path / "one.json")),
                      env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-2000:]
    alone = json.loads((tmp_path / "one.json").read_text())
    assert (alone["returns"], alone["lengths"]) == (saved["returns"], saved["lengths"])
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        proc = subprocess.Popen(offline_cmd("eval", "--run", str(online), "--episodes", "256",
                                            "--block-steps", "8"),
                                env=subprocess_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    while "steps:" not in proc.stdout.readline() and proc.poll() is None:
        pass
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr[-2000:]
    assert stdout.strip().splitlines()[-1].startswith("interrupted: "), stdout[-500:]
    assert json.loads((online / "eval.json").read_text()) == saved


@pytest.mark.slow
def test_bad_inputs_are_one_line_errors(probe_data, tmp_path):
    env = subprocess_env()

    def error(*args):
        p = run_command([sys.executable, str(ROOT / "offline.py"), *args], env=env,
                        capture_output=True, text=True, timeout=300)
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        assert p.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), \
            p.stderr[-2000:]
        return lines[0]

    assert "no card.json" in error("awr", "smoke", "--data", str(tmp_path / "nothing"))
    assert "label set 'x'" in error("awr", "smoke", "--data", str(probe_data), "--labels", "x")
    assert "beta" in error("awr", "smoke", "--data", str(probe_data), "--beta", "0")
    assert "not a multiple of seq_len=5" in error("awr", "smoke", "--data", str(probe_data),
                                                  "--policy.kind", "gru", "--seq-len", "5")
    assert "episodes" in error("eval", "--run", str(tmp_path), "--episodes", "1")
    assert error("eval", "--run", str(tmp_path)) == (  # (no `random` offered: not a run)
        f"error: {tmp_path}: no config.json there; pass a run folder written by train.py or "
        "offline.py")


@pytest.mark.slow
def test_study_trains_and_evaluates_every_variant_alike(probe_data, tmp_path):
    """A smoke study (2 algorithms x 2 seeds on probe-obs-action): one table, every policy
    evaluated on the same episodes, AWR (rewarded action) above BC (the behaviour's mix);
    started again it trains and evaluates nothing (same table)."""
    out = tmp_path / "study"
    args = ["study", "--data", str(probe_data), "--out", str(out), "--preset", "smoke",
            "--num-updates", "300", "--lr", "3e-3", "--beta", "0.5", "--seeds", "2",
            "--episodes", "200"]
    res = offline_main(*args)
    awr, bc = res["variants"]["awr-plain"], res["variants"]["bc-plain"]
    assert awr["episodes"] == bc["episodes"] == 400 and len(awr["seed_means"]) == 2
    # behaviour: +1 w.p. 0.8 (sign +1) or 0.7 (sign -1): expected return 0.5; AWR learns the
    # rewarded action (towards +1), BC imitates the mix (about 0.5)
    assert awr["return_ci95"][0] > bc["return_ci95"][1], (awr, bc)
    assert bc["return_ci95"][0] < 0.5 < bc["return_ci95"][1] + 0.1
    assert (out / "study.md").read_text().count("| awr-plain |") == 1
    assert (out / "study.png").is_file()  # (its bars: test_video)
    mtimes = {p: p.stat().st_mtime for p in out.rglob("eval.json")}
    again = offline_main(*args)
    assert again["variants"] == res["variants"]
    assert {p: p.stat().st_mtime for p in out.rglob("eval.json")} == mtimes


def changed_cells(layout, before, after):
    """{(row, col): set of channel names} where the map part differs, and aux indices."""
    diff = np.flatnonzero(before != after)
    names = list(layout.blocks) + list(layout.items) + [m or "-" for m in layout.mobs]
    cells, aux = {}, set()
    for i in diff:
        if i >= layout.map_size:
            aux.add(int(i - layout.map_size))
            continue
        cell, ch = divmod(int(i), layout.channels)
        cells.setdefault(divmod(cell, layout.cols), set()).add(names[ch])
    return cells, aux


# The probed states of this module's probe tests and of test_policy_variants' GRU probe test:
# 8 states, seed 0, 20 warm-up steps (`offline.py probe --states 8`'s, the warm-up its default),
# each built as the command builds them (`jax.jit(probe_states)`), so that these processes
# (two devices) compile that program once and read it from the compilation cache after.
PROBE_STATES = (8, 0, 20)


def probe_base(env):
    """`PROBE_STATES`' states of `env`, built as `offline.py probe` builds them."""
    from fused.commands.offline_probe import probe_states

    return jax.jit(probe_states, static_argnums=(0, 1, 2, 3))(env, *PROBE_STATES)


@pytest.mark.slow
def test_probe_edits_change_only_what_they_say():
    """Each edit of real Classic states changes the observation only at its own tile (or
    inventory entry), and there the way its name says."""
    from fused.envspec import spec
    from fused.commands.offline_probe import EDITS, edits_for

    layout = spec(ENV).layout
    env = make_env(EnvConfig(name=ENV, num_envs=1))
    states = probe_base(env)
    observe = jax.jit(jax.vmap(env.observe))
    base = np.asarray(observe(states))
    c = (layout.rows // 2, layout.cols // 2)  # the player
    food = next(a.index for a in layout.aux if a.label == "Food")
    want = {"arrow_adjacent": ((c[0], c[1] + 1), "arrow"), "arrow_far": ((c[0], c[1] + 4), "arrow"),
            "zombie_adjacent": ((c[0] + 1, c[1]), "zombie"),
            "iron_in_view": ((c[0], c[1] + 2), "iron"),
            "diamond_in_view": ((c[0], c[1] + 2), "diamond")}
    assert set(edits_for(ENV)) == set(want) | {"food_low", "drink_low", "energy_low"}
    for name in edits_for(ENV):
        after = np.asarray(observe(jax.jit(jax.vmap(EDITS[name][0]))(states)))
        for b, a in zip(base, after):
            cells, aux = changed_cells(layout, b, a)
            if name in want:
                tile, what = want[name]
                assert not aux and set(cells) <= {tile}, (name, cells, aux)
                i = (tile[0] * layout.cols + tile[1]) * layout.channels
                names = list(layout.blocks) + list(layout.mobs)
                assert a[i + names.index(what)] == 1, name  # it is there now
                # besides it, only the block under a placed mob (now grass) may change
                assert cells.get(tile, set()) <= {what} | set(layout.blocks), (name, cells)
            else:
                assert not cells and len(aux) <= 1, (name, cells, aux)
        if name == "food_low":
            assert (after[:, layout.map_size + food] < base[:, layout.map_size + food]).any()


@pytest.mark.slow
def test_probe_of_a_plain_online_run(smoke_run, tmp_path):
    run = tmp_path / "ppo"
    shutil.copytree(smoke_run, run)  # `train.py smoke --run-name ppo`
    res = offline_main("probe", "--run", str(run), "--states", str(PROBE_STATES[0]),
                       "--seed", str(PROBE_STATES[1]), "--warmup", str(PROBE_STATES[2]))
    assert set(res["edits"]) >= {"zombie_adjacent", "food_low"}
    assert all(set(v) == {"real"} for v in res["edits"].values())  # no hidden state to ablate
    # the figures for one edit, recomputed here from the network's outputs
    from fused.commands.offline_probe import EDITS

    pol = load_policy(run, 8)
    env = make_env(EnvConfig(name=ENV, num_envs=1))
    net = pol.agent.network
    base = probe_base(env)
    observe = jax.jit(jax.vmap(env.observe))
    obs0 = observe(base)
    obs1 = observe(jax.jit(jax.vmap(EDITS["zombie_adjacent"][0]))(base))
    v = [np.asarray(net.apply(pol.params, o, method=type(net).critic)) for o in (obs0, obs1)]
    p = [np.asarray(jax.nn.softmax(net.apply(pol.params, o, method=type(net).actor)))
         for o in (obs0, obs1)]
    got = res["edits"]["zombie_adjacent"]["real"]
    np.testing.assert_allclose(got["value_change"], (v[1] - v[0]).mean(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got["kl"], (p[0] * np.log(p[0] / p[1])).sum(-1).mean(),
                               rtol=1e-3, atol=1e-7)
    assert got["kl"] > 0  # the zombie changes what the policy does
    assert (run / "probe.md").is_file() and (run / "probe.png").is_file()


@pytest.mark.slow
def test_streamed_windows_train_like_the_whole_data_and_resume_exactly(probe_data, tmp_path):
    """--device-rows 2000 on 4 shards of 1,000 rows: every chunk trains on a seeded window of 2
    whole shards (padding never sampled); BC still recovers the behaviour policy, and a
    resumed streamed run ends where an uninterrupted one does."""
    from fused.data.loader import WindowStream, open_training_set

    ts = open_training_set(str(probe_data))
    stream = WindowStream(ts, 2000, seed=0)
    windows = [stream.shards(c) for c in range(6)]
    assert all(len(w) == 2 for w in windows) and len({tuple(w) for w in windows}) > 1
    assert windows == [WindowStream(ts, 2000, seed=0).shards(c) for c in range(6)]
    w = stream.window(3)
    assert len(w["rows"]["action"]) == 2000 and int(w["num_valid"]) == 2000  # one-step episodes
    with pytest.raises(Exception, match="device_rows=500"):
        WindowStream(ts, 500, seed=0)
    common = ["bc", "smoke", "--data", str(probe_data), "--out-dir", str(tmp_path),
              "--device-rows", "2000", "--lr", "3e-3", "--batch-size", "256"]
    run = offline_main(*common, "--run-name", "s", "--num-updates", "600")
    np.testing.assert_allclose(action_probs(run, SIGNS)[:, 1], [0.8, 0.3], atol=0.05)
    part = offline_main(*common, "--run-name", "p", "--num-updates", "300")
    offline_main("bc", "--resume", str(part), "--num-updates", "600")
    assert digest(part, 600) == digest(run, 600)
