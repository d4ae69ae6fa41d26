"""Data parallelism over 2 virtual CPU devices: end to end equal to 1 device where the math says
so (one minibatch per epoch: the gradient is the mean over the same global batch), and with
several minibatches per device, one epoch equal to the unsharded update on the global minibatches
the devices' own permutations make (advantages normalised over the global minibatch)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from conftest import ENCODE_LENGTHS

from fused.commands.train import TrainConfig, validate
from fused.rl.config import EnvConfig, PolicyConfig, PPOConfig
from fused.commands.train import build


def run(cfg: TrainConfig, devices: int, like=None):
    """(final state, each chunk's metrics, the agent). `like`: an agent whose LLM encoder (the
    same random model: its weights, prefix cache) the run reuses, not made again."""
    validate(cfg, devices)
    online = build(cfg, devices, like)
    init, chunk = jax.jit(online.trainer.init), jax.jit(online.trainer.chunk)
    state = init(jax.random.PRNGKey(1), online.frozen)
    rows = []
    for _ in range(cfg.num_chunks):
        state, m = chunk(state, online.frozen, np.int32(cfg.num_updates))
        rows.append(jax.device_get(m))
    return jax.device_get(state), rows, online.agent


def assert_same_run(cfg):
    assert jax.device_count() >= 2
    s1, m1, agent = run(cfg, 1)
    s2, m2, _ = run(cfg, 2, like=agent)
    for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
    # Same episodes were played: env RNG per env does not depend on the device split.
    e1 = np.concatenate([m["episodes"]["return_sum"] for m in m1])
    e2 = np.concatenate([m["episodes"]["return_sum"] for m in m2])
    np.testing.assert_allclose(e1, e2, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(s1.env.obs), np.asarray(s2.env.obs))
    if s1.inputs is not None:
        np.testing.assert_allclose(s1.inputs.hidden, s2.inputs.hidden, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(s1.inputs.norm.var, s2.inputs.norm.var, rtol=1e-4, atol=1e-6)
    return m1, m2


@pytest.mark.slow
def test_two_devices_equal_one_device_on_probe():
    cfg = TrainConfig(
        env=EnvConfig(name="probe-obs-action", num_envs=8, reset="auto"),
        ppo=PPOConfig(num_steps=4, num_minibatches=1, update_epochs=2, lr=1e-2),
        policy=PolicyConfig(layer_width=16, num_layers=2),
        total_timesteps=8 * 4 * 6, updates_per_chunk=3)
    assert_same_run(cfg)


@pytest.mark.slow
def test_two_devices_equal_one_device_on_classic():
    cfg = TrainConfig(
        env=EnvConfig(name="Craftax-Classic-Symbolic-v1", num_envs=4, reset="auto",
                      max_episode_steps=6),
        ppo=PPOConfig(num_steps=4, num_minibatches=1, update_epochs=1),
        policy=PolicyConfig(layer_width=16, num_layers=2),
        total_timesteps=4 * 4 * 4, updates_per_chunk=2)
    m, _ = assert_same_run(cfg)
    assert sum(int(x["episodes"]["episodes"].sum()) for x in m) > 0  # resets happened


@pytest.mark.slow
def test_two_devices_equal_one_device_with_llm():
    """The fused LLM path sharded over 2 devices (per-env LLM state split, normaliser moments
    summed over devices, one branch choice for all) plays and learns as on 1 device. Refreshes
    take every waiting env at once (refresh_batch >= envs, refresh_wait 1) so both splits
    re-encode the same envs at the same steps."""
    from fused.llm.config import LLMConfig

    cfg = TrainConfig(
        env=EnvConfig(name="Craftax-Classic-Symbolic-v1", num_envs=4, reset="auto",
                      max_episode_steps=5),
        ppo=PPOConfig(num_steps=4, num_minibatches=1, update_epochs=1),
        policy=PolicyConfig(layer_width=16, num_layers=2),
        llm=LLMConfig(backend="jax", skip_n=3, refresh_batch=4, refresh_wait=1,
                      encode_lengths=ENCODE_LENGTHS),
        total_timesteps=4 * 4 * 4, updates_per_chunk=2)
    m1, m2 = assert_same_run(cfg)
    for m in (m1, m2):  # counted once per call, not once per device
        calls = sum(float(x["ppo"]["llm/calls"].sum()) for x in m)
        refreshed = sum(float(x["ppo"]["llm/refreshed"].sum()) for x in m)
        assert calls == 5 and refreshed > 0  # steps 3, 6, ..., 15 of 16 (1-based); episodes of 5
    for k in ("llm/refreshed", "llm/tokens"):  # summed over both devices' envs
        np.testing.assert_array_equal(np.concatenate([x["ppo"][k] for x in m1]),
                                      np.concatenate([x["ppo"][k] for x in m2]))


@pytest.mark.slow  # (8-12 s on 2 cores, among the fast lane's slowest: out of it)
def test_sharded_epoch_is_the_update_on_global_minibatches():
    """2 devices x 2 minibatches: device d shuffles its own 8 rows with fold_in(key, d); global
    minibatch j is both devices' j-th 4 rows; its advantages are normalised with the mean and
    std of all 8 of its rows and the gradient is the mean over them. The unsharded
    `minibatch_step` on those global minibatches, built here by hand, must give the same
    parameters. The devices' advantages have different means and scales, so normalising per
    device (or averaging gradients wrongly) would not."""
    from fused.rl.acting import Rollout, network_policy
    from fused.rl.networks import ActorCritic
    from fused.rl.ppo import Ctx, epoch_step, minibatch_step
    from fused.rl.sharding import AXIS, make_mesh

    rng = np.random.default_rng(0)
    n_dev, rows, k = 2, 8, 2
    batch = {"obs": rng.normal(size=(n_dev * rows, 5)).astype(np.float32),
             "action": rng.integers(0, 3, n_dev * rows).astype(np.int32),
             "log_prob": np.full(n_dev * rows, np.log(1 / 3), np.float32),
             "value": rng.normal(size=n_dev * rows).astype(np.float32),
             "advantage": np.concatenate([rng.normal(3.0, 1.0, rows), rng.normal(-1.0, 5.0, rows)]
                                         ).astype(np.float32),
             "target": rng.normal(size=n_dev * rows).astype(np.float32)}
    net = ActorCritic(3, 8, 1)
    params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 5)))
    tx = optax.adam(1e-2)
    ppo = PPOConfig(num_minibatches=k)

    def ctx(axis):
        rollout = Rollout(network_policy(net), None, None, n_dev * rows, rows, axis)
        return Ctx(rollout, tx, ppo)

    key = jax.random.PRNGKey(7)
    sharded = jax.jit(jax.shard_map(lambda b, c: epoch_step(ctx(AXIS), b, c, key),
                                    mesh=make_mesh(n_dev), in_specs=(P(AXIS), P()),
                                    out_specs=(P(), P()), check_vma=False))
    (got, _), _ = sharded(batch, (params, tx.init(params)))

    perms = [np.asarray(jax.random.permutation(jax.random.fold_in(key, d), rows)) + d * rows
             for d in range(n_dev)]
    carry = (params, tx.init(params))
    m = rows // k
    for j in range(k):
        idx = np.concatenate([p[j * m:(j + 1) * m] for p in perms])
        carry, _ = minibatch_step(ctx(None), carry, {n: v[idx] for n, v in batch.items()})
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got,
                 carry[0])
