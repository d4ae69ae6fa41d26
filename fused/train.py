"""Assemble PPO into jitted, optionally sharded functions: `make_train(cfg)`.

`Trainer.init(key, frozen)` builds the full `RunnerState`; `Trainer.chunk(state, frozen)` runs
`updates_per_chunk` updates in one compiled program (updates past the end of the run are
skipped, so the last chunk needs no recompile); `Trainer.train(key, frozen)` is the whole run as
one pure function, for `jax.vmap` over seeds. `frozen` is `Trainer.frozen`: the LLM's weights and
prefix cache (None without an LLM), an argument rather than a closure so XLA never folds a
model into the program as constants. With several devices, envs are split across them
(`shard_map` over a 1-D mesh), params are replicated and gradients averaged.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fused.config import TrainConfig
from fused.envs import VecEnv, make_env
from fused.networks import ActorCritic, AugmentedActorCritic
from fused.ppo import Ctx, RunnerState, local_keys, update_step

AXIS = "data"


class Trainer(NamedTuple):
    init: Callable  # (key, frozen) -> RunnerState
    chunk: Callable  # (RunnerState, frozen) -> (RunnerState, metrics, leading axis updates_per_chunk)
    train: Callable  # (key, frozen) -> (RunnerState, metrics with leading axis num_updates)
    env: object
    network: ActorCritic
    mesh: Mesh | None
    frozen: Any = None  # device arrays of the LLM (fused.llm.FrozenLLM) to pass to init/chunk
    llm: Any = None  # fused.llm.LLM or None
    llm_microbatch: int = 0  # envs per LLM microbatch (per device)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    p = cfg.ppo
    steps = cfg.num_updates * p.update_epochs * p.num_minibatches
    lr = optax.linear_schedule(p.lr, 0.0, steps) if p.anneal_lr else p.lr
    return optax.chain(optax.clip_by_global_norm(p.max_grad_norm), optax.adam(lr, eps=p.adam_eps))


def strong_types(tree):
    """The same arrays without weak types. Craftax puts Python scalars into its states (weak
    types); a checkpoint restores them as ordinary arrays, and a jitted chunk whose input types
    differ from the ones it was compiled for compiles again (70-100 s on Craftax-Symbolic) after
    a resume. `init` returns strong types, and `chunk` returns the types it takes (its scan
    carry), so live and restored states match."""
    return jax.tree.map(lambda x: jax.lax.convert_element_type(x, x.dtype)
                        if jax.typeof(x).weak_type else x, tree)


def make_network(cfg: TrainConfig, env, llm):
    if llm is None:
        return ActorCritic(env.num_actions, cfg.ppo.layer_width, cfg.ppo.num_layers)
    return AugmentedActorCritic(env.num_actions, cfg.ppo.layer_width, cfg.ppo.num_layers,
                                cfg.llm.projection == "layernorm", cfg.llm.constant_hidden)


def dummy_input(env, llm):
    obs = jnp.zeros((1, env.obs_dim))
    return obs if llm is None else {"obs": obs, "hidden": jnp.zeros((1, llm.hidden_size))}


def make_train(cfg: TrainConfig, num_devices: int = 1) -> Trainer:
    """Pure functions for training; jit them at the entry point (`chunk`/`init` come jitted when
    sharded, since shard_map needs its mesh). With an LLM (cfg.llm), the host loads it here and
    `Trainer.frozen` holds its device arrays, passed to `init` and `chunk` as an argument."""
    env = make_env(cfg.env)
    llm = None
    if cfg.llm.active_backend != "none":
        from fused.llm import make_llm

        llm = make_llm(cfg.llm, cfg.env.name, cfg.seed)
    network = make_network(cfg, env, llm)
    tx = make_optimizer(cfg)
    axis = AXIS if num_devices > 1 else None
    local_envs = cfg.env.num_envs // num_devices
    microbatch = 0
    if llm is not None:
        from fused.llm import default_microbatch

        microbatch = cfg.llm.microbatch or default_microbatch(local_envs)
    ctx = Ctx(network.apply, partial(network.apply, method=type(network).actor),
              partial(network.apply, method=type(network).critic), VecEnv(env, cfg.env), tx,
              cfg.ppo, cfg.env.num_envs, local_envs, axis, llm, microbatch)
    frozen = None if llm is None else llm.frozen

    def init_local(key, frozen):
        k_net, k_env, k_pool, k_run = jax.random.split(key, 4)
        params = network.init(k_net, dummy_input(env, llm))
        if axis is not None:
            k_pool = jax.random.fold_in(k_pool, jax.lax.axis_index(axis))
        env_state = ctx.vec_env.reset(local_keys(ctx, k_env), k_pool)
        llm_state = None
        if llm is not None:
            from fused.llm import init_llm_state, llm_step

            k_run, k_llm = jax.random.split(k_run)
            llm_state, _ = llm_step(llm, frozen, init_llm_state(llm, local_envs), env_state.obs,
                                    jnp.zeros(local_envs, bool), jnp.int32(0), k_llm, microbatch,
                                    axis)
        return strong_types(RunnerState(params, tx.init(params), env_state, k_run, jnp.int32(0),
                                        llm_state))

    def chunk_local(rs: RunnerState, frozen):
        def body(rs, _):
            skipped = jax.tree.map(jnp.zeros_like,
                                   jax.eval_shape(lambda r: update_step(ctx, r, frozen), rs)[1])
            return jax.lax.cond(rs.update_step < cfg.num_updates,
                                lambda r: update_step(ctx, r, frozen), lambda r: (r, skipped), rs)

        rs, metrics = jax.lax.scan(body, rs, None, length=cfg.updates_per_chunk)
        return rs, metrics

    def train_full(key, frozen):
        rs = init_local(key, frozen)
        return jax.lax.scan(lambda r, _: update_step(ctx, r, frozen), rs, None,
                            length=cfg.num_updates)

    if axis is None:
        return Trainer(init_local, chunk_local, train_full, env, network, None, frozen, llm,
                       microbatch)

    mesh = Mesh(np.array(jax.devices()[:num_devices]), (AXIS,))
    specs = state_specs(jax.eval_shape(partial(shape_only_init, cfg, network, tx, env, llm),
                                       jax.random.PRNGKey(0)))
    init = jax.jit(jax.shard_map(init_local, mesh=mesh, in_specs=(P(), P()), out_specs=specs,
                                 check_vma=False))
    chunk = jax.jit(jax.shard_map(chunk_local, mesh=mesh, in_specs=(specs, P()),
                                  out_specs=(specs, P()), check_vma=False), donate_argnums=0)
    return Trainer(init, chunk, None, env, network, mesh, frozen, llm, microbatch)


def shape_only_init(cfg, network, tx, env, llm, key):
    """The state's structure without collectives or LLM calls (for sharding specs)."""
    ctx = Ctx(network.apply, None, None, VecEnv(env, cfg.env), tx, cfg.ppo,
              cfg.env.num_envs, cfg.env.num_envs, None)
    params = network.init(key, dummy_input(env, llm))
    env_state = ctx.vec_env.reset(local_keys(ctx, key), key)
    llm_state = None
    if llm is not None:
        from fused.llm import init_llm_state

        llm_state = init_llm_state(llm, cfg.env.num_envs)
    return RunnerState(params, tx.init(params), env_state, key, jnp.int32(0), llm_state)


def state_specs(state: RunnerState) -> RunnerState:
    """Env state (and per-device reset pools) and per-env LLM state split on the leading axis;
    the rest (params, optimizer, hidden-state normaliser) replicated."""
    rep = jax.tree.map(lambda _: P(), state)
    rep = rep.replace(env=jax.tree.map(lambda _: P(AXIS), state.env))
    if state.llm is not None:
        rep = rep.replace(llm=rep.llm.replace(hidden=P(AXIS), age=P(AXIS)))
    return rep


def initial_state(trainer: Trainer, key) -> RunnerState:
    """`trainer.init` (jitted), committed to its devices as a restored checkpoint is: jit compiles
    separately for committed and uncommitted inputs, so fresh and resumed runs then run the same
    compiled chunk (one entry in the persistent compilation cache too)."""
    init = trainer.init if trainer.mesh is not None else jax.jit(trainer.init)
    state = init(key, trainer.frozen)
    return jax.device_put(state, state_shardings(trainer, state))


def state_shardings(trainer: Trainer, state: RunnerState):
    """NamedShardings matching `state_specs`, for restoring checkpoints onto the mesh."""
    if trainer.mesh is None:
        return jax.tree.map(lambda x: x.sharding, state)
    return jax.tree.map(lambda s: NamedSharding(trainer.mesh, s), state_specs(state))
