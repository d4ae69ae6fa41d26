"""GAE and the PPO loss against values computed by hand; a chunk of updates skips those past
the end and traces its update once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fused.rl.ppo import categorical_entropy, categorical_log_prob, gae, ppo_loss
from fused.rl.updates import scan_updates


def test_gae_hand_computed_with_termination_and_truncation():
    g, lam = 0.5, 0.5
    # One env, T=4: step 1 terminates, step 2 is a plain step, step 3 truncates.
    r = jnp.array([[1.0], [2.0], [0.0], [3.0]])
    v = jnp.array([[0.5], [1.0], [2.0], [4.0]])
    term = jnp.array([[False], [True], [False], [False]])
    trunc = jnp.array([[False], [False], [False], [True]])
    tv = jnp.array([[0.0], [0.0], [0.0], [10.0]])  # V(final obs) at the truncation
    last = jnp.array([100.0])  # belongs to the new episode: must not leak into step 3
    adv, ret = gae(r, v, term, trunc, tv, last, g, lam)
    # deltas: t3 = 3 + .5*10 - 4 = 4 ; t2 = 0 + .5*4 - 2 = 0 ; t1 = 2 + 0 - 1 = 1 ;
    #         t0 = 1 + .5*1 - .5 = 1
    # advantages (gamma*lam = .25, cut after t1 and t3):
    #   A3 = 4 ; A2 = 0 + .25*4 = 1 ; A1 = 1 ; A0 = 1 + .25*1 = 1.25
    np.testing.assert_allclose(adv[:, 0], [1.25, 1.0, 1.0, 4.0], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0], [1.75, 2.0, 3.0, 8.0], rtol=1e-6)


def test_gae_bootstraps_from_last_value_without_done():
    r = jnp.zeros((2, 1))
    v = jnp.zeros((2, 1))
    f = jnp.zeros((2, 1), bool)
    adv, _ = gae(r, v, f, f, jnp.zeros((2, 1)), jnp.array([8.0]), 0.5, 1.0)
    np.testing.assert_allclose(adv[:, 0], [2.0, 4.0])  # 0.5^2*8, 0.5*8


def test_categorical_pieces():
    logits = jnp.log(jnp.array([[0.2, 0.8]]))
    assert float(categorical_log_prob(logits, jnp.array([1]))[0]) == pytest.approx(np.log(0.8))
    h = -(0.2 * np.log(0.2) + 0.8 * np.log(0.8))
    assert float(categorical_entropy(logits)[0]) == pytest.approx(h, rel=1e-6)


def test_ppo_loss_hand_computed():
    # Two samples, 2 actions. Sample 0: ratio 1.5, adv +1: min(1.5, 1.2) = 1.2.
    # Sample 1: ratio 0.5, adv -1: min(-0.5, -0.8) = -0.8.
    p0, p1 = 0.6, 0.3
    logits = jnp.log(jnp.array([[1 - p0, p0], [1 - p1, p1]]))
    action = jnp.array([1, 1])
    old_lp = jnp.log(jnp.array([p0 / 1.5, p1 / 0.5]))
    adv = jnp.array([1.0, -1.0])
    value = jnp.array([1.0, 0.0])
    old_value = jnp.array([0.5, 0.0])
    target = jnp.array([2.0, 1.0])
    loss, m = ppo_loss(logits, value, action, old_lp, old_value, adv, target,
                       clip_eps=0.2, vf_coef=0.5, ent_coef=0.01)
    pg = -(1.2 * 1.0 + -0.8) / 2  # = -0.2
    # value: sample 0 v=1 (clipped to .5+.2=.7): max((1-2)^2, (.7-2)^2)=1.69; sample 1: 1
    vl = 0.5 * (1.69 + 1.0) / 2
    ent = np.mean([-(q * np.log(q) + (1 - q) * np.log(1 - q)) for q in (p0, p1)])
    assert float(m["loss/policy"]) == pytest.approx(pg, rel=1e-5)
    assert float(m["loss/value"]) == pytest.approx(vl, rel=1e-5)
    assert float(loss) == pytest.approx(pg + 0.5 * vl - 0.01 * ent, rel=1e-5)
    assert float(m["loss/clip_frac"]) == pytest.approx(1.0)


def test_a_chunk_skips_updates_past_the_end_and_traces_the_update_once():
    traces = []

    def update(s, step):
        traces.append(s)
        return s + step, {"twice": 2.0 * s, "active": jnp.bool_(True)}

    # 5 updates of +1 from 0, each while the state is below 3: updates 4 and 5 are skipped
    s, m = jax.jit(lambda s: scan_updates(update, s, 1.0, 5, lambda s: s < 3.0))(0.0)
    assert float(s) == 3.0
    np.testing.assert_array_equal(m["twice"], [0.0, 2.0, 4.0, 0.0, 0.0])
    np.testing.assert_array_equal(m["active"], [True, True, True, False, False])
    assert len(traces) == 1  # (twice when the skipped branch's shapes came from a second trace)


def test_learning_rate_decay_is_optaxs_as_compiled_with_the_length_as_data():
    """The schedule with the run's length an int32 argument gives, bit for bit, what
    `optax.linear_schedule` compiled with the length as a constant gives, on a scalar count as
    the optimiser has it (XLA multiplies by the constant's reciprocal there: 37 / 80 is not
    37 * (1 / 80) in float32), and so does the schedule given a Python int; counts from before
    the start to past the end."""
    import optax

    from fused.rl.trainer import linear_decay

    traced = jax.jit(lambda c, n: linear_decay(5e-4, n)(c))
    for steps in (3, 80, 224, 976_544):
        want = jax.jit(optax.linear_schedule(5e-4, 0.0, steps))
        constant = jax.jit(linear_decay(5e-4, steps))
        for c in (*range(-2, 120), *range(steps - 100, steps + 3)):
            w = np.asarray(want(jnp.int32(c))).view(np.int32)
            got = traced(jnp.int32(c), jnp.int32(steps))
            assert np.asarray(got).view(np.int32) == w, (steps, c)
            assert np.asarray(constant(jnp.int32(c))).view(np.int32) == w, (steps, c)


def test_runs_of_any_length_share_one_chunk_program():
    """A PPO chunk takes the run's length as data: configs that differ only in
    total_timesteps lower to the same program (the persistent cache's key), so a resume with
    another --total-timesteps, or a run of another length, compiles nothing new."""
    from fused.commands.train import TrainConfig, build, validate
    from fused.rl.config import EnvConfig, PolicyConfig, PPOConfig

    texts = []
    for updates in (3, 40):
        cfg = TrainConfig(env=EnvConfig(name="probe-memory", num_envs=4, reset="auto"),
                          ppo=PPOConfig(num_steps=4, num_minibatches=1, update_epochs=1),
                          policy=PolicyConfig(layer_width=8), total_timesteps=16 * updates,
                          updates_per_chunk=2)
        validate(cfg)
        tr = build(cfg).trainer
        state = jax.eval_shape(tr.init, jax.random.PRNGKey(0), None)
        texts.append(jax.jit(tr.chunk).lower(state, None, np.int32(cfg.num_updates)).as_text())
    assert texts[0] == texts[1]
