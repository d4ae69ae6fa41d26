"""Vectorised env wrapper: resets (optimistic pool, auto), episode logging, truncation, and a
real Craftax death (terminated, not truncated)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fused.rl.config import EnvConfig
from fused.rl.envs import make_env
from fused.rl.vec_env import VecEnv


def run_steps(cfg: EnvConfig, num_steps: int, seed: int = 0, action: int = 0):
    env = make_env(cfg)
    venv = VecEnv(env, cfg)
    key = jax.random.PRNGKey(seed)
    n = cfg.num_envs

    @jax.jit
    def go(key):
        k0, k1, k2 = jax.random.split(key, 3)
        state = venv.reset(jax.random.split(k0, n), k1)

        def body(state, k):
            ka, kb = jax.random.split(k)
            new, out = venv.step(jax.random.split(ka, n), kb, state,
                                 jnp.full((n,), action, jnp.int32))
            return new, (state, out)

        return jax.lax.scan(body, state, jax.random.split(k2, num_steps))

    return env, go(key)


def test_optimistic_pool_hands_out_pool_worlds_and_counts_reuse():
    cfg = EnvConfig(name="probe-truncated", num_envs=4, reset="optimistic", reset_pool=2,
                    worlds_per_step=1, max_episode_steps=3)
    _, (final, (before, out)) = run_steps(cfg, 6)
    done = np.asarray(out.truncated)
    assert done[2].all() and done[5].all() and not done[[0, 1, 3, 4]].any()
    assert not np.asarray(out.terminated).any()
    # Episode logging: 3 steps of reward 1.
    np.testing.assert_allclose(np.asarray(out.episode_return)[2], 3.0)
    np.testing.assert_array_equal(np.asarray(out.episode_length)[2], 3)
    # Envs reset at step 2 got pool slots cursor+k mod 2 = 0, 1, 0, 1 of the pool before it.
    pool_obs = np.asarray(before.pool.obs[2])
    np.testing.assert_array_equal(np.asarray(out.obs[2]), pool_obs[[0, 1, 0, 1]])
    # 4 resets from a fresh pool of 2: slots 0 and 1 each served twice -> 2 reuses.
    assert int(out.reset_reuse[2]) == 2
    # After step 2 the pool cursor moved by worlds_per_step and one slot was regenerated.
    assert int(before.pool.cursor[3][0]) == 1


@pytest.mark.slow
def test_auto_reset_on_classic_truncates_and_starts_fresh_worlds():
    cfg = EnvConfig(name="Craftax-Classic-Symbolic-v1", num_envs=4, reset="auto",
                    max_episode_steps=4)
    env, (final, (before, out)) = run_steps(cfg, 5)
    assert env.obs_dim == 1345 and env.num_actions == 17 and len(env.achievement_names) == 22
    trunc, term = np.asarray(out.truncated), np.asarray(out.terminated)
    assert trunc[3].all() and not trunc[[0, 1, 2, 4]].any() and not term.any()
    # Returns logged at the end equal the summed rewards of the episode.
    np.testing.assert_allclose(np.asarray(out.episode_return[3]),
                               np.asarray(out.reward[:4]).sum(0), rtol=1e-6)
    # The env state after the reset is a new episode: timestep 0, running return cleared.
    assert (np.asarray(before.state.timestep[4]) == 0).all()
    assert (np.asarray(before.episode_return[4]) == 0).all()
    assert not np.array_equal(np.asarray(out.obs[3]), np.asarray(out.final_obs[3]))


@pytest.mark.slow
def test_symbolic_env_shapes_and_optimistic_reset_survive_deaths():
    # Always attacking/noop on full Craftax rarely dies in 4 steps; a short limit exercises
    # the pool path on the 8268-float symbolic observation.
    cfg = EnvConfig(name="Craftax-Symbolic-v1", num_envs=2, reset="optimistic", reset_pool=2,
                    max_episode_steps=2)
    env, (final, (before, out)) = run_steps(cfg, 3)
    assert env.obs_dim == 8268 and env.num_actions == 43 and len(env.achievement_names) == 67
    assert np.asarray(out.truncated[1]).all()
    np.testing.assert_array_equal(np.asarray(out.obs[1]), np.asarray(before.pool.obs[1]))


@pytest.mark.slow
def test_classic_starvation_death_is_terminated_and_reset():
    """Health 1, no food, recovery one step from its threshold: the env's own health rule
    takes the last point on the next step. That is a termination (value 0 after it), never a
    truncation; the env gets a fresh world and the episode is logged with the -0.1 health
    reward."""
    cfg = EnvConfig(name="Craftax-Classic-Symbolic-v1", num_envs=2, reset="auto")
    env = make_env(cfg)
    venv = VecEnv(env, cfg)

    @jax.jit
    def go(key):
        k0, k1, k2 = jax.random.split(key, 3)
        s = venv.reset(jax.random.split(k0, 2), k1)
        dying = s.state.replace(
            player_health=s.state.player_health.at[0].set(1),
            player_food=s.state.player_food.at[0].set(0),
            player_recover=s.state.player_recover.at[0].set(-15.0))
        s = s.replace(state=dying)
        return venv.step(jax.random.split(k2, 2), k2, s, jnp.zeros(2, jnp.int32))  # NOOP

    new, out = go(jax.random.PRNGKey(0))
    assert np.asarray(out.terminated).tolist() == [True, False]
    assert not np.asarray(out.truncated).any()
    assert float(out.reward[0]) == pytest.approx(-0.1)  # health 1 -> 0
    assert float(out.episode_return[0]) == pytest.approx(-0.1) and int(out.episode_length[0]) == 1
    assert int(new.state.timestep[0]) == 0 and int(new.state.player_health[0]) == 9  # new world
    assert int(new.episode_length[0]) == 0 and int(new.episode_length[1]) == 1


def test_env_impl_is_a_setting_every_command_takes_and_records(tmp_path):
    """`--env.impl fast` is a field of the env settings every command takes (GameSettings),
    recorded where the config is (config.json, a dataset's card); the envs that have a fast step
    are the ones `fused.envs` steps itself; elsewhere it is one line before any work; a dataset
    written before the field existed still resumes (its card read with the field's default)."""
    from fused.data.config import GenerateConfig
    from fused.data.generate import check_card
    from fused.data.store import Dataset
    from fused.envs.craftax_envs import FAST
    from fused.envspec import SPECS
    from fused.errors import ConfigError
    from fused.rl.config import EnvSettings, GameSettings, validate_game
    from fused.runs.config_io import to_dict

    assert {n for n, s in SPECS.items() if s.fast_step} == set(FAST)
    validate_game(GameSettings(name="Craftax-Classic-Symbolic-v1", impl="fast"))
    validate_game(GameSettings(name="Craftax-Symbolic-v1", impl="fast"))
    with pytest.raises(ConfigError, match="env.impl=fast: probe-constant has no fast step"):
        validate_game(GameSettings(name="probe-constant", impl="fast"))
    c = GenerateConfig(out=str(tmp_path / "d"),
                       env=EnvSettings(name="Craftax-Classic-Symbolic-v1"))
    assert to_dict(c)["env"]["impl"] == "craftax"
    now = {"env": c.env.name, "generate": to_dict(c), "policy": "random"}
    before = dict(now, generate=dict(now["generate"], env={
        k: v for k, v in now["generate"]["env"].items() if k != "impl"}))
    Dataset(tmp_path / "d").write_card(before)
    check_card(Dataset(tmp_path / "d"), now)  # (resumes)
    with pytest.raises(ConfigError, match="generated with env="):
        check_card(Dataset(tmp_path / "d"), dict(now, generate=dict(
            now["generate"], env=dict(now["generate"]["env"], impl="fast"))))


def test_a_vmapped_classic_reset_makes_each_envs_own_world():
    """Craftax-Classic's worlds from a vmapped reset of 16 envs equal each env's reset alone, and
    their terrain noise equals numpy's (float64) from the same angles: with XLA:CPU's YNNPACK
    reduce fusions (jax 0.10's default; `fused.commands` turns them off) every env past the
    eighth got noise off by up to ~1.5 and another world."""
    import fused.commands  # noqa: F401  (what every command's process sets; the test's too)
    from craftax.craftax_classic.util.noise import generate_perlin_noise_2d

    from fused.envs import make_craftax_env

    env = make_craftax_env("Craftax-Classic-Symbolic-v1", "craftax")  # (Craftax's own env)
    params = env.default_params
    keys = jax.random.split(jax.random.PRNGKey(0), 16)
    batched = jax.jit(jax.vmap(lambda k: env.reset_env(k, params)[1].map))(keys)
    one = jax.jit(lambda k: env.reset_env(k, params)[1].map)
    alone = np.stack([np.asarray(one(k)) for k in keys])
    np.testing.assert_array_equal(np.asarray(batched), alone)

    angles = np.asarray(jax.random.uniform(jax.random.PRNGKey(3), (16, 5, 5)))
    noise = jax.jit(jax.vmap(lambda a: generate_perlin_noise_2d(
        jax.random.PRNGKey(0), (64, 64), (4, 4), override_angles=a)))(jnp.asarray(angles))
    np.testing.assert_allclose(np.asarray(noise), np.stack([_perlin(a) for a in angles]),
                               atol=1e-5)


def _perlin(angles: np.ndarray, shape=(64, 64), res=(4, 4)) -> np.ndarray:
    """Perlin noise from gradient angles in [0, 1) (P. Vigier's perlin-numpy, which Craftax's
    noise ports to jnp), in float64."""
    d = (shape[0] // res[0], shape[1] // res[1])
    grid = np.mgrid[0:res[0]:res[0] / shape[0], 0:res[1]:res[1] / shape[1]].transpose(1, 2, 0) % 1
    theta = 2 * np.pi * angles.astype(np.float64)
    g = np.dstack((np.cos(theta), np.sin(theta))).repeat(d[0], 0).repeat(d[1], 1)
    x, y = grid[..., 0], grid[..., 1]
    n00 = x * g[:-d[0], :-d[1], 0] + y * g[:-d[0], :-d[1], 1]
    n10 = (x - 1) * g[d[0]:, :-d[1], 0] + y * g[d[0]:, :-d[1], 1]
    n01 = x * g[:-d[0], d[1]:, 0] + (y - 1) * g[:-d[0], d[1]:, 1]
    n11 = (x - 1) * g[d[0]:, d[1]:, 0] + (y - 1) * g[d[0]:, d[1]:, 1]
    t = grid ** 3 * (grid * (grid * 6 - 15) + 10)
    n0 = n00 * (1 - t[..., 0]) + t[..., 0] * n10
    n1 = n01 * (1 - t[..., 0]) + t[..., 0] * n11
    return np.sqrt(2) * ((1 - t[..., 1]) * n0 + t[..., 1] * n1)


@pytest.mark.slow
def test_worlds_made_by_their_own_program_start_the_same_state():
    """`jit_init`: PPO's, the collector's and evaluation's first state, its Craftax worlds (3
    envs and a pool of 2) made by programs of their own, equals bit for bit the state of `init`
    jitted whole (the worlds made inside it), and its worlds are those of the keys each made
    before (PPO: the second and third of 4 split from the seed; collecting: the first two of 3;
    evaluation: episode i's key folded from the first of 2)."""
    from fused.commands.train import TrainConfig, build
    from fused.envspec import spec
    from fused.rl.acting import random_policy
    from fused.rl.collect import make_collect
    from fused.rl.config import PPOConfig
    from fused.rl.evaluate import episode_keys, make_evaluate
    from fused.rl.policy_input import Identity
    from fused.rl.sharding import jit_init

    name = "Craftax-Classic-Symbolic-v1"
    cfg = EnvConfig(name=name, num_envs=3, reset_pool=2)
    online = build(TrainConfig(env=cfg, ppo=PPOConfig(num_steps=2, num_minibatches=1),
                               total_timesteps=6))
    env = online.env
    uniform = random_policy(env.num_actions)
    key = jax.random.PRNGKey(4)
    k4, k3, k2 = (jax.random.split(key, n) for n in (4, 3, 2))
    makers = {
        "ppo": (online.trainer, lambda: VecEnv(env, cfg).reset(jax.random.split(k4[1], 3), k4[2])),
        "collect": (make_collect(spec(name), env, cfg, uniform, Identity(), 3, 2),
                    lambda: VecEnv(env, cfg).reset(jax.random.split(k3[0], 3), k3[1])),
        "evaluate": (make_evaluate(env, uniform, Identity(), 3, 2),
                     lambda: VecEnv(env, None).reset(episode_keys(k2[0], 3), k2[0]))}
    for what, (maker, worlds) in makers.items():
        whole, split = jax.jit(maker.init)(key, None), jit_init(maker)(key, None)
        for label, got, want in (("init", split, whole), ("worlds", split.env, jax.jit(worlds)())):
            assert jax.tree.structure(got) == jax.tree.structure(want), (what, label)
            for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(want),
                                    jax.tree.leaves(got)):
                np.testing.assert_array_equal(
                    np.asarray(b), np.asarray(a),
                    err_msg=f"{what} {label} {jax.tree_util.keystr(path)}")
