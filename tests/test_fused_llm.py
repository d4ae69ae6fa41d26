"""LLM-augmented PPO on the jax backend: the in-jit encoder equals encoding the whole prompt text
from scratch; refresh-on-reset and skip_n semantics; ablations; checkpoint/resume of the LLM
state; the CLI end to end."""

import dataclasses
import json
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ENCODE_LENGTHS, ROOT
from fused.commands.train import TrainConfig, WandbConfig, validate
from fused.errors import ConfigError
from fused.llm.config import LLMConfig
from fused.rl.config import EnvConfig, PolicyConfig, PPOConfig
from fused.llm.encoders import make_encoder, validate_llm
from fused.text.buckets import encode_buckets
from fused.llm.policy_input import LLMInput, init_llm_state, llm_step
from fused.rl.envs import rollout_observations
from fused.text.format import get_layout, render_text
from fused.text.prompt import full_prompt
from llm_jax.model import encode

ENV = "Craftax-Classic-Symbolic-v1"


@pytest.fixture(scope="module")
def obs():
    return rollout_observations(ENV, 64, 3, 16)[::4]  # 16 varied states


@pytest.fixture(scope="module")
def llm():
    """The default length buckets (the rest of the suite runs at conftest's two lengths)."""
    llm = make_encoder(LLMConfig(backend="jax", skip_n=3, refresh_batch=2), ENV)
    assert llm.buckets == encode_buckets(llm.buckets[-1]) and len(llm.buckets) > 2
    return llm


@pytest.mark.slow
def test_encoder_equals_full_prompt_from_scratch(llm, obs):
    """Device render + tail + prefix cache + length buckets + sorted microbatches must give the
    hidden state of the last token of tokenizer.encode(full prompt text), encoded without cache."""
    got, tokens = jax.jit(lambda f, o: llm.encode(f, o, 4)[:2])(llm.frozen, obs)
    layout = get_layout(ENV)
    texts = [full_prompt(llm.tokenizer, ENV, render_text(layout, o)) for o in obs]
    ids = [llm.tokenizer.encode(t) for t in texts]
    width = max(map(len, ids))
    batch = np.zeros((len(ids), width), np.int32)
    for i, x in enumerate(ids):
        batch[i, :len(x)] = x
    want = encode(llm.frozen.params, llm.qcfg, jnp.asarray(batch),
                  jnp.array([len(x) for x in ids]), llm.layer, "last")
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4, rtol=1e-4)
    prefix = len(llm.frozen.prefix.k[0])
    assert int(tokens) == sum(len(x) - prefix for x in ids)  # observation + tail tokens


@pytest.mark.slow
def test_refresh_on_reset_and_skip(llm, obs):
    """Refresh calls of 2 rows (the fixture's refresh_batch), refresh_wait 4, skip_n 3."""
    n = obs.shape[0]
    jitted = jax.jit(lambda f, s, d, t: llm_step(llm, f, s, jnp.asarray(obs), d, t,
                                                 jax.random.PRNGKey(0), 4, 2))
    step = partial(jitted, llm.frozen)  # (frozen as an argument: see `policy_view`)
    s0, m = step(init_llm_state(llm.hidden_size, n), jnp.zeros(n, bool),
                 jnp.int32(0))  # 0 % 3: full call
    assert float(m["llm/calls"]) == 1 and int(s0.age.max()) == 0
    base = np.asarray(s0.hidden)
    changed = s0.replace(hidden=s0.hidden + 1.0)
    # Step 1 is no call; envs 2, 5, 9 ended: a whole refresh call (2) is waiting, so every
    # waiting env is re-encoded now, in two calls (the second topped up with a done env).
    done = jnp.zeros(n, bool).at[jnp.array([2, 5, 9])].set(True)
    s1, m1 = step(changed, done, jnp.int32(1))
    h1 = np.asarray(s1.hidden)
    assert float(m1["llm/refreshed"]) == 3 and float(m1["llm/calls"]) == 0
    assert float(m1["llm/tokens"]) > 0
    np.testing.assert_allclose(h1[[2, 5, 9]], base[[2, 5, 9]], atol=1e-5)  # re-encoded
    others = [i for i in range(n) if i not in (2, 5, 9)]
    np.testing.assert_allclose(h1[others], base[others] + 1.0, atol=1e-5)  # untouched
    assert int(s1.age.max()) == 0
    # Env 11 ends alone at step 2: fewer than 2 wait, so it waits until refresh_wait (4) steps.
    s, m = step(s1, jnp.zeros(n, bool).at[11].set(True), jnp.int32(2))
    assert float(m["llm/refreshed"]) == 0 and int(s.age[11]) == 1
    s, m = step(s, jnp.zeros(n, bool), jnp.int32(4))  # (step 3 would be a full call)
    assert float(m["llm/refreshed"]) == 0 and int(s.age[11]) == 2
    s, m = step(s, jnp.zeros(n, bool), jnp.int32(5))
    assert float(m["llm/refreshed"]) == 0 and int(s.age[11]) == 3
    s7, m7 = step(s, jnp.zeros(n, bool), jnp.int32(7))  # waited 4 steps: refreshed alone
    assert float(m7["llm/refreshed"]) == 1 and int(s7.age.max()) == 0
    np.testing.assert_allclose(np.asarray(s7.hidden)[11], base[11], atol=1e-5)
    rest = [i for i in others if i != 11]
    np.testing.assert_allclose(np.asarray(s7.hidden)[rest], base[rest] + 1.0, atol=1e-5)


@pytest.mark.slow
def test_no_refresh_keeps_stale_hidden(obs, real_view):
    llm = make_encoder(LLMConfig(backend="jax", skip_n=3, refresh_on_reset=False,
                                 encode_lengths=ENCODE_LENGTHS), ENV,
                       like=real_view[0])  # (the same random model: its weights, prefix cache)
    n = obs.shape[0]
    s = init_llm_state(llm.hidden_size, n).replace(hidden=jnp.ones((n, llm.hidden_size)),
                                       age=jnp.zeros(n, jnp.int32))
    s1, m = jax.jit(lambda f, s: llm_step(llm, f, s, jnp.asarray(obs), jnp.ones(n, bool),
                                          jnp.int32(1), jax.random.PRNGKey(0), 4, 2))(
        llm.frozen, s)
    assert float(m["llm/refreshed"]) == 0 and np.all(np.asarray(s1.hidden) == 1.0)


def smoke_cfg(**llm_kw) -> TrainConfig:
    return TrainConfig(
        env=EnvConfig(name=ENV, num_envs=8, reset_pool=2, max_episode_steps=12),
        ppo=PPOConfig(num_steps=8, num_minibatches=2, update_epochs=1),
        policy=PolicyConfig(layer_width=32),
        llm=LLMConfig(backend="jax", skip_n=5, microbatch=4, encode_lengths=ENCODE_LENGTHS,
                      **llm_kw),
        total_timesteps=8 * 8 * 4, updates_per_chunk=2, wandb=WandbConfig(mode="disabled"),
        plot=False)


@pytest.fixture(scope="module")
def trained():
    from fused.commands.train import build, commit

    cfg = smoke_cfg()
    validate(cfg)
    online = build(cfg)
    chunk = partial(jax.jit(online.trainer.chunk), num_updates=np.int32(cfg.num_updates))
    # as train.py starts a run
    s0 = commit(online, jax.jit(online.trainer.init)(jax.random.PRNGKey(0), online.frozen))
    s1, m1 = chunk(s0, online.frozen)
    s2, m2 = chunk(s1, online.frozen)
    return online, chunk, s1, s2, (jax.device_get(m1), jax.device_get(m2))


@pytest.mark.slow
def test_training_calls_llm_every_skip_n_and_on_resets(trained):
    tr, _, _, s2, (m1, m2) = trained
    calls = np.concatenate([m1["ppo"]["llm/calls"], m2["ppo"]["llm/calls"]])
    # global steps 1..32 (hidden for the obs after each step); skip 5 -> 5,10,...,30: 6 calls
    assert calls.sum() == 6
    refreshed = np.concatenate([m1["ppo"]["llm/refreshed"], m2["ppo"]["llm/refreshed"]])
    episodes = np.concatenate([m1["episodes"]["episodes"], m2["episodes"]["episodes"]])
    assert episodes.sum() > 0 and refreshed.sum() > 0  # 12-step episodes end and get refreshed
    assert refreshed.sum() <= episodes.sum()
    assert float(s2.inputs.norm.count) > 8
    assert np.isfinite(m2["ppo"]["hidden/mean_cosine"]).all()


@pytest.mark.slow
def test_resume_from_checkpoint_is_exact(trained, tmp_path):
    from fused.runs.checkpoint import Checkpointer, abstract_like

    online, chunk, s1, s2, _ = trained
    ck = Checkpointer(tmp_path / "ck")
    ck.save(2, s1)
    _, restored, _ = ck.restore_latest(abstract_like(s1))
    ck.close()
    s2b, _ = chunk(restored, online.frozen)
    # One program for all three calls: the chunk returns the types it takes (no weak types) and
    # the restored state has those (committed), so resuming does not compile again.
    assert chunk.func._cache_size() == 1
    for a, b in zip(jax.tree.leaves(s2), jax.tree.leaves(s2b)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def policy_view(cfg: LLMConfig, obs, like=None):
    """(LLM, what the policy receives for `obs` after the full call of step 0, raw hidden);
    an ablation `like` the real encoder shares its weights (and prefix cache where the prefix
    is the same), as offline.py's ablations do.

    The encoder's frozen arrays go into the jitted call as an argument, as the trainer passes
    them, not closed over: closed over, the weights are constants of the program (~160 MB of
    HLO text for the tiny model), compiled into each one, so the real, shuffled and
    garbage-prompt views compiled three programs; as an argument the three are one program
    (`shuffle` is a flag among the frozen arrays: data), compiled once and read from the
    persistent compilation cache after."""
    llm = make_encoder(cfg, ENV, like=like)
    inputs = LLMInput(llm, 4, 2, obs.shape[0])
    state, _ = jax.jit(lambda f, o: inputs.init(f, o, jax.random.PRNGKey(1), None))(
        llm.frozen, jnp.asarray(obs))
    return llm, np.asarray(inputs.view(state, jnp.asarray(obs))["hidden"]), state


def by_hand(llm, obs, prefix_ids):
    """Last-token states of prefix + rendered observation + tail, encoded from scratch (no
    cache), normalised with numpy by the batch's own mean and (population) variance."""
    tok = llm.tokenizer
    tail = tok.encode(full_prompt(tok, ENV, "\x00").split("\x00")[1])
    ids = [list(prefix_ids) + tok.encode(render_text(get_layout(ENV), o)) + tail for o in obs]
    width = max(map(len, ids))
    batch = np.zeros((len(ids), width), np.int32)
    for i, x in enumerate(ids):
        batch[i, :len(x)] = x
    h = np.asarray(encode(llm.frozen.params, llm.qcfg, jnp.asarray(batch),
                          jnp.array([len(x) for x in ids]), llm.layer, "last"), np.float64)
    return h, (h - h.mean(0)) / np.sqrt(h.var(0) + 1e-6)


@pytest.fixture(scope="module")
def real_view(obs, llm):
    """At conftest's two lengths; the random model's weights and prefix cache are `llm`'s (the
    same seed), not made again."""
    return policy_view(LLMConfig(backend="jax", encode_lengths=ENCODE_LENGTHS), obs, like=llm)


@pytest.mark.slow
def test_policy_receives_the_normalised_real_state(real_view, obs):
    llm, got, _ = real_view
    _, want = by_hand(llm, obs, llm.prefix_ids)
    np.testing.assert_allclose(got, want, atol=2e-3)
    assert np.abs(got).max() > 0.5


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["zero", "shuffle", "garbage-prompt"])
def test_ablations_reach_the_policy(mode, obs, real_view):
    """What the policy receives under each ablation, not what the encoder returns."""
    llm_real, real, _ = real_view
    llm, got, state = policy_view(LLMConfig(backend="jax", hidden=mode,
                                            encode_lengths=ENCODE_LENGTHS), obs, like=llm_real)
    if mode == "zero":
        assert np.all(got == 0)
        assert np.all(np.asarray(state.hidden) == 0)
    elif mode == "shuffle":  # the same rows, handed to other envs
        match = [int(np.argmin(np.abs(real - row).max(-1))) for row in got]
        np.testing.assert_allclose(got, real[match], atol=1e-5)
        assert sorted(match) == list(range(len(obs))) and match != list(range(len(obs)))
    else:  # the prefix's own tokens permuted in place, chat-template specials kept
        real_ids, ids = np.asarray(llm_real.prefix_ids), np.asarray(llm.prefix_ids)
        special = {llm.tokenizer.tokenizer.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>")}
        fixed = np.isin(real_ids, list(special))
        assert fixed.sum() == 3 and np.array_equal(ids[fixed], real_ids[fixed])
        assert np.array_equal(np.sort(ids), np.sort(real_ids))
        assert (ids != real_ids).mean() > 0.9
        _, want = by_hand(llm, obs, ids)
        np.testing.assert_allclose(got, want, atol=2e-3)
        assert np.abs(got - real).max() > 0.1


@pytest.mark.parametrize("layers,layernorm", [(3, False), (3, True), (1, False)])
def test_constant_hidden_network_is_the_augmented_network(layers, layernorm):
    """Without LLM calls the network projects the one shared hidden row once: outputs and
    gradients (of both networks) must equal those of the augmented network written out by hand
    in jnp (obs and hidden projections, concatenation, tanh layers, head) on every row."""
    from fused.rl.networks import AugmentedActorCritic

    rng = np.random.default_rng(0)
    obs = rng.normal(size=(6, 11)).astype(np.float32)
    hidden = np.repeat(rng.normal(size=(1, 5)).astype(np.float32), 6, axis=0)
    inp = {"obs": jnp.asarray(obs), "hidden": jnp.asarray(hidden)}
    full, const = (AugmentedActorCritic(4, 8, layers, layernorm, c) for c in (False, True))
    params = full.init(jax.random.PRNGKey(0), inp)
    assert jax.tree.structure(const.init(jax.random.PRNGKey(0), inp)) == \
        jax.tree.structure(params)  # checkpoints of either load into the other

    def mlp_by_hand(p):
        h = hidden
        if layernorm:
            h = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-6)
            h = h * p["hidden_norm"]["scale"] + p["hidden_norm"]["bias"]
        x = jnp.concatenate([jnp.tanh(obs @ p["obs_proj"]["kernel"] + p["obs_proj"]["bias"]),
                             jnp.tanh(h @ p["hidden_proj"]["kernel"] + p["hidden_proj"]["bias"])],
                            -1)
        for i in range(layers - 1):
            x = jnp.tanh(x @ p[f"hidden_{i}"]["kernel"] + p[f"hidden_{i}"]["bias"])
        return x @ p["head"]["kernel"] + p["head"]["bias"]

    def by_hand(p):
        return (mlp_by_hand(p["params"]["actor_mlp"]),
                mlp_by_hand(p["params"]["critic_mlp"])[:, 0])

    def loss(apply):  # any scalar that mixes every output
        return lambda p: sum(jnp.sum(jnp.sin(x)) for x in apply(p))

    want, want_grad = by_hand(params), jax.grad(loss(by_hand))(params)
    for net in (full, const):
        for got, ref in zip(net.apply(params, inp), want):
            np.testing.assert_allclose(got, ref, atol=1e-5)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5),
                     jax.grad(loss(lambda p: net.apply(p, inp)))(params), want_grad)
    # Rows that differ are outside the contract: the shared row must really be the only one used.
    inp["hidden"] = inp["hidden"].at[3].add(jnp.arange(5.0))  # not a shift LayerNorm removes
    assert np.abs(const.apply(params, inp)[0] - full.apply(params, inp)[0]).max() > 1e-4


@pytest.mark.slow
def test_cli_llm_smoke(llm_smoke_run):
    """`train.py smoke --llm.backend jax --llm.skip-n 3 ...` (conftest's shared run): the random
    model is announced, the LLM is called every third step, each update logs its states."""
    assert "RANDOM Qwen3 (tiny" in (llm_smoke_run.parent / "r.stdout").read_text()
    rows = [json.loads(x) for x in (llm_smoke_run / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["llm/calls"] for r in rows) == 128 // 8 // 3  # steps 3, 6, ..., 15
    assert all("hidden/norm" in r and "llm/tokens_per_encode" in r for r in rows)


def test_llm_config_errors_name_the_field(tmp_path):
    shallow = tmp_path / "m"
    shallow.mkdir()
    (shallow / "config.json").write_text(json.dumps({
        "model_type": "qwen3", "vocab_size": 151_936, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 64, "rope_theta": 1e6}))
    no_weights = tmp_path / "nw"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((shallow / "config.json").read_text())
    (shallow / "model.safetensors").write_bytes(b"")  # present: validation reads only config.json
    bad = {
        "llm.microbatch": LLMConfig(backend="jax", microbatch=3),
        "llm.skip_n": LLMConfig(skip_n=-1),  # rejected without a backend too
        "llm.refresh_wait": LLMConfig(backend="jax", refresh_wait=0),
        "llm.weights": LLMConfig(weights="/nonexistent"),
        "llm.backend vllm needs --llm.weights": LLMConfig(backend="vllm"),
        "llm.layer=3": LLMConfig(weights=str(shallow), layer=3),
        "no model.safetensors": LLMConfig(weights=str(no_weights), layer=2),
        "llm.layer=40": LLMConfig(backend="jax", random_model="qwen3-0.6b", layer=40),
        "env.name='probe-constant'": LLMConfig(backend="jax"),
    }
    for field, llm in bad.items():
        cfg = dataclasses.replace(smoke_cfg(), llm=llm)
        if field.startswith("env.name"):
            cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, name="probe-constant"))
        with pytest.raises(ConfigError) as e:
            validate(cfg)
        assert field in str(e.value) and "\n" not in str(e.value), e.value
    validate(dataclasses.replace(smoke_cfg(), llm=LLMConfig(weights=str(shallow), layer=2)))


def test_length_buckets_at_their_boundaries():
    """A microbatch whose longest row has `need` tokens runs at the smallest bucket >= need."""
    from fused.text.buckets import at_smallest_fit

    assert encode_buckets(1_013) == (64, 128, 192, 256, 320, 384, 448, 512, 1_013)
    assert encode_buckets(2_600) == (64, 128, 192, 256, 320, 384, 448, 512, 1_024, 2_048, 2_600)
    assert encode_buckets(64) == (64,)
    sizes = encode_buckets(1_013)
    picked = jax.jit(lambda n: at_smallest_fit(sizes, n, lambda s: lambda: jnp.int32(s)))
    for need, want in ((1, 64), (64, 64), (65, 128), (512, 512), (513, 1_013), (1_013, 1_013)):
        assert int(picked(need)) == want, need
    assert encode_buckets(1_013, (256,)) == (256, 1_013)  # --llm.encode-lengths 256
    assert encode_buckets(200, (256, 512)) == (200,)


def test_encode_lengths_are_parsed_checked_and_recorded(tmp_path):
    """`--llm.encode-lengths` sets the encoding lengths below the bound (parsed from the command
    line, saved in the run's config.json and read back by a resume); a bad value is one line
    naming the flag, before anything is built."""
    from fused.commands.train import load_config
    from fused.runs.config_io import from_dict, to_dict

    cfg, _ = load_config(["smoke", "--llm.backend", "jax", "--llm.encode-lengths", "128", "512"])
    assert cfg.llm.encode_lengths == (128, 512)
    assert from_dict(TrainConfig, json.loads(json.dumps(to_dict(cfg))), "config.json") == cfg
    assert load_config(["smoke", "--llm.backend", "jax"])[0].llm.encode_lengths == ()
    for bad in ((512, 128), (0,), (256, 256)):
        with pytest.raises(ConfigError, match="llm.encode_lengths"):
            validate(dataclasses.replace(smoke_cfg(), llm=LLMConfig(backend="jax",
                                                                    encode_lengths=bad)))


def test_running_normaliser_merge_equals_numpy():
    """Batches with 0/1 row weights merged one by one: the moments of all weighted rows."""
    from fused.llm.norm import init_norm, update_norm

    rng = np.random.default_rng(0)
    batches = [(rng.normal(3.0, 2.0, (n, 5)), rng.random(n) < p)
               for n, p in ((16, 1.0), (8, 0.5), (8, 0.0), (4, 0.75))]
    norm = init_norm(5)
    step = jax.jit(update_norm)
    for x, w in batches:
        norm = step(norm, jnp.asarray(x, jnp.float32), jnp.asarray(w))
    rows = np.concatenate([x[w] for x, w in batches])
    assert float(norm.count) == len(rows)
    np.testing.assert_allclose(norm.mean, rows.mean(0), rtol=1e-5)
    np.testing.assert_allclose(norm.var, rows.var(0), rtol=1e-4)


def test_call_sizes_from_env_count_and_cost_model():
    """Layer parameters match the published non-embedding counts (Qwen3-0.6B: 0.44B, Qwen3-4B:
    3.6B); refresh calls hold about the envs expected to end within refresh_wait steps (the
    nearest divisor of the env count to envs * wait / EPISODE_STEPS, by hand below), so 1,024
    envs no longer refresh in calls of 8; micro-batches fill the activation budget."""
    from fused.llm import batching
    from llm_jax.config import Qwen3Config

    small, big = Qwen3Config.shape("qwen3-0.6b"), Qwen3Config.shape("qwen3-4b")
    assert abs(small.block_params(28) / 0.44e9 - 1) < 0.01
    assert abs(big.block_params(36) / 3.6e9 - 1) < 0.01
    assert batching.EPISODE_STEPS == 150  # the hand figures below assume it
    for envs, want in ((1024, 32), (128, 4), (64, 2), (8, 1), (96, 3)):
        # 1024 * 4 / 150 = 27.3 -> 32; 3.41 -> 4; 1.71 -> 2; 0.21 -> 1; 2.56 -> 3 (96 = 3 * 32)
        p = batching.plan(big, 24, envs, 4, 236, 1040, 790, "bfloat16", "gpu")
        assert p.refresh == want and envs % p.microbatch == 0, (envs, p)
    # Micro-batch: the largest divisor whose rows' activations fit the budget, by hand.
    row = 2 * 1040 * (6 * 2560 + 3 * 9728 + 32 * (790 + 1040))
    cap = int(batching.DEVICE_COSTS["gpu"].activation_bytes // row)
    p = batching.plan(big, 24, 1024, 4, 236, 1040, 790, "bfloat16", "gpu")
    assert p.microbatch == max(d for d in (1, 2, 4, 8, 16, 32, 64, 128) if d <= cap)
    # a VL model's vision tower holds more per row: fewer rows fit (by hand)
    extra = 3 * row
    cap_vl = int(batching.DEVICE_COSTS["gpu"].activation_bytes // (row + extra))
    p_vl = batching.plan(big, 24, 1024, 4, 236, 1040, 790, "bfloat16", "gpu", extra)
    assert p_vl.microbatch == max(d for d in (1, 2, 4, 8, 16, 32, 64, 128) if d <= cap_vl)
    assert p_vl.microbatch < p.microbatch
    # One call's cost: weights read once + launches, rows' FLOPs at the matmul rate (by hand).
    dev = batching.DEVICE_COSTS["gpu"]
    fixed, per_row = batching.call_cost(big, 24, 236, "bfloat16", dev)
    params = 24 * 100_925_440
    assert fixed == pytest.approx(2 * params / dev.bandwidth + 24 * 14 * dev.kernel_s)
    assert per_row == pytest.approx(2 * params * 236 / dev.matmul_flops)
    assert p.efficiency == pytest.approx(32 * per_row / (fixed + 32 * per_row))


def test_explicit_call_sizes_win(llm):
    from fused.llm import batching

    auto = batching.for_calls(llm.call_shape, LLMConfig(backend="jax"), 16, "cpu")
    assert auto[:2] == (16, 1)  # tiny model: all rows fit; 16 * 4 / 150 envs wait -> 1
    assert batching.for_calls(llm.call_shape, LLMConfig(backend="jax", microbatch=4,
                                                        refresh_batch=2), 16, "cpu")[:2] == (4, 2)


def test_llm_call_sizes_cost_each_gpu_kind_by_its_own_figures(caplog, tmp_path):
    """With --llm.device-costs docs/gpu/device_costs.json a GPU is costed by its kind (not every
    GPU as an H100), an unknown one (or any, without the file) as an H100 with a notice, and the
    activation budget never exceeds a quarter of the memory it reports; a missing or damaged
    file is one line."""
    import logging

    from fused.llm import batching
    from llm_jax.config import Qwen3Config

    class Fake:
        platform = "gpu"

        def __init__(self, kind, limit=None):
            self.device_kind, self.limit = kind, limit

        def memory_stats(self):
            return {"bytes_limit": self.limit} if self.limit else None

    kinds = batching.gpu_kinds(str(ROOT / "docs/gpu/device_costs.json"))
    cost = lambda kind, limit=None: batching.device_cost(Fake(kind, limit), kinds)  # noqa: E731
    h200 = cost("NVIDIA H200", 141 * 2**30)
    assert h200.bandwidth == 4.8e12 and h200.activation_bytes == 16 * 2**30
    assert cost("NVIDIA A100-SXM4-80GB").bandwidth == 2.0e12
    assert cost("NVIDIA L4").bandwidth == 3.0e11
    assert cost("NVIDIA L40S").bandwidth == 8.6e11  # not L4's
    assert cost("NVIDIA L4", 8 * 2**30).activation_bytes == 2 * 2**30
    with caplog.at_level(logging.INFO, logger="fused"):
        other = cost("Some Future GPU")
    assert other == batching.DEVICE_COSTS["gpu"] and "no cost model" in caplog.text
    assert batching.device_cost(Fake("NVIDIA H200")) == batching.DEVICE_COSTS["gpu"]  # no file
    bad = tmp_path / "costs.json"
    for text in ("{not json", '{"gpu_kinds": {"H200": [1, 2]}}', "[]"):
        bad.write_text(text)
        with pytest.raises(ConfigError, match="llm.device_costs=.*not a readable cost table"):
            batching.gpu_kinds(str(bad))
    with pytest.raises(ConfigError, match="llm.device_costs"):
        validate_llm(LLMConfig(backend="jax", device_costs=str(tmp_path / "nothing.json")),
                     "Craftax-Classic-Symbolic-v1", 8)
    # the sizes follow: L4's smaller budget holds fewer rows per micro-batch than an H100's
    q = Qwen3Config.shape("qwen3-4b")
    args = (q, 24, 1024, 4, 236, 1040, 790, "bfloat16")
    assert (batching.plan(*args, cost("NVIDIA L4")).microbatch
            < batching.plan(*args, "gpu").microbatch)
