"""Data parallelism over 2 virtual CPU devices equals 1 device where the math says so
(one minibatch per epoch: the gradient is the mean over the same global batch)."""

import jax
import numpy as np
import pytest

from fused.config import EnvConfig, PPOConfig, TrainConfig, validate
from fused.train import make_train


def run(cfg: TrainConfig, devices: int):
    validate(cfg, devices)
    tr = make_train(cfg, devices)
    init = tr.init if tr.mesh is not None else jax.jit(tr.init)
    chunk = tr.chunk if tr.mesh is not None else jax.jit(tr.chunk)
    state = init(jax.random.PRNGKey(1), tr.frozen)
    rows = []
    for _ in range(cfg.num_chunks):
        state, m = chunk(state, tr.frozen)
        rows.append(jax.device_get(m))
    return jax.device_get(state), rows


def assert_same_run(cfg):
    assert jax.device_count() >= 2
    s1, m1 = run(cfg, 1)
    s2, m2 = run(cfg, 2)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
    # Same episodes were played: env RNG per env does not depend on the device split.
    e1 = np.concatenate([m["episodes"]["return_sum"] for m in m1])
    e2 = np.concatenate([m["episodes"]["return_sum"] for m in m2])
    np.testing.assert_allclose(e1, e2, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(s1.env.obs), np.asarray(s2.env.obs))
    if s1.llm is not None:
        np.testing.assert_allclose(s1.llm.hidden, s2.llm.hidden, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(s1.llm.norm.var, s2.llm.norm.var, rtol=1e-4, atol=1e-6)
    return m1


def test_two_devices_equal_one_device_on_probe():
    cfg = TrainConfig(
        env=EnvConfig(name="probe-obs-action", num_envs=8, reset="auto"),
        ppo=PPOConfig(num_steps=4, layer_width=16, num_layers=2, num_minibatches=1,
                      update_epochs=2, lr=1e-2),
        total_timesteps=8 * 4 * 6, updates_per_chunk=3)
    assert_same_run(cfg)


@pytest.mark.slow
def test_two_devices_equal_one_device_on_classic():
    cfg = TrainConfig(
        env=EnvConfig(name="Craftax-Classic-Symbolic-v1", num_envs=4, reset="auto",
                      max_episode_steps=6),
        ppo=PPOConfig(num_steps=4, layer_width=16, num_layers=2, num_minibatches=1,
                      update_epochs=1),
        total_timesteps=4 * 4 * 4, updates_per_chunk=2)
    m = assert_same_run(cfg)
    assert sum(int(x["episodes"]["episodes"].sum()) for x in m) > 0  # resets happened


@pytest.mark.slow
def test_two_devices_equal_one_device_with_llm():
    """The fused LLM path sharded over 2 devices (per-env LLM state split, normaliser moments
    summed over devices, one branch choice for all) plays and learns as on 1 device. Refreshes
    take every waiting env at once (refresh_batch >= envs, refresh_wait 1) so both splits
    re-encode the same envs at the same steps."""
    from fused.config import LLMConfig

    cfg = TrainConfig(
        env=EnvConfig(name="Craftax-Classic-Symbolic-v1", num_envs=4, reset="auto",
                      max_episode_steps=5),
        ppo=PPOConfig(num_steps=4, layer_width=16, num_layers=2, num_minibatches=1,
                      update_epochs=1),
        llm=LLMConfig(backend="jax", skip_n=3, refresh_batch=4, refresh_wait=1),
        total_timesteps=4 * 4 * 4, updates_per_chunk=2)
    m = assert_same_run(cfg)
    calls = sum(float(x["ppo"]["llm/calls"].sum()) for x in m)
    refreshed = sum(float(x["ppo"]["llm/refreshed"].sum()) for x in m)
    assert calls == 5 and refreshed > 0  # steps 3, 6, ..., 15 of 16 (1-based); episodes of 5 end
