"""Pixel envs (Craftax's frames as observations) and the CNN policy: the env specs against
craftax itself, the CNN against the public baselines' ActorCriticConv (shapes computed by hand),
the policy choice and its one-line refusals, and PPO on frames end to end with an exploration
bonus over the CNN's features."""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from command_runner import run_command
from conftest import LENGTHS, ROOT, subprocess_env

PIXELS = {"Craftax-Pixels-v1": ((130, 110, 3), 43, 512),
          "Craftax-Classic-Pixels-v1": ((63, 63, 3), 17, 128)}


@pytest.mark.slow  # (a pixel env compiles its renderer: 7 s Classic)
def test_pixel_specs_are_craftax_frames_flattened():
    """Each spec's frame shape, observation size and action count are craftax's; an env's
    observation is craftax's frame for the same key, flattened (Classic: the full game's frame
    goes through the same code, a renderer three times the size to compile)."""
    from craftax.craftax_env import make_craftax_env_from_name

    from fused.envspec import spec
    from fused.rl.config import EnvSettings
    from fused.rl.envs import make_env

    for name, (image, actions, _) in PIXELS.items():
        s = spec(name)
        theirs = make_craftax_env_from_name(name, auto_reset=False)
        assert s.image == image == theirs.observation_space(theirs.default_params).shape
        assert s.obs_dim == int(np.prod(image)) and s.num_actions == actions and not s.has_text
    name = "Craftax-Classic-Pixels-v1"
    s, theirs = spec(name), make_craftax_env_from_name(name, auto_reset=False)
    ours = make_env(EnvSettings(name=name))
    key = jax.random.PRNGKey(3)
    obs, state = jax.jit(ours.reset)(key)  # (eager, the renderer's scans take 90 s)
    frame, _ = jax.jit(theirs.reset_env)(key, theirs.default_params)
    # two compiled programs: the same frame up to float32 rounding of the lighting
    np.testing.assert_allclose(obs, np.asarray(frame).reshape(-1), rtol=0, atol=1e-6)
    step = jax.jit(ours.step)(jax.random.PRNGKey(4), state, jnp.int32(1))
    assert step.obs.shape == (s.obs_dim,)


@pytest.mark.parametrize("name", list(PIXELS))
def test_cnn_is_the_public_actor_critic_conv(name):
    """Three 5 x 5 convs of 32 filters with 3 x 3 max-pools: 128 features at 63 x 63, 512 at
    130 x 110 (by hand: 63 -> 21 -> 7 -> 2; 130 x 110 -> 43 x 36 -> 14 x 12 -> 4 x 4); one torso
    for the actor (Dense W, Dense A, Dense A) and the critic (Dense W, Dense 1)."""
    from fused.rl.networks import ConvActorCritic, conv_features

    image, actions, features = PIXELS[name]
    assert conv_features(image) == features
    net = ConvActorCritic(actions, image, 64)
    x = jax.random.uniform(jax.random.PRNGKey(0), (5, int(np.prod(image))))
    params = net.init(jax.random.PRNGKey(1), x)["params"]
    shapes = jax.tree.map(lambda a: a.shape, params)
    assert [shapes["torso"][f"conv_{i}"]["kernel"] for i in range(3)] == [
        (5, 5, 3, 32), (5, 5, 32, 32), (5, 5, 32, 32)]
    assert (shapes["actor_hidden"]["kernel"], shapes["actor_mid"]["kernel"],
            shapes["actor_head"]["kernel"]) == ((features, 64), (64, actions), (actions, actions))
    assert (shapes["critic_hidden"]["kernel"], shapes["critic_head"]["kernel"]) == (
        (features, 64), (64, 1))
    logits, value = net.apply({"params": params}, x)
    assert logits.shape == (5, actions) and value.shape == (5,)
    np.testing.assert_allclose(net.apply({"params": params}, x, method=ConvActorCritic.actor),
                               logits)


@pytest.mark.parametrize("im2col", [True, False])
def test_conv_is_flax_conv(im2col):
    """The torso's convolution (im2col and a matmul on CPUs, lax.conv elsewhere) draws flax's
    nn.Conv parameters from the same key and computes its output, odd sizes and channels."""
    import flax.linen as nn

    from fused.rl.networks import Conv

    x = jax.random.uniform(jax.random.PRNGKey(0), (3, 13, 11, 4))
    ref = nn.Conv(8, (5, 5))
    params = ref.init(jax.random.PRNGKey(1), x)
    ours = Conv(8, im2col=im2col)
    mine = ours.init(jax.random.PRNGKey(1), x)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), mine, params))
    params = jax.tree.map(lambda a: a + 0.1, params)  # a bias that is not zero
    np.testing.assert_allclose(ours.apply(params, x), ref.apply(params, x), atol=2e-5)


def test_max_pool3_is_flax_max_pool():
    """The torso's pool (a reshape and a max, its gradient elementwise) gives flax's
    nn.max_pool(3 x 3, stride 3) and the gradient jax gives it: frames of small integers, so
    windows hold ties (the gradient goes to the first in row-major order), sizes not a multiple
    of 3 (rows and columns dropped)."""
    import flax.linen as nn

    from fused.rl.networks import max_pool3

    rng = np.random.default_rng(0)
    for shape in [(2, 130, 110, 4), (3, 63, 63, 5), (2, 13, 11, 3), (1, 3, 3, 1)]:
        x = rng.integers(0, 3, shape).astype(np.float32)
        y, back = jax.vjp(max_pool3, x)
        y_ref, back_ref = jax.vjp(lambda v: nn.max_pool(v, (3, 3), strides=(3, 3)), x)
        np.testing.assert_array_equal(y, y_ref)
        g = rng.normal(size=y.shape).astype(np.float32)
        np.testing.assert_array_equal(back(g)[0], back_ref(g)[0])


def test_policies_sharing_a_torso_give_the_value_on_the_way():
    """A policy over a CNN torso shared by actor and critic (the public CNN; the augmented
    network on frames) gives the critic's value with the logits when it acts; one without
    (the MLPs, the augmented network on symbolic observations) gives none, so PPO values its
    rollout in one batch."""
    from fused.rl.acting import network_policy
    from fused.rl.networks import ActorCritic, AugmentedActorCritic, ConvActorCritic

    image = (21, 21, 3)
    frames = jax.random.uniform(jax.random.PRNGKey(0), (3, int(np.prod(image))))
    hidden = jax.random.normal(jax.random.PRNGKey(1), (3, 8))
    cases = [(ConvActorCritic(5, image, 16), frames, True),
             (AugmentedActorCritic(5, 16, 2, image=image), {"obs": frames, "hidden": hidden},
              True),
             (AugmentedActorCritic(5, 16, 2), {"obs": frames[:, :10], "hidden": hidden}, False),
             (ActorCritic(5, 16, 1), frames[:, :10], False)]
    for net, x, shared in cases:
        params = net.init(jax.random.PRNGKey(2), x)
        policy = network_policy(net)
        assert policy.value_on_the_way == shared
        _, logits, value = policy.forward(params, None, x)
        np.testing.assert_allclose(logits, net.apply(params, x, method=type(net).actor),
                                   rtol=1e-6)
        if shared:
            np.testing.assert_allclose(value, policy.critic(params, None, x), rtol=1e-6)
        else:
            assert value is None


@pytest.mark.slow  # (compiles Classic-Pixels' renderer)
def test_cnn_ppo_values_its_rollout_on_the_acting_pass():
    """A CNN's actor and critic share one torso: the rollout's pass gives V(x) with the logits
    (`Policy.value_on_the_way`), so PPO does not value the whole rollout again in one batch (at
    1,024 envs of Craftax-Pixels that batch's first convolution alone is 120 GB). One update
    with those values equals the update with the batched pass (the same policy, flag off): its
    metrics and parameters."""
    from fused.commands.train import TrainConfig, build
    from fused.rl.acting import Rollout, network_policy
    from fused.rl.config import EnvConfig, PolicyConfig, PPOConfig
    from fused.rl.networks import ActorCritic
    from fused.rl.ppo import Ctx, update_step
    from fused.rl.trainer import make_optimizer
    from fused.rl.vec_env import VecEnv

    cfg = TrainConfig(env=EnvConfig(name="Craftax-Classic-Pixels-v1", num_envs=4, reset_pool=2),
                      ppo=PPOConfig(num_steps=4, update_epochs=1, num_minibatches=2),
                      policy=PolicyConfig("cnn", layer_width=16), total_timesteps=4 * 4 * 2,
                      updates_per_chunk=1)
    online = build(cfg)
    policy = network_policy(online.agent.network)
    assert policy.value_on_the_way and not network_policy(ActorCritic(3)).value_on_the_way
    state = jax.jit(online.trainer.init)(jax.random.PRNGKey(0), online.frozen)
    results = []
    for on_the_way in (True, False):
        rollout = Rollout(policy._replace(value_on_the_way=on_the_way), online.agent.inputs,
                          VecEnv(online.env, cfg.env), 4, 4)
        ctx = Ctx(rollout, make_optimizer(cfg), cfg.ppo)
        results.append(jax.jit(lambda rs, f: update_step(ctx, rs, f))(state, online.frozen))
    (new, got), (_, want) = results
    assert float(got["ppo"]["value_mean"]) != 0
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 new.params, results[1][0].params)


def test_policy_kind_auto_and_refusals():
    """`auto` is the CNN on frames and the MLP on vectors, with an LLM the augmented network
    over the CNN's features; a CNN on a symbolic env, an MLP over frames with an LLM, and an
    LLM on an env without text are one line each."""
    from fused.agent import AgentConfig, network_kind, policy_network
    from fused.errors import ConfigError
    from fused.llm.config import LLMConfig
    from fused.llm.encoders import validate_llm
    from fused.rl.config import EnvSettings, PolicyConfig, validate_policy
    from fused.rl.networks import (ActorCritic, AugmentedActorCritic, ConvActorCritic,
                                   RecurrentActorCritic)

    px = AgentConfig(env=EnvSettings(name="Craftax-Classic-Pixels-v1"))
    sym = AgentConfig(env=EnvSettings(name="Craftax-Classic-Symbolic-v1"))
    assert network_kind(px) == "cnn" and isinstance(policy_network(px), ConvActorCritic)
    assert network_kind(sym) == "mlp" and isinstance(policy_network(sym), ActorCritic)
    gru = policy_network(AgentConfig(env=px.env, policy=PolicyConfig("gru")))
    assert isinstance(gru, RecurrentActorCritic) and gru.image == (63, 63, 3)
    with pytest.raises(ConfigError, match="policy.kind=cnn reads frames"):
        validate_policy(PolicyConfig("cnn"), "Craftax-Classic-Symbolic-v1")
    # an LLM on frames: its state joins the CNN's features (the MLP over frames is refused)
    llm = LLMConfig(backend="jax")
    validate_llm(llm, "Craftax-Classic-Pixels-v1", 8)
    aug = policy_network(AgentConfig(env=px.env, llm=llm))
    assert isinstance(aug, AugmentedActorCritic) and aug.image == (63, 63, 3)
    with pytest.raises(ConfigError, match="policy.kind mlp with an LLM"):
        policy_network(AgentConfig(env=px.env, llm=llm, policy=PolicyConfig("mlp")))
    with pytest.raises(ConfigError, match="needs a text renderer"):
        validate_llm(llm, "probe-memory", 8)


@pytest.mark.slow
def test_rnd_over_cnn_features_learns_the_frames_it_sees():
    """RND on frames (its target and predictor each over a CNN of its own): a positive bonus
    on Craftax-Classic-sized frames, zero where an episode ends, and four epochs of its update
    lower its loss on those frames. (PPO on frames end to end, its checkpoints and the probe on
    the run: the README walkthrough, tests/test_readme.py.)"""
    import jax

    from fused.rl.config import ExploreConfig
    from fused.rl.explore import Step, make_explorer

    image = (63, 63, 3)
    ex = make_explorer(ExploreConfig("rnd", layer_width=32, num_layers=1, rnd_output=16,
                                     lr=1e-3), int(np.prod(image)), 17, 8, image)
    s = ex.init(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    frames = jnp.asarray(rng.uniform(0, 1, (2, 8, int(np.prod(image)))), jnp.float32)
    done = jnp.zeros((2, 8), bool).at[0, 3].set(True)
    steps = Step(frames, jnp.zeros((2, 8), jnp.int32), frames, done)
    _, b = jax.jit(ex.bonus)(s, jax.tree.map(lambda x: x[0], steps))
    assert b[3] == 0 and (np.delete(np.asarray(b), 3) > 0).all()
    loss = jax.jit(lambda p: ex.loss(p, s.target, jax.tree.map(lambda x: x.reshape(
        (16,) + x.shape[2:]), steps))[0])
    s2, _ = jax.jit(lambda s, k: ex.update(s, steps, k, 2, None))(s, jax.random.PRNGKey(1))
    assert float(loss(s2.params)) < 0.8 * float(loss(s.params))


def test_frames_are_stored_as_bytes():
    """Frames round to uint8 pictures [N, H, W, 3] (each the observation's frame reshaped, as
    craftax draws it; k / 255 on reading, within 1/510 of the frame, flat again as the policy
    sees it, whatever the leading axes); symbolic maps stay bits, exactly; the layouts the card
    records say so."""
    from fused.envspec import spec
    from fused.rl.obs_codec import ObsCodec

    px = ObsCodec(spec("Craftax-Classic-Pixels-v1"))
    frames = np.random.default_rng(0).uniform(0, 1, (3, px.dim)).astype(np.float32)
    frames[0, :4] = [0.0, 1.0, 0.5 / 255, 254.6 / 255]
    cols, ok = px.encode(np, frames)
    assert px.columns == ["frame"] and not px.exact and ok.all()
    assert cols["frame"].dtype == np.uint8 and cols["frame"].shape == (3, 63, 63, 3)
    assert list(cols["frame"][0, 0, 0]) == [0, 255, 0]  # round half to even: 0.5 -> 0
    assert cols["frame"][0, 0, 1, 0] == 255
    np.testing.assert_array_equal(cols["frame"][2],
                                  np.round(frames[2].reshape(63, 63, 3) * 255))
    back = px.decode(np, cols)
    assert back.dtype == np.float32 and np.abs(back - frames).max() <= 0.5 / 255 + 1e-7
    np.testing.assert_array_equal(back * 255, np.round(frames * 255))
    pairs = cols["frame"].reshape(3, 1, 63, 63, 3)  # [T, B, H, W, C] (a recurrent minibatch)
    np.testing.assert_array_equal(px.decode(np, {"frame": pairs})[:, 0], back)
    assert px.layouts == {"frame": {"shape": [63, 63, 3], "dtype": "uint8",
                                    "layout": "HWC RGB, round(255 x)"}}
    sym = ObsCodec(spec("Craftax-Classic-Symbolic-v1"))
    assert sym.columns == ["obs_bits", "obs_aux"] and sym.exact
    assert list(sym.layouts) == sym.columns
    assert [sym.layouts[c]["shape"][0] for c in sym.columns] == [
        -(-sym.map_size // 8), sym.dim - sym.map_size]


# label.py generate on frames, verify, returns, offline.py bc and the label refusal:
# tests/test_readme_pixels.py::test_a_dataset_of_frames_through_offline, on the README
# walkthrough's dataset of frames


def test_a_missing_observation_column_is_one_line(tmp_path):
    """A shard without the columns its env's codec reads (say, a pixel dataset written by hand
    with float vectors) stops with a DatasetError naming what it holds, not a zarr KeyError."""
    from fused.data.store import DatasetError, read_group, write_group

    write_group(tmp_path / "g", {"obs": np.zeros((3, 4), np.float32),
                                 "action": np.zeros(3, np.uint8)})
    with pytest.raises(DatasetError, match=r"no array 'frame' \(it holds action, obs\)"):
        read_group(tmp_path / "g", ["frame", "action"])
    assert read_group(tmp_path / "g", ["action"])["action"].shape == (3,)


def v1_frames_dataset(root, frames: np.ndarray, episode_len: int = 4):
    """A Classic-Pixels dataset as the v1 writer left it, built with the store's own functions:
    frames flat [N, H * W * 3] uint8, a v1 card without layouts; then a returns set."""
    from rich.console import Console

    from fused.data.config import ReturnsConfig
    from fused.data.returns import compute_returns
    from fused.data.store import FORMAT_V1, Dataset, commit_group

    n = len(frames)
    ds = Dataset(root)
    ds.write_card({"format": FORMAT_V1, "env": "Craftax-Classic-Pixels-v1", "policy": "random",
                   "generate": {}, "labels": {}, "returns": {}})
    entries = []
    for i, start in enumerate(range(0, n, 8)):
        sl = slice(start, min(n, start + 8))
        k = sl.stop - sl.start
        step = np.arange(sl.start, sl.stop) % episode_len
        entries.append(commit_group(ds.shard_dir(f"s000-{i:06d}"), {
            "frame": frames[sl], "action": (np.arange(k) % 17).astype(np.uint8),
            "reward": np.ones(k, np.float32), "terminated": step == episode_len - 1,
            "truncated": np.zeros(k, bool), "log_prob": np.zeros(k, np.float32),
            "value": np.full(k, np.nan, np.float32),
            "truncation_value": np.zeros(k, np.float32),
            "step": step.astype(np.int32), "t": np.arange(sl.start, sl.stop, dtype=np.int32),
            "episode_id": (np.arange(sl.start, sl.stop) // episode_len).astype(np.int64)}))
    ds.write_manifest({"shards": entries, "labels": {}, "returns": {}})
    compute_returns(ReturnsConfig(data=str(root), gamma=0.99), Console(quiet=True))
    return ds


def test_a_v1_dataset_of_flat_frames_reads_as_pictures(tmp_path):
    """A dataset written before frames were pictures (v1: flat, no layouts in its card) reads
    through today's reader and loader as [N, H, W, 3], the same bytes; a returns set added to it
    keeps its v1 card; a frame column of another size is one line."""
    from fused.data.loader import load_training_data
    from fused.data.store import FORMAT_V1, Dataset, DatasetError, to_layout
    from fused.envspec import spec
    from fused.rl.obs_codec import ObsCodec

    frames = np.random.default_rng(0).integers(0, 256, (12, 63 * 63 * 3), np.uint8)
    ds = v1_frames_dataset(tmp_path / "d", frames)
    card = Dataset(ds.root).card()
    assert card["format"] == FORMAT_V1 and "observation" not in card and card["returns"]
    codec = ObsCodec(spec("Craftax-Classic-Pixels-v1"))
    assert ds.observation() == codec.layouts
    first = ds.read("s000-000000", ["frame"], np.array([1, 3]))["frame"]
    np.testing.assert_array_equal(first, frames[[1, 3]].reshape(2, 63, 63, 3))
    data, _, _ = load_training_data(str(ds.root))
    np.testing.assert_array_equal(data.arrays["rows"]["frame"], frames.reshape(12, 63, 63, 3))
    np.testing.assert_array_equal(codec.decode(np, data.arrays["rows"]) * 255, frames)
    with pytest.raises(DatasetError, match=r"column 'frame' holds rows of shape \[10\], not "
                                           r"the \[63, 63, 3\]"):
        to_layout({"frame": np.zeros((2, 10), np.uint8)}, codec.layouts)


def test_a_v1_generations_resume_point_goes_on_as_pictures(tmp_path):
    """A resume point a v1 `label.py generate` saved (its waiting rows' frames flat) is read back
    with its frames as the pictures the shards written now hold, the carry as it was."""
    from fused.data.generate import resume_rows
    from fused.data.store import commit_group

    frames = np.random.default_rng(0).integers(0, 256, (5, 63 * 63 * 3), np.uint8)
    carry = np.arange(7, dtype=np.int32)
    commit_group(tmp_path / "resume-0000000006", {"frame": frames, "carry_0000": carry,
                                                  "waiting_env": np.zeros(5, np.int32)})
    cols = resume_rows(tmp_path / "resume-0000000006", "Craftax-Classic-Pixels-v1")
    np.testing.assert_array_equal(cols["frame"], frames.reshape(5, 63, 63, 3))
    np.testing.assert_array_equal(cols["carry_0000"], carry)


@pytest.mark.slow  # (compiles the CNN's training chunk)
def test_offline_training_takes_a_v1_dataset_of_frames(tmp_path):
    """offline.py bc trains the CNN on a v1 dataset of flat frames as on today's."""
    from fused.commands import offline

    frames = np.random.default_rng(0).integers(0, 256, (16, 63 * 63 * 3), np.uint8)
    ds = v1_frames_dataset(tmp_path / "d", frames)
    run = offline.main(["bc", "smoke", "--data", str(ds.root), "--out-dir", str(tmp_path),
                        "--run-name", "bc", "--num-updates", "2", "--updates-per-chunk", "2",
                        "--batch-size", "16"])
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in metrics] == [1, 2]
    assert all(np.isfinite(m["loss/actor"]) for m in metrics)


def test_a_dataset_too_big_for_memory_names_device_rows(monkeypatch):
    """A million Craftax-Pixels rows (43 GB of frames) on a machine with 8 GB free: offline
    training stops before reading anything, in one line naming --device-rows with a window of
    whole shards that fits; a dataset that fits passes."""
    from types import SimpleNamespace

    import llm_jax.memory as mem
    from fused.commands.offline_train import OfflineConfig, check_in_memory
    from fused.data.store import DatasetError

    monkeypatch.setattr(mem, "available_bytes", lambda device=None: (8 * 10**9, "available RAM"))
    big = SimpleNamespace(env="Craftax-Pixels-v1", rows=[8192] * 123)
    with pytest.raises(DatasetError,
                       match=r"1,007,616 rows take ~86.5 GB .* --device-rows 22528$"):
        check_in_memory(OfflineConfig(data="d"), big)
    check_in_memory(OfflineConfig(data="d"), SimpleNamespace(env="Craftax-Pixels-v1",
                                                             rows=[8192] * 2))


@pytest.mark.slow  # (compiles Classic-Pixels' renderer)
def test_an_llm_beside_the_cnn_reads_the_text_of_the_same_state():
    """A pixel env with an LLM observes the frame, then its text twin's observation of the
    same state (Craftax's two envs' get_obs, the reference); the LLM's renderer reads the text
    part as the symbolic env's renderer reads its observation (tokens equal the tokenizer on
    the reference text); the CNN and the dataset see the frame alone."""
    from craftax.craftax_env import make_craftax_env_from_name

    from fused.envspec import spec
    from fused.rl.envs import CraftaxEnv
    from fused.rl.networks import AugmentedActorCritic
    from fused.rl.obs_codec import ObsCodec
    from fused.text.format import get_layout, render_text
    from fused.text.render import make_renderer, render_tokens
    from llm_jax.tokenizer import load_tokenizer

    px, sym = "Craftax-Classic-Pixels-v1", "Craftax-Classic-Symbolic-v1"
    env = CraftaxEnv(spec(px), text=True)
    frame_dim, sym_dim = spec(px).obs_dim, spec(sym).obs_dim
    assert env.obs_dim == frame_dim + sym_dim
    ref_px = make_craftax_env_from_name(px, auto_reset=False)
    ref_sym = make_craftax_env_from_name(sym, auto_reset=False)
    obs, state = jax.jit(env.reset)(jax.random.PRNGKey(3))
    # strongly typed leaves: reset's weakly typed scalars would compile each program twice
    state = jax.tree.map(np.asarray, state)
    step, get_px, get_sym = jax.jit(env.step), jax.jit(ref_px.get_obs), jax.jit(ref_sym.get_obs)
    rows = []
    for k in range(6):
        want_px = np.asarray(get_px(state)).reshape(-1)
        want_sym = np.asarray(get_sym(state)).reshape(-1)
        np.testing.assert_allclose(np.asarray(obs[:frame_dim]), want_px, atol=1e-6)
        np.testing.assert_array_equal(np.asarray(obs[frame_dim:]), want_sym)
        rows.append(np.asarray(obs))
        res = step(jax.random.PRNGKey(k), state, jnp.int32(k % 6))
        obs, state = res.obs, res.state
    rows = np.stack(rows)
    tok = load_tokenizer()
    tokens, lengths = render_tokens(make_renderer(px, tok), jnp.asarray(rows))
    for i, o in enumerate(rows):
        ids = tok.encode(render_text(get_layout(sym), o[frame_dim:]))
        assert list(np.asarray(tokens[i, :int(lengths[i])])) == ids
    net = AugmentedActorCritic(17, 32, 2, image=spec(px).image)
    inp = {"obs": jnp.asarray(rows), "hidden": jnp.ones((6, 8))}
    params = net.init(jax.random.PRNGKey(0), inp)
    alone = {"obs": jnp.asarray(rows[:, :frame_dim]), "hidden": inp["hidden"]}
    for a, b in zip(net.apply(params, inp), net.apply(params, alone)):
        np.testing.assert_array_equal(a, b)  # the text part never reaches the CNN
    cols, _ = ObsCodec(spec(px)).encode(np, rows)
    assert cols["frame"].shape == (6,) + spec(px).image


def _run(script, *args):
    p = run_command([sys.executable, str(ROOT / script), *args], env=subprocess_env(),
                    capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-3000:]
    return p


@pytest.mark.slow
def test_ppo_on_frames_with_an_llm_trains_evaluates_and_plays(tmp_path):
    """train.py cpu-pixels with the tiny random Qwen3 beside the CNN trains (finite losses, a
    checkpoint) and `offline.py eval` evaluates it on the same observations. (`play.py llm`
    on a pixel env, recording frames: tests/test_human.py, with golden shots.)"""
    _run("train.py", "cpu-pixels", "--llm.backend", "jax", *LENGTHS, "--total-timesteps", "256",
        "--env.num-envs", "8", "--ppo.num-steps", "16", "--ppo.update-epochs", "1",
        "--out-dir", str(tmp_path), "--run-name", "px")
    metrics = [json.loads(x) for x in (tmp_path / "px" / "metrics.jsonl").read_text().splitlines()]
    assert metrics and all(np.isfinite(m["loss/total"]) for m in metrics if "loss/total" in m)
    assert any("llm/calls" in k or k.startswith("llm") for k in metrics[-1]), metrics[-1].keys()
    _run("offline.py", "eval", "--run", str(tmp_path / "px"), "--episodes", "2", "--max-steps",
        "8")
    ev = json.loads((tmp_path / "px" / "eval.json").read_text())
    assert ev["episodes"] == 2 and ev["length_mean"] == 8
