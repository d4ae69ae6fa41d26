"""PPO assembled into pure functions: `make_train(cfg, env, network, inputs) -> Trainer`.

`Trainer.init(key, frozen)` builds the full `RunnerState` (its envs `Trainer.worlds(key)`, made
inside it or passed in as `env_state`); `Trainer.chunk(state, frozen, num_updates)` runs
`updates_per_chunk` updates of a run of `num_updates` (an int32 argument, not a constant of the
program: a run of any length, or one resumed with another `--total-timesteps`, runs the same
program; updates past the end of the run are skipped, so the last chunk needs no recompile);
`Trainer.train(key, frozen)` is the whole run as one pure function, for `jax.vmap` over seeds.
`frozen` is `inputs.frozen` (an LLM's weights and prefix cache, None for the plain observation),
an argument rather than a closure so XLA never folds a model into the program as constants.
Nothing is jitted here: the entry point jits, and `fused.rl.sharding.shard` wraps the same
functions for several devices (build them with `axis_name` set for that).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fused.rl.acting import Rollout, network_policy
from fused.rl.config import EnvConfig, ExploreConfig, PPOConfig
from fused.rl.env_api import Env, strong_types
from fused.rl.explore import make_explorer
from fused.rl.networks import init_network
from fused.rl.policy_input import PolicyInput
from fused.rl.ppo import Ctx, RunnerState, update_step
from fused.rl.updates import scan_updates
from fused.rl.vec_env import VecEnv, Worlds

class PPORun(Protocol):
    """What the core reads of a PPO run's config (train.py's `TrainConfig` is one)."""

    env: EnvConfig
    ppo: PPOConfig
    explore: ExploreConfig
    updates_per_chunk: int

    @property
    def num_updates(self) -> int: ...


class Trainer(NamedTuple):
    init: Callable  # (key, frozen, env_state=None) -> RunnerState
    chunk: Callable  # (RunnerState, frozen, num_updates) -> (RunnerState, metrics [chunk, ...])
    train: Callable  # (key, frozen) -> (RunnerState, metrics with leading axis num_updates)
    state_specs: Callable  # (RunnerState, env_axis) -> PartitionSpecs (per-env leaves split)
    worlds: Worlds | None = None  # the envs `init(key, ...)` starts from (None under `shard`)


def make_optimizer(cfg: PPORun, num_updates=None) -> optax.GradientTransformation:
    """Adam after clipping the global norm; with `anneal_lr`, the learning rate decays linearly to
    0 over the run's optimiser steps. `num_updates` (the run's updates; default
    `cfg.num_updates`) may be a traced int32 scalar: the optimiser's state is the same either
    way."""
    p = cfg.ppo
    if num_updates is None:
        num_updates = cfg.num_updates
    steps = num_updates * p.update_epochs * p.num_minibatches
    lr = linear_decay(p.lr, steps) if p.anneal_lr else p.lr
    return optax.chain(optax.clip_by_global_norm(p.max_grad_norm), optax.adam(lr, eps=p.adam_eps))


def linear_decay(init: float, steps) -> Callable:
    """`optax.linear_schedule(init, 0.0, steps)` as XLA runs it (optax's takes a Python int
    only), for `steps` (>= 1) a Python int or a traced int32 scalar, with the same values either
    way: XLA turns optax's division by the constant `steps` into a multiplication by its
    reciprocal, so the schedule is written as that multiplication."""
    def schedule(count):
        count = jnp.clip(count, 0, steps)
        frac = 1 - count * (1 / jnp.asarray(steps, jnp.float32))
        return init * frac

    return schedule


def make_train(cfg: PPORun, env: Env, network: nn.Module, inputs: PolicyInput,
               axis_name: str | None = None, num_shards: int = 1) -> Trainer:
    """Pure functions for training `network` on `env` through `inputs`. With `axis_name`, they
    hold the collectives of data parallelism over `num_shards` devices (each with
    num_envs / num_shards envs) and must run under `fused.rl.sharding.shard`."""
    tx = make_optimizer(cfg)
    local_envs = cfg.env.num_envs // num_shards
    rollout = Rollout(network_policy(network), inputs, VecEnv(env, cfg.env), cfg.env.num_envs,
                      local_envs, axis_name)
    explorer = make_explorer(cfg.explore, env.obs_dim, env.num_actions, local_envs,
                             getattr(getattr(env, "spec", None), "image", None),
                             cfg.policy.conv)
    ctx = Ctx(rollout, tx, cfg.ppo, explorer)

    def reset_keys(key):
        _, k_env, k_pool, _ = jax.random.split(key, 4)
        return rollout.keys(k_env), rollout.fold(k_pool)

    worlds = Worlds(reset_keys, rollout.envs)

    def init(key, frozen, env_state=None):
        k_net, _, _, k_run = jax.random.split(key, 4)
        params = init_network(network, k_net, inputs.example(jnp.zeros((1, env.obs_dim))))
        if env_state is None:
            env_state = worlds(key)
        state, k_run = inputs.init(frozen, env_state.obs, k_run, axis_name)
        carry = rollout.policy.carry(local_envs)
        # (its own key, so adding an explorer leaves the rest of the run's random stream as is)
        ex = None if explorer is None else explorer.init(jax.random.fold_in(key, 7))
        return strong_types(RunnerState(params, tx.init(params), env_state, k_run, jnp.int32(0),
                                        state, carry, ex))

    def chunk(rs: RunnerState, frozen, num_updates):
        run = ctx._replace(tx=make_optimizer(cfg, num_updates))
        return scan_updates(lambda r, f: update_step(run, r, f), rs, frozen,
                            cfg.updates_per_chunk, lambda r: r.update_step < num_updates)

    def train(key, frozen):
        return jax.lax.scan(lambda r, _: update_step(ctx, r, frozen), init(key, frozen), None,
                            length=cfg.num_updates)

    def state_specs(state: RunnerState, env_axis: str):
        """Env states (and per-device reset pools) and per-env input state split on the leading
        axis; params, optimizer and the rest replicated."""
        rep = jax.tree.map(lambda _: jax.sharding.PartitionSpec(), state)
        split = jax.sharding.PartitionSpec(env_axis)
        return rep.replace(env=jax.tree.map(lambda _: split, state.env),
                           inputs=inputs.state_specs(state.inputs, env_axis),
                           carry=None if state.carry is None else split,
                           explore=None if state.explore is None else rep.explore.replace(
                               cov=None if state.explore.cov is None else split))

    return Trainer(init, chunk, train, state_specs, worlds)
