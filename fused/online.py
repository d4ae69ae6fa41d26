"""Online PPO assembled for one config: env, agent (network + policy input), the trainer's pure
functions, and their sharding over local devices. Entry points jit `trainer.init` and
`trainer.chunk` themselves."""

from __future__ import annotations

from typing import NamedTuple

import jax
from jax.sharding import Mesh

from fused.agent import Agent, make_agent
from fused.config import TrainConfig
from fused.rl.env_api import Env
from fused.rl.envs import make_env
from fused.rl.ppo import RunnerState
from fused.rl.sharding import AXIS, make_mesh, shard, state_shardings
from fused.rl.trainer import Trainer, make_train


class Online(NamedTuple):
    cfg: TrainConfig
    env: Env
    agent: Agent
    trainer: Trainer  # under shard_map when `mesh` is set
    mesh: Mesh | None

    @property
    def frozen(self):
        """The policy input's device arrays: the second argument of init and chunk."""
        return self.agent.inputs.frozen


def build(cfg: TrainConfig, num_devices: int = 1) -> Online:
    """Host setup (env, policy, an LLM's weights and prefix cache); nothing compiles yet."""
    env = make_env(cfg.env)
    agent = make_agent(cfg, num_devices)
    sharded = num_devices > 1
    trainer = make_train(cfg, env, agent.network, agent.inputs, AXIS if sharded else None,
                         num_devices)
    mesh = make_mesh(num_devices) if sharded else None
    if sharded:
        trainer = shard(trainer, mesh, agent.inputs.frozen)
    return Online(cfg, env, agent, trainer, mesh)


def commit(online: Online, state: RunnerState) -> RunnerState:
    """`state` placed on its devices as a restored checkpoint is: jit compiles separately for
    committed and uncommitted inputs, so fresh and resumed runs then run the same compiled
    chunk (one entry in the persistent compilation cache too)."""
    return jax.device_put(state, shardings(online, state))


def shardings(online: Online, state: RunnerState):
    """Where each leaf of the state lives (restore targets for checkpoints)."""
    return state_shardings(online.trainer, online.mesh, state)
