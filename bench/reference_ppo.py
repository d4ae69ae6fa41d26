"""The prior system's PPO structure, for same-run speed comparisons only (not used to train).

It follows the public PureJaxRL-style Craftax PPO: the full actor-critic (both MLPs) is applied
at every rollout step, values come from the rollout, and the Craftax-baselines optimistic reset
generates num_envs/16 worlds on EVERY step and hands them to finished envs. Same network, same
loss, same epochs x minibatches as `fused.rl.ppo`, so a steps/s ratio isolates our structure.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fused.commands.train import TrainConfig
from fused.envspec import spec
from fused.rl.envs import CraftaxEnv
from fused.rl.networks import ActorCritic
from fused.rl.ppo import categorical_log_prob, gae, ppo_loss
from fused.rl.trainer import make_optimizer


def make_reference_update(cfg: TrainConfig):
    """Returns (init(key) -> state, update(state) -> state) for the prior structure."""
    env = CraftaxEnv(spec(cfg.env.name))
    n, p = cfg.env.num_envs, cfg.ppo
    num_resets = max(1, n // 16)
    net = ActorCritic(env.num_actions, cfg.policy.layer_width, cfg.policy.num_layers)
    tx = make_optimizer(cfg)

    def init(key):
        k1, k2 = jax.random.split(key)
        params = net.init(k1, jnp.zeros((1, env.obs_dim)))
        obs, st = jax.vmap(env.reset)(jax.random.split(k2, n))
        return params, tx.init(params), obs, st, key

    def env_step(key, st, action):
        k1, k2, k3 = jax.random.split(key, 3)
        res = jax.vmap(env.step)(jax.random.split(k1, n), st, action)
        obs_re, st_re = jax.vmap(env.reset)(jax.random.split(k2, num_resets))
        done = res.terminated | res.truncated
        being_reset = jax.random.choice(k3, jnp.arange(n), (num_resets,), p=done / jnp.maximum(done.sum(), 1), replace=False)
        idx = jnp.arange(num_resets).repeat(n // num_resets)[:n].at[being_reset].set(jnp.arange(num_resets))
        pick = lambda a, b: jnp.where(done.reshape((n,) + (1,) * (a.ndim - 1)), a[idx], b)
        return pick(obs_re, res.obs), jax.tree.map(pick, st_re, res.state), res.reward, done

    def update(state):
        params, opt, obs, st, key = state

        def step(carry, k):
            obs, st = carry
            ka, ke = jax.random.split(k)
            logits, value = net.apply(params, obs)
            action = jax.random.categorical(ka, logits)
            nobs, nst, r, d = env_step(ke, st, action)
            return (nobs, nst), (obs, action, categorical_log_prob(logits, action), value, r, d)

        key, kr, ku = jax.random.split(key, 3)
        (obs, st), (tobs, ta, tlp, tv, tr, td) = jax.lax.scan(step, (obs, st), jax.random.split(kr, p.num_steps))
        _, last_v = net.apply(params, obs)
        adv, tgt = gae(tr, tv, td, jnp.zeros_like(td), jnp.zeros_like(tv), last_v, p.gamma, p.gae_lambda)
        flat = lambda x: x.reshape((-1,) + x.shape[2:])
        batch = tuple(map(flat, (tobs, ta, tlp, tv, adv, tgt)))

        def mb_step(carry, mb):
            params, opt = carry
            o, a, lp, v, ad, tg = mb
            ad = (ad - ad.mean()) / (ad.std() + 1e-8)

            def loss(pr):
                logits, value = net.apply(pr, o)
                return ppo_loss(logits, value, a, lp, v, ad, tg, p.clip_eps, p.vf_coef, p.ent_coef)[0]

            g = jax.grad(loss)(params)
            u, opt = tx.update(g, opt, params)
            return (optax.apply_updates(params, u), opt), None

        def epoch(carry, k):
            perm = jax.random.permutation(k, n * p.num_steps)
            mbs = jax.tree.map(lambda x: x[perm].reshape((p.num_minibatches, -1) + x.shape[1:]), batch)
            return jax.lax.scan(mb_step, carry, mbs)[0], None

        (params, opt), _ = jax.lax.scan(epoch, (params, opt), jax.random.split(ku, p.update_epochs))
        return params, opt, obs, st, key

    return init, update
