"""Policy variants: the recurrent PPO (GRU) against what its carry must do; the exploration
bonuses (RND, ICM, E3B) against their definitions; every variant resumes exactly."""

import dataclasses
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from command_runner import run_command
from conftest import ENCODE_LENGTHS, ROOT, console_script, subprocess_env
from fused.commands.train import TrainConfig, validate
from fused.errors import ConfigError
from fused.rl.config import EnvConfig, ExploreConfig, PolicyConfig, PPOConfig
from fused.commands.train import build
from fused.rl.explore import Explorer, Step
from fused.rl.acting import network_policy
from fused.rl.networks import RecurrentActorCritic
from test_cli_resume import final_meta, train_cmd


def probe_cfg(name, kind, updates, num_steps=8, explore=ExploreConfig(), **ppo_kw):
    kw = dict(num_steps=num_steps, num_minibatches=2, update_epochs=4, lr=3e-3, anneal_lr=False, gamma=0.9, gae_lambda=0.95,
              ent_coef=0.0)
    kw.update(ppo_kw)
    cfg = TrainConfig(env=EnvConfig(name=name, num_envs=16, reset="auto"), ppo=PPOConfig(**kw),
                      policy=PolicyConfig(kind, layer_width=32, num_layers=2), explore=explore,
                      total_timesteps=16 * num_steps * updates)
    validate(cfg)
    return cfg


def test_gru_sequence_restarts_its_carry_where_resets_say():
    """A sequence with a reset at step 3 gives, from step 3 on, exactly what the same inputs
    give from a zero carry; without the reset they differ (the carry does carry something)."""
    net = RecurrentActorCritic(3, width=8, num_layers=2)
    x = jax.random.normal(jax.random.PRNGKey(0), (6, 2, 5))
    params = net.init(jax.random.PRNGKey(1), net.initial_carry(2), x[:1],
                      jnp.zeros((1, 2), bool))
    resets = jnp.zeros((6, 2), bool).at[3, 0].set(True)
    _, logits, value = net.apply(params, net.initial_carry(2), x, resets)
    _, tail_logits, tail_value = net.apply(params, net.initial_carry(2), x[3:],
                                           jnp.zeros((3, 2), bool))
    np.testing.assert_allclose(logits[3:, 0], tail_logits[:, 0], atol=1e-6)
    np.testing.assert_allclose(value[3:, 0], tail_value[:, 0], atol=1e-6)
    assert np.abs(np.asarray(logits[3:, 1] - tail_logits[:, 1])).max() > 1e-4


@pytest.mark.slow  # (8-12 s on 2 cores, among the fast lane's slowest: out of it)
def test_gru_carry_is_zero_after_an_episode_ends():
    """probe-memory episodes last 4 steps: after a 4-step rollout every env has just ended one
    (carry zero for the next episode); after 3 steps none has (carry non-zero)."""
    for steps, ended in ((4, True), (3, False)):
        online = build(probe_cfg("probe-memory", "gru", 1, num_steps=steps, num_minibatches=1))
        s0 = online.trainer.init(jax.random.PRNGKey(0), None)
        s1, m = jax.jit(online.trainer.chunk)(s0, None, np.int32(online.cfg.num_updates))
        assert float(m["episodes"]["episodes"].sum()) == (16 if ended else 0)
        zero = np.all(np.asarray(s1.carry) == 0, axis=-1)
        assert zero.all() if ended else not zero.any()


@pytest.mark.parametrize("kind", ["gru", "mlp"])
def test_first_epoch_recomputes_the_rollout_log_probs(kind):
    """One epoch, one minibatch: the loss is evaluated at the rollout's parameters, so the PPO
    ratio must be 1 for every transition: the GRU replays each env's sequence from its carry at
    the rollout's start, restarting it where episodes ended (probe-memory: 4-step episodes in a
    10-step rollout, so restarts happen mid-sequence)."""
    cfg = probe_cfg("probe-memory", kind, 3, num_steps=10, update_epochs=1, num_minibatches=1)
    online = build(cfg)
    _, m = jax.jit(online.trainer.train)(jax.random.PRNGKey(0), None)
    dev = np.asarray(m["ppo"]["loss/ratio_dev"])
    assert dev.max() < 1e-6, dev


def memory_return(kind):
    cfg = probe_cfg("probe-memory", kind, 250)
    online = build(cfg)
    _, m = jax.jit(online.trainer.train)(jax.random.PRNGKey(0), None)
    ep = m["episodes"]
    last = slice(-25, None)
    return float(ep["return_sum"][last].sum() / ep["episodes"][last].sum())


@pytest.mark.slow
def test_memory_probe_needs_the_gru():
    """probe-memory shows a sign only at the first step; the fourth action earns +1 if it
    matches that sign, -1 otherwise. The GRU learns it; the MLP cannot do better than chance
    (expected return 0)."""
    assert memory_return("gru") > 0.9
    assert abs(memory_return("mlp")) < 0.3


def test_gru_config_errors():
    with pytest.raises(ConfigError, match="policy.kind gru .* ppo.num_minibatches=3"):
        validate(TrainConfig(env=EnvConfig(name="probe-memory", num_envs=16),
                             ppo=PPOConfig(num_steps=3, num_minibatches=3),
                             policy=PolicyConfig("gru")))


@pytest.mark.slow
@pytest.mark.parametrize("variant", [["--explore.kind", "rnd"],
                                     ["--policy.kind", "gru", "--explore.kind", "e3b"]],
                         ids=["rnd", "gru-e3b"])
def test_variants_resume_exactly(tmp_path, variant):
    """A run stopped after 4 updates and resumed to 8 ends bit-identical to one run of 8
    (parameters, optimisers, envs, the GRU carry and the explorer's state, E3B's per-env
    matrices included, are in the checkpoint). gru-e3b holds every piece of state a GRU, ICM or
    E3B run has (ICM's networks are E3B's); rnd adds its fixed random network."""
    args = ["smoke", "--env.name", "probe-memory", "--env.reset", "auto", *variant,
            "--ppo.no-anneal-lr", "--updates-per-chunk", "2",
            "--checkpoint-every-updates", "2", "--keep-checkpoints", "10", "--out-dir",
            str(tmp_path)]
    per_update = 8 * 8
    env = subprocess_env()
    run_command(train_cmd(*args, "--run-name", "a", "--total-timesteps", str(per_update * 8)),
                check=True, env=env, timeout=600, capture_output=True)
    run_command(train_cmd(*args, "--run-name", "b", "--total-timesteps", str(per_update * 4)),
                check=True, env=env, timeout=600, capture_output=True)
    p = run_command(train_cmd("--resume", str(tmp_path / "b"), "--total-timesteps",
                              str(per_update * 8)), env=env, timeout=600, capture_output=True,
                    text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    assert final_meta(tmp_path / "b", 8)["digest"] == final_meta(tmp_path / "a", 8)["digest"]
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    assert [cfg["policy"]["kind"], cfg["explore"]["kind"]] == [
        variant[variant.index(f) + 1] if f in variant else d
        for f, d in (("--policy.kind", "auto"), ("--explore.kind", "none"))]
    rows = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    if "--explore.kind" in variant:  # intrinsic and extrinsic rewards logged apart
        assert all(r["explore/intrinsic_mean"] > 0 for r in rows)
    if "gru" in variant:  # offline.py eval plays the GRU run (its carry through each episode)
        p = subprocess.run([console_script("craftax-offline"), "eval", "--run",
                            str(tmp_path / "a"), "--episodes", "6", "--block-steps", "4"],
                           env=env, timeout=600, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr[-2000:]  # (the console script: 0 once done)
        out = json.loads((tmp_path / "a" / "eval.json").read_text())
        assert out["episodes"] == 6 and out["length_mean"] == 4 and out["censored"] == 0
        assert set(out["returns"]) <= {-1.0, 1.0}
        p = run_command([sys.executable, str(ROOT / "label.py"), "generate", "smoke",
                         "--env.name", "probe-memory", "--policy", str(tmp_path / "a"),
                         "--out", str(tmp_path / "d")],
                        env=env, timeout=300, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr[-2000:]
        replay_gru_dataset(tmp_path / "d", tmp_path / "a")


def replay_gru_dataset(data, run):
    """A GRU run's dataset holds what the GRU did acting: every episode replayed as one
    sequence from a zero carry by the network's sequence form gives the stored log-probs of the
    stored actions and the stored values."""
    from fused.data.store import Dataset
    from fused.trained_policy import load_policy

    ds = Dataset(data)
    cols = [ds.read(name) for name in ds.shard_names()]
    rows = {k: np.concatenate([c[k] for c in cols]) for k in ("obs", "action", "log_prob",
                                                              "value", "step")}
    assert len(rows["action"]) > 100 and (rows["step"] == 0).sum() > 20
    pol = load_policy(run, 1)
    net = pol.agent.network
    resets = jnp.asarray(rows["step"] == 0)[:, None]
    _, logits, value = net.apply(pol.params, net.initial_carry(1),
                                 jnp.asarray(rows["obs"])[:, None], resets)
    logp = jax.nn.log_softmax(logits[:, 0])
    want = np.asarray(logp)[np.arange(len(rows["action"])), rows["action"].astype(int)]
    np.testing.assert_allclose(rows["log_prob"], want, atol=2e-5)
    np.testing.assert_allclose(rows["value"], np.asarray(value[:, 0]), atol=2e-5)
    # a feed-forward replay (the carry ignored) does not fit: the carry is what acted
    _, flat_logits, _ = net.apply(pol.params, net.initial_carry(len(resets)),
                                  jnp.asarray(rows["obs"])[None], jnp.ones((1, len(resets)), bool))
    flat = np.asarray(jax.nn.log_softmax(flat_logits[0]))[np.arange(len(want)),
                                                          rows["action"].astype(int)]
    assert np.abs(flat - want).max() > 10 * 2e-5  # well outside the tolerance of the match


@pytest.mark.slow
def test_gru_takes_the_llm_state():
    """--policy.kind gru with the fused LLM: the embedding projects the hidden state beside the
    observation, the run trains, and the first epoch still replays the rollout exactly."""
    from fused.llm.config import LLMConfig

    cfg = TrainConfig(
        env=EnvConfig(name="Craftax-Classic-Symbolic-v1", num_envs=4, reset_pool=2,
                      max_episode_steps=6),
        ppo=PPOConfig(num_steps=8, num_minibatches=1, update_epochs=1),
        llm=LLMConfig(backend="jax", skip_n=3, encode_lengths=ENCODE_LENGTHS),
        policy=PolicyConfig("gru", layer_width=16, num_layers=2),
        total_timesteps=4 * 8 * 2, updates_per_chunk=2)
    validate(cfg)
    online = build(cfg)
    state = jax.jit(online.trainer.init)(jax.random.PRNGKey(0), online.frozen)
    state, m = jax.jit(online.trainer.chunk)(state, online.frozen, np.int32(cfg.num_updates))
    assert float(np.asarray(m["ppo"]["loss/ratio_dev"]).max()) < 1e-5
    assert float(np.asarray(m["ppo"]["llm/calls"]).sum()) > 0
    embed = state.params["params"]["embed"]
    assert {"obs_proj", "hidden_proj", "joint"} <= set(embed)
    # the hidden state reaches the logits: zeroing it changes them
    net, x = online.agent.network, online.agent.inputs.view(state.inputs, state.env.obs)
    act = network_policy(net)
    _, real, _ = act.forward(state.params, state.carry, x)
    _, zero, _ = act.forward(state.params, state.carry,
                             dict(x, hidden=jnp.zeros_like(x["hidden"])))
    assert np.abs(np.asarray(real - zero)).max() > 1e-4


def explorer(kind, **kw):
    return Explorer(ExploreConfig(kind, **kw), 6, 3, 4)


@pytest.mark.parametrize("kind", ["rnd", pytest.param("icm", marks=pytest.mark.slow)])
def test_bonus_falls_on_a_repeated_observation(kind):
    """Trained on one transition over and over, the bonus of that transition falls far below
    its start; a transition never trained on keeps a bonus well above it."""
    ex = explorer(kind, lr=1e-3, update_epochs=1)
    key = jax.random.PRNGKey(0)
    s = ex.init(key)
    ks = jax.random.split(jax.random.PRNGKey(1), 4)
    seen = Step(jnp.tile(jax.random.normal(ks[0], (1, 6)), (4, 1)), jnp.ones(4, jnp.int32),
                jnp.tile(jax.random.normal(ks[1], (1, 6)), (4, 1)), jnp.zeros(4, bool))
    novel = Step(jax.random.normal(ks[2], (4, 6)), jnp.zeros(4, jnp.int32),
                 jax.random.normal(ks[3], (4, 6)), jnp.zeros(4, bool))
    before = float(ex.bonus(s, seen)[1].mean())
    batch = jax.tree.map(lambda x: x[None], seen)  # [T=1, N=4]
    train = jax.jit(lambda s, k: ex.update(s, batch, k, 2, None)[0])
    for i in range(300):
        s = train(s, jax.random.PRNGKey(i))
    after, other = float(ex.bonus(s, seen)[1].mean()), float(ex.bonus(s, novel)[1].mean())
    assert after < 0.05 * before and other > 10 * after, (before, after, other)
    done = seen._replace(done=jnp.ones(4, bool))
    assert np.all(np.asarray(ex.bonus(s, done)[1]) == 0)  # no bonus on an episode's last step


def test_e3b_bonus_is_the_elliptical_norm_by_hand():
    """Env 0 plays 5 steps in one episode, then a new one; the bonus of step t is
    phi_t^T (lambda I + sum_{i<t} phi_i phi_i^T)^-1 phi_t over the episode's earlier steps,
    computed here with numpy's inverse (not the Sherman-Morrison update the explorer uses)."""
    lam = 0.1
    ex = explorer("e3b", latent=3, e3b_lambda=lam)
    s = ex.init(jax.random.PRNGKey(0))
    obs = jax.random.normal(jax.random.PRNGKey(1), (7, 4, 6))
    done = np.zeros((7, 4), bool)
    done[4, 0] = True  # step 4 ends env 0's episode: steps 5, 6 start a new one
    got = []
    for t in range(7):
        s, b = ex.bonus(s, Step(obs[t], jnp.zeros(4, jnp.int32), obs[t], jnp.asarray(done[t])))
        got.append(np.asarray(b))
    phi = np.asarray(ex._encode(s.params, obs.reshape(-1, 6))).reshape(7, 4, 3)
    for t in range(7):
        start = 5 if t >= 5 else 0
        a = lam * np.eye(3) + sum(np.outer(phi[i, 0], phi[i, 0]) for i in range(start, t))
        want = 0.0 if done[t, 0] else phi[t, 0] @ np.linalg.inv(a) @ phi[t, 0]
        np.testing.assert_allclose(got[t][0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_explorer_rewards_enter_the_advantages_and_are_logged_apart():
    """probe-truncated pays 1 every step of 5-step episodes: the logged (extrinsic) reward
    stays exactly 1 while the intrinsic bonus is logged beside it."""
    cfg = probe_cfg("probe-truncated", "mlp", 3, explore=ExploreConfig("rnd", coef=5.0))
    online = build(cfg)
    _, m = jax.jit(online.trainer.train)(jax.random.PRNGKey(0), None)
    np.testing.assert_array_equal(np.asarray(m["ppo"]["reward_mean"]), 1.0)
    assert np.all(np.asarray(m["ppo"]["explore/intrinsic_mean"]) > 0)
    assert np.all(np.isfinite(np.asarray(m["ppo"]["explore/rnd_loss"])))
    # The bonus is what changes the learning: at coef 0 the run is the plain run to the bit
    # (the explorer draws no keys from the run's stream), at coef 5 it is not.
    runs = {}
    for name, x in (("none", ExploreConfig()), ("zero", ExploreConfig("rnd", coef=0.0))):
        o = build(probe_cfg("probe-truncated", "mlp", 3, explore=x))
        runs[name] = jax.jit(o.trainer.train)(jax.random.PRNGKey(0), None)[1]["ppo"]
    np.testing.assert_array_equal(runs["none"]["loss/value"], runs["zero"]["loss/value"])
    assert not np.array_equal(runs["none"]["loss/value"], m["ppo"]["loss/value"])


@pytest.mark.slow
def test_gru_with_e3b_on_two_devices_equals_one_device():
    """Envs, the GRU carry and E3B's per-env matrices split over 2 devices; parameters,
    optimisers and the explorer's networks replicated, gradients averaged: the same run as on
    one device (one minibatch, so both average the same global batch)."""
    from test_sharding import run

    cfg = probe_cfg("probe-memory", "gru", 4, num_steps=4, num_minibatches=1,
                    explore=ExploreConfig("e3b", update_epochs=1))
    cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, num_envs=8),
                              updates_per_chunk=2)
    assert jax.device_count() >= 2
    s1, m1, _ = run(cfg, 1)
    s2, m2, _ = run(cfg, 2)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
    for k in ("reward_mean", "explore/intrinsic_mean", "loss/value"):
        np.testing.assert_allclose(np.concatenate([m["ppo"][k] for m in m1]),
                                   np.concatenate([m["ppo"][k] for m in m2]), rtol=1e-4)
    np.testing.assert_allclose(s1.carry, s2.carry, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(s1.explore.cov, s2.explore.cov, rtol=1e-4, atol=1e-5)
    for a, b in zip(jax.tree.leaves(s1.explore.params), jax.tree.leaves(s2.explore.params)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)


# --- offline.py --policy.kind gru --------------------------------------------------------------

def test_sequence_windows_by_hand():
    """Episodes [0..2], [3..6], [7..8]; row 5 has no valid return. With one valid row to draw
    from, the window is fixed: burn_in 2, length 3."""
    from fused.rl.awr import Sequences, sequence_windows

    start = np.array([1, 0, 0, 1, 0, 0, 0, 1, 0], bool)
    valid = np.ones(9, bool)
    valid[5] = False
    seq = Sequences(length=3, burn_in=2)

    def window(drawn):
        data = {"rows": {"action": np.zeros(9, np.int32), "episode_start": start,
                         "valid": valid},
                "valid_index": np.array([drawn], np.int32), "num_valid": np.int32(1)}
        idx, resets, counted = sequence_windows(jax.random.PRNGKey(0), data, 2, seq)
        assert idx.shape == resets.shape == counted.shape == (5, 2)
        return [np.asarray(a)[:, 0].tolist() for a in (idx, resets, counted)]

    idx, resets, counted = window(4)  # rows 2..6: burn-in 2, 3; counted 4, (5 invalid), 6
    assert idx == [2, 3, 4, 5, 6]
    assert resets == [True, True, False, False, False]  # the window's start; episode 3..6
    assert counted == [False, False, True, False, True]
    idx, resets, counted = window(1)  # clamped at row 0: rows 0..4, counted from row 1 on
    assert idx == [0, 1, 2, 3, 4]
    assert resets == [True, False, False, True, False]
    assert counted == [False, True, True, True, True]
    idx, resets, counted = window(8)  # past the data's end: row 8 repeated, not counted
    assert idx == [6, 7, 8, 8, 8]
    assert resets == [True, True, False, False, False]
    assert counted == [False, False, True, False, False]


def memory_dataset(root, episodes=1000, shard_rows=998):
    """probe-memory episodes (4 steps, the sign shown at the first only) with uniformly random
    actions; shards of 998 rows, so episodes run across shard boundaries."""
    from test_offline import probe_dataset

    rng = np.random.default_rng(0)
    sign = np.repeat(rng.choice([-1.0, 1.0], episodes), 4)
    t = np.tile(np.arange(4), episodes)
    action = rng.integers(0, 2, 4 * episodes)
    reward = np.where(t == 3, np.where(action == 1, 1.0, -1.0) * sign, 0.0)
    obs = np.stack([np.where(t == 0, sign, 0.0), np.ones_like(sign)], 1)
    return probe_dataset(root, "probe-memory", obs, action, reward, shard_rows,
                         terminated=t == 3, episode_id=np.repeat(np.arange(episodes), 4)).root


def test_loader_marks_where_the_carry_restarts(tmp_path):
    """Episode starts every 4 rows; an episode running over a shard boundary goes on; a window
    that skips a shard restarts the carry at the next one."""
    from fused.data.loader import open_training_set, read_window

    ts = open_training_set(str(memory_dataset(tmp_path / "d", episodes=600)))
    whole = read_window(ts, [0, 1, 2], sequences=True)["rows"]
    assert whole["episode_start"].tolist() == (np.arange(2400) % 4 == 0).tolist()
    assert whole["valid"].all()
    skip = read_window(ts, [0, 2], pad_rows=2000, sequences=True)["rows"]["episode_start"]
    expect = np.r_[np.arange(998) % 4 == 0, np.arange(998 * 2, 2400) % 4 == 0]
    expect[998] = True  # shard 2 does not follow shard 0: its first row starts a carry
    assert skip[:len(expect)].tolist() == expect.tolist()


@pytest.mark.slow
def test_offline_gru_learns_the_memory_probe_and_resumes_exactly(tmp_path):
    """AWR on random probe-memory episodes: a GRU trained on windows (burn-in reaching the
    episode's first step) plays the rewarded action from memory in `offline.py eval`; the MLP,
    on the same data, cannot beat chance. A GRU run stopped half way and resumed ends
    bit-identical to one run straight."""
    from test_offline import digest, offline_main

    data = memory_dataset(tmp_path / "d")
    common = ["smoke", "--data", str(data), "--out-dir", str(tmp_path), "--num-updates", "400",
              "--lr", "3e-3", "--batch-size", "128", "--beta", "0.5"]
    gru = ["--policy.kind", "gru", "--seq-len", "4", "--burn-in", "3"]
    runs = {kind: offline_main("awr", *common, "--run-name", kind,
                               *(gru if kind == "gru" else [])) for kind in ("gru", "mlp")}
    for kind, run in runs.items():
        offline_main("eval", "--run", str(run), "--episodes", "200", "--seed", "3")
    ret = {k: json.loads((r / "eval.json").read_text())["return_mean"] for k, r in runs.items()}
    assert ret["gru"] > 0.8 and abs(ret["mlp"]) < 0.3, ret
    part = offline_main("awr", *common, "--run-name", "part", *gru, "--num-updates", "200")
    offline_main("awr", "--resume", str(part), "--num-updates", "400")
    assert digest(part, 400) == digest(runs["gru"], 400)


# --- offline.py probe of a GRU ------------------------------------------------------------------

@pytest.mark.slow
def test_probe_reads_a_gru_with_the_carry_of_the_states_history():
    """The probe's GRU carry is the network's sequence form run over the observations of the
    history that led to the probed states (resets, then uniform-random steps, replayed here)."""
    from fused.commands.offline_probe import history_carry
    from fused.rl.envs import make_env
    from fused.rl.evaluate import episode_keys
    from fused.rl.networks import init_network
    from fused.rl.policy_input import Identity

    from test_offline import PROBE_STATES, probe_base

    env = make_env(EnvConfig(name="Craftax-Classic-Symbolic-v1", num_envs=1))
    net = RecurrentActorCritic(env.num_actions, 32, 2)
    params = init_network(net, jax.random.PRNGKey(0), jnp.zeros((1, env.obs_dim)))
    n, seed, warmup = PROBE_STATES  # (test_offline's probe tests' states: one compile of them)
    carry = jax.jit(lambda p: history_carry(env, network_policy(net), Identity(), p, None, None,
                                            n, seed, warmup))(params)
    obs, state = jax.vmap(env.reset)(episode_keys(jax.random.PRNGKey(seed), n))
    # (the reset's state as the step's come back: strongly typed, as `player_direction` is not
    # from an op-by-op reset; a weakly typed one made `step` a second program, ~3 s to compile)
    state = jax.tree.map(lambda a: jnp.asarray(a, a.dtype), state)
    step = jax.jit(lambda k, s, a: jax.vmap(env.step)(jax.random.split(k, n), s, a))
    seen = [obs]
    for k in jax.random.split(jax.random.PRNGKey(seed + 1), warmup):
        ka, ks = jax.random.split(k)
        res = step(ks, state, jax.random.randint(ka, (n,), 0, env.num_actions))
        state = res.state
        seen.append(res.obs)
    want, _, _ = net.apply(params, net.initial_carry(n), jnp.stack(seen[:-1]),
                           jnp.zeros((warmup, n), bool))
    np.testing.assert_allclose(np.asarray(carry), np.asarray(want), atol=1e-5)
    assert np.abs(np.asarray(want)).max() > 1e-2  # a carry that says something
    base = probe_base(env)
    np.testing.assert_array_equal(np.asarray(jax.vmap(env.observe)(base)), np.asarray(seen[-1]))


@pytest.mark.slow
def test_probe_cli_on_a_gru_run(tmp_path):
    env = subprocess_env()
    run_command(train_cmd("smoke", "--policy.kind", "gru", "--out-dir", str(tmp_path),
                          "--run-name", "gru"), check=True, env=env, timeout=600,
                capture_output=True)
    p = run_command([sys.executable, str(ROOT / "offline.py"), "probe", "--run",
                     str(tmp_path / "gru"), "--states", "4", "--warmup", "5"],
                    env=env, timeout=600, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads((tmp_path / "gru" / "probe.json").read_text())
    assert len(out["edits"]) >= 5
    assert all(np.isfinite(v["real"]["value_change"]) and v["real"]["kl"] > -1e-6
               for v in out["edits"].values())
