"""Pixel envs (Craftax's frames as observations) and the CNN policy: the env specs against
craftax itself, the CNN against the public baselines' ActorCriticConv (shapes computed by hand),
the policy choice and its one-line refusals, and PPO on frames end to end with an exploration
bonus over the CNN's features."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ROOT, subprocess_env

PIXELS = {"Craftax-Pixels-v1": ((130, 110, 3), 43, 512),
          "Craftax-Classic-Pixels-v1": ((63, 63, 3), 17, 128)}


@pytest.mark.slow  # (a pixel env compiles its renderer: 7 s Classic, 20 s the full game)
@pytest.mark.parametrize("name", list(PIXELS))
def test_pixel_specs_are_craftax_frames_flattened(name):
    """Each spec's frame shape, observation size and action count are craftax's; an env's
    observation is craftax's frame for the same key, flattened."""
    from craftax.craftax_env import make_craftax_env_from_name

    from fused.envspec import spec
    from fused.rl.config import EnvSettings
    from fused.rl.envs import make_env

    image, actions, _ = PIXELS[name]
    s = spec(name)
    theirs = make_craftax_env_from_name(name, auto_reset=False)
    assert s.image == image == theirs.observation_space(theirs.default_params).shape
    assert s.obs_dim == int(np.prod(image)) and s.num_actions == actions and not s.has_text
    ours = make_env(EnvSettings(name=name))
    key = jax.random.PRNGKey(3)
    obs, state = ours.reset(key)
    frame, _ = theirs.reset_env(key, theirs.default_params)
    np.testing.assert_array_equal(obs, np.asarray(frame).reshape(-1))
    step = ours.step(jax.random.PRNGKey(4), state, jnp.int32(1))
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


def test_policy_kind_auto_and_refusals():
    """`auto` is the CNN on frames and the MLP on vectors; a CNN on a symbolic env and an LLM on
    frames are one line each."""
    from fused.agent import AgentConfig, network_kind, policy_network
    from fused.errors import ConfigError
    from fused.llm.config import LLMConfig, validate_llm
    from fused.rl.config import EnvSettings, PolicyConfig, validate_policy
    from fused.rl.networks import ActorCritic, ConvActorCritic, RecurrentActorCritic

    px = AgentConfig(env=EnvSettings(name="Craftax-Classic-Pixels-v1"))
    sym = AgentConfig(env=EnvSettings(name="Craftax-Classic-Symbolic-v1"))
    assert network_kind(px) == "cnn" and isinstance(policy_network(px), ConvActorCritic)
    assert network_kind(sym) == "mlp" and isinstance(policy_network(sym), ActorCritic)
    gru = policy_network(AgentConfig(env=px.env, policy=PolicyConfig("gru")))
    assert isinstance(gru, RecurrentActorCritic) and gru.image == (63, 63, 3)
    with pytest.raises(ConfigError, match="policy.kind=cnn reads frames"):
        validate_policy(PolicyConfig("cnn"), "Craftax-Classic-Symbolic-v1")
    with pytest.raises(ConfigError, match="needs a text renderer"):
        validate_llm(LLMConfig(backend="jax"), "Craftax-Classic-Pixels-v1", 8)


@pytest.mark.slow
def test_ppo_on_frames_with_rnd_trains(tmp_path):
    """train.py on Craftax-Classic-Pixels with the CNN and the RND bonus over CNN features: six
    updates with finite losses and bonuses, checkpoints written (resuming is the same mechanism
    as on vectors, tested there). Compiled with XLA's optimisation on: at the tests' level 0 its
    convolutions run 2-3x slower than the whole compile saves."""
    env = subprocess_env()
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if not f.startswith("--xla_backend_optimization_level"))
    cmd = [sys.executable, str(ROOT / "train.py"), "smoke", "--env.name",
           "Craftax-Classic-Pixels-v1", "--explore.kind", "rnd", "--explore.layer-width", "32",
           "--out-dir", str(tmp_path), "--run-name", "px"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    run = tmp_path / "px"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(np.isfinite(r["loss/value"]) and r["explore/intrinsic_mean"] >= 0 for r in rows)
    assert sorted(int(c.name) for c in (run / "checkpoints").iterdir()) == [2, 4, 6]
