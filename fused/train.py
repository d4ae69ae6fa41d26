"""Assemble PPO into jitted, optionally sharded functions: `make_train(cfg)`.

`Trainer.init(key)` builds the full `RunnerState`; `Trainer.chunk(state)` runs
`updates_per_chunk` updates in one compiled program (updates past the end of the run are
skipped, so the last chunk needs no recompile); `Trainer.train(key)` is the whole run as one pure
function, for `jax.vmap` over seeds. With several devices, envs are split across them
(`shard_map` over a 1-D mesh), params are replicated and gradients averaged.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fused.config import TrainConfig
from fused.envs import VecEnv, make_env
from fused.networks import ActorCritic
from fused.ppo import Ctx, RunnerState, local_keys, update_step

AXIS = "data"


class Trainer(NamedTuple):
    init: Callable  # key -> RunnerState
    chunk: Callable  # RunnerState -> (RunnerState, metrics with leading axis updates_per_chunk)
    train: Callable  # key -> (RunnerState, metrics with leading axis num_updates)
    env: object
    network: ActorCritic
    mesh: Mesh | None


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    p = cfg.ppo
    steps = cfg.num_updates * p.update_epochs * p.num_minibatches
    lr = optax.linear_schedule(p.lr, 0.0, steps) if p.anneal_lr else p.lr
    return optax.chain(optax.clip_by_global_norm(p.max_grad_norm), optax.adam(lr, eps=p.adam_eps))


def make_train(cfg: TrainConfig, num_devices: int = 1) -> Trainer:
    """Pure functions for training; jit them at the entry point (`chunk`/`init` come jitted when
    sharded, since shard_map needs its mesh)."""
    env = make_env(cfg.env)
    network = ActorCritic(env.num_actions, cfg.ppo.layer_width, cfg.ppo.num_layers)
    tx = make_optimizer(cfg)
    axis = AXIS if num_devices > 1 else None
    ctx = Ctx(network.apply, partial(network.apply, method=ActorCritic.actor),
              partial(network.apply, method=ActorCritic.critic), VecEnv(env, cfg.env), tx,
              cfg.ppo, cfg.env.num_envs, cfg.env.num_envs // num_devices, axis)

    def init_local(key):
        k_net, k_env, k_pool, k_run = jax.random.split(key, 4)
        params = network.init(k_net, jnp.zeros((1, env.obs_dim)))
        if axis is not None:
            k_pool = jax.random.fold_in(k_pool, jax.lax.axis_index(axis))
        env_state = ctx.vec_env.reset(local_keys(ctx, k_env), k_pool)
        return RunnerState(params, tx.init(params), env_state, k_run, jnp.int32(0))

    def chunk_local(rs: RunnerState):
        def body(rs, _):
            skipped = jax.tree.map(jnp.zeros_like, jax.eval_shape(lambda r: update_step(ctx, r), rs)[1])
            return jax.lax.cond(rs.update_step < cfg.num_updates,
                                lambda r: update_step(ctx, r), lambda r: (r, skipped), rs)

        rs, metrics = jax.lax.scan(body, rs, None, length=cfg.updates_per_chunk)
        return rs, metrics

    def train_full(key):
        rs = init_local(key)
        return jax.lax.scan(lambda r, _: update_step(ctx, r), rs, None, length=cfg.num_updates)

    if axis is None:
        return Trainer(init_local, chunk_local, train_full, env, network, None)

    mesh = Mesh(np.array(jax.devices()[:num_devices]), (AXIS,))
    specs = state_specs(jax.eval_shape(init_local_unsharded(cfg, network, tx, env), jax.random.PRNGKey(0)))
    init = jax.jit(jax.shard_map(init_local, mesh=mesh, in_specs=P(), out_specs=specs,
                                 check_vma=False))
    chunk = jax.jit(jax.shard_map(chunk_local, mesh=mesh, in_specs=(specs,),
                                  out_specs=(specs, P()), check_vma=False), donate_argnums=0)
    return Trainer(init, chunk, None, env, network, mesh)


def init_local_unsharded(cfg, network, tx, env):
    """Init without collectives, used only for the state's structure."""
    ctx = Ctx(network.apply, None, None, VecEnv(env, cfg.env), tx, cfg.ppo,
              cfg.env.num_envs, cfg.env.num_envs, None)

    def init(key):
        params = network.init(key, jnp.zeros((1, env.obs_dim)))
        env_state = ctx.vec_env.reset(local_keys(ctx, key), key)
        return RunnerState(params, tx.init(params), env_state, key, jnp.int32(0))

    return init


def state_specs(state: RunnerState) -> RunnerState:
    """Env state (and per-device reset pools) split on the leading axis; the rest replicated."""
    rep = jax.tree.map(lambda _: P(), state)
    return rep.replace(env=jax.tree.map(lambda _: P(AXIS), state.env))


def state_shardings(trainer: Trainer, state: RunnerState):
    """NamedShardings matching `state_specs`, for restoring checkpoints onto the mesh."""
    if trainer.mesh is None:
        return jax.tree.map(lambda x: x.sharding, state)
    return jax.tree.map(lambda s: NamedSharding(trainer.mesh, s), state_specs(state))
