"""What a policy is made of, built from a config: the network and the policy input that feeds
it. The one place that chooses between the plain observation and the LLM-augmented one; the RL
core (`fused.rl`) is handed the result and never asks."""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn

from fused.config import TrainConfig
from fused.envspec import spec
from fused.llm.encoder import make_llm
from fused.llm.policy_input import LLMInput
from fused.rl.networks import ActorCritic, AugmentedActorCritic
from fused.rl.policy_input import Identity, PolicyInput


class Agent(NamedTuple):
    network: nn.Module
    inputs: PolicyInput


def default_microbatch(num_envs: int) -> int:
    """Largest divisor of num_envs that is at most 32."""
    return max(d for d in range(1, min(num_envs, 32) + 1) if num_envs % d == 0)


def make_agent(cfg: TrainConfig, num_devices: int = 1, like: Agent | None = None) -> Agent:
    """Host setup of the policy for `cfg` (with an LLM, loads it and prefills its prompt, unless
    `like`, an agent of the same config for another env count, already holds it)."""
    s, p = spec(cfg.env.name), cfg.ppo
    if cfg.llm.active_backend == "none":
        return Agent(ActorCritic(s.num_actions, p.layer_width, p.num_layers), Identity())
    if like is not None and isinstance(like.inputs, LLMInput):
        llm = like.inputs.llm
    else:
        llm = make_llm(cfg.llm, cfg.env.name, cfg.seed)
    local_envs = cfg.env.num_envs // num_devices
    microbatch = cfg.llm.microbatch or default_microbatch(local_envs)
    network = AugmentedActorCritic(s.num_actions, p.layer_width, p.num_layers,
                                   cfg.llm.projection == "layernorm", cfg.llm.constant_hidden)
    return Agent(network, LLMInput(llm, microbatch, cfg.env.num_envs))
