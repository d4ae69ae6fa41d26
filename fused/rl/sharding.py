"""Data parallelism over local devices as a wrapper: a `Trainer` built with `axis_name=AXIS`
runs under `shard_map` on a 1-D mesh. Envs (and per-env input state) are split across devices,
parameters replicated, gradients averaged; the functions stay un-jitted for the entry point."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fused.rl.ppo import RunnerState
from fused.rl.trainer import Trainer

AXIS = "data"


def on_device(tree):
    """`tree`'s arrays committed to this process's first device (arrays there already are left
    as they are). A loop of jitted calls fed its own outputs must start from committed arrays:
    jit keys its compiled programs on whether inputs are committed, and its outputs are, so an
    uncommitted first state (a jitted init's output from uncommitted keys, or arrays from the
    host) compiles the program a second time at the second call."""
    return jax.device_put(tree, jax.local_devices()[0])


def jit_init(maker):
    """`jax.jit(maker.init)` (a `Trainer`, `Collector` or `Evaluator`): the same state, its first
    envs made by programs of their own (`maker.worlds`; one made under `shard` has none, and
    gets `jax.jit(maker.init)`). World generation, most of what `init` compiles, is then one
    program per env and count of worlds, which the persistent compilation cache keeps for any
    later run making as many worlds of that env (its envs or a reset pool: PPO's, a dataset's,
    each evaluation of a study), whatever its policy or LLM."""
    if getattr(maker, "worlds", None) is None:
        return jax.jit(maker.init)
    envs = maker.worlds.envs
    keys, pool_keys = jax.jit(maker.worlds.keys), jax.jit(envs.pool_keys)
    worlds, assemble, init = jax.jit(envs.worlds), jax.jit(envs.assemble), jax.jit(maker.init)

    def first(key, *args):
        env_keys, pool_key = keys(key)
        pooled = worlds(pool_keys(pool_key)) if envs.pooled else None
        return init(key, *args, env_state=assemble(worlds(env_keys), pooled))

    return first


def make_mesh(num_devices: int) -> Mesh:
    return Mesh(np.array(jax.devices()[:num_devices]), (AXIS,))


def state_structure(trainer: Trainer, mesh: Mesh, frozen) -> RunnerState:
    """The state's pytree structure (abstract), from `init` run per device as a vmap over the
    mesh axis, so collectives resolve without a second, collective-free copy of `init`."""
    per_device = jax.vmap(trainer.init, in_axes=(None, None), axis_name=AXIS,
                          axis_size=mesh.shape[AXIS])
    return jax.eval_shape(per_device, jax.random.PRNGKey(0), frozen)


def shard(trainer: Trainer, mesh: Mesh, frozen) -> Trainer:
    """The same functions, each under shard_map over `mesh` (state in and out split by
    `trainer.state_specs`; key, frozen arrays and metrics replicated)."""
    specs = trainer.state_specs(state_structure(trainer, mesh, frozen), AXIS)

    def wrap(f, in_specs, out_specs):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                             check_vma=False)

    return Trainer(init=wrap(trainer.init, (P(), P()), specs),
                   chunk=wrap(trainer.chunk, (specs, P(), P()), (specs, P())),
                   train=wrap(trainer.train, (P(), P()), (specs, P())),
                   state_specs=trainer.state_specs)


def state_shardings(trainer: Trainer, mesh: Mesh | None, state: RunnerState):
    """Where each leaf of `state` lives: NamedShardings of `state_specs` on `mesh`, or (one
    device) the state's own shardings. Restore targets for checkpoints."""
    if mesh is None:
        return jax.tree.map(lambda x: x.sharding, state)
    return jax.tree.map(lambda s: NamedSharding(mesh, s), trainer.state_specs(state, AXIS))
