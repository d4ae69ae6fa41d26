"""PPO must solve each probe environment (known values / policies) in seconds."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fused.commands.train import TrainConfig, validate
from fused.rl.config import EnvConfig, PolicyConfig, PPOConfig
from fused.commands.train import build

GAMMA = 0.9


def probe_config(name: str, updates: int = 150, **env_kw) -> TrainConfig:
    cfg = TrainConfig(
        env=EnvConfig(name=name, num_envs=16, reset="auto", **env_kw),
        ppo=PPOConfig(num_steps=8, num_minibatches=2, update_epochs=4, lr=3e-3, anneal_lr=False,
                      gamma=GAMMA, gae_lambda=0.95, ent_coef=0.0),
        policy=PolicyConfig(layer_width=32, num_layers=2),
        total_timesteps=16 * 8 * updates)
    validate(cfg)
    return cfg


def train_probe(cfg):
    online = build(cfg)
    state, _ = jax.jit(online.trainer.train)(jax.random.PRNGKey(0), online.frozen)
    return lambda obs: online.agent.network.apply(state.params, jnp.asarray(obs, jnp.float32))


@pytest.mark.parametrize("name, obs, expected_value", [
    ("probe-constant", [[0, 1]], [1.0]),
    ("probe-obs-reward", [[1, 1], [-1, 1]], [1.0, -1.0]),
    ("probe-delayed", [[0, 1], [1, 1]], [GAMMA, 1.0]),
])
def test_value_probes(name, obs, expected_value):
    logits, value = train_probe(probe_config(name))(obs)
    np.testing.assert_allclose(value, expected_value, atol=0.1)


@pytest.mark.parametrize("name, obs, best_action", [
    ("probe-action-reward", [[0, 1]], [1]),
    ("probe-obs-action", [[1, 1], [-1, 1]], [1, 0]),
])
def test_policy_probes(name, obs, best_action):
    logits, value = train_probe(probe_config(name))(obs)
    probs = jax.nn.softmax(logits)
    assert np.all(np.asarray(probs)[np.arange(len(obs)), best_action] > 0.9), probs
    np.testing.assert_allclose(value, 1.0, atol=0.15)  # optimal policy earns +1


def test_truncation_is_bootstrapped():
    # Reward 1 every step, episodes cut by a time limit after 3 steps, obs carries no time:
    # with bootstrapping the value is the infinite-horizon 1/(1-gamma) = 10; treating the cut as
    # a termination would give at most 1 + .9 + .81 = 2.71.
    cfg = probe_config("probe-truncated", updates=400, max_episode_steps=3)
    _, value = train_probe(cfg)([[0, 1]])
    assert float(value[0]) == pytest.approx(1 / (1 - GAMMA), rel=0.1)
