"""What a policy is made of, built from its `AgentConfig`: the network and the policy input that
feeds it. The one place that chooses between the plain observation and the LLM-augmented one;
the RL core (`fused.rl`) is handed the result and never asks."""

from __future__ import annotations

import dataclasses
import logging
from typing import NamedTuple

import flax.linen as nn

from fused.envspec import spec
from fused.errors import ConfigError
from fused.llm.config import LLMConfig
from fused.llm.encoders import kind_of, make_encoder
from fused.llm.policy_input import LLMInput
from fused.rl.networks import (ActorCritic, AugmentedActorCritic, ConvActorCritic,
                               RecurrentActorCritic)
from fused.rl.config import EnvSettings, PolicyConfig
from fused.rl.policy_input import Identity, PolicyInput

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class AgentConfig:
    """A policy as everything that acts with it needs it (training, evaluation, datasets, video,
    probes): the env it acts in, its network and its input. Part of a run's config: train.py's
    `TrainConfig.agent`, offline.py's saved `agent`; how many envs it acts in is the caller's."""

    env: EnvSettings = EnvSettings()
    """The env the policy acts in."""
    policy: PolicyConfig = PolicyConfig()
    """The network."""
    llm: LLMConfig = LLMConfig()
    """The LLM whose hidden state it reads (backend none: the observation alone)."""
    seed: int = 0
    """Seeds a random LLM's weights (when llm.weights is not given)."""


class Agent(NamedTuple):
    network: nn.Module
    inputs: PolicyInput


def make_agent(cfg: AgentConfig, num_envs: int, num_devices: int = 1,
               like: Agent | None = None) -> Agent:
    """Host setup of the policy for `cfg` acting in `num_envs` envs split over `num_devices`
    (with an LLM, loads it and prefills its prompt, unless `like`, an agent of the same model,
    already holds it: then its weights are shared, and its prefix cache where the prompt is the
    same)."""
    network = policy_network(cfg)
    if cfg.llm.active_backend == "none":
        return Agent(network, Identity())
    shared = like.inputs.encoder if like is not None and isinstance(like.inputs, LLMInput) \
        else None
    if shared is not None and shared.cfg == cfg.llm:
        encoder = shared
    else:  # an ablation of `like`'s LLM reads its weights rather than loading them again
        encoder = make_encoder(cfg.llm, cfg.env.name, cfg.seed, like=shared)
    local_envs = num_envs // num_devices
    sizes = encoder.batching(local_envs)
    if like is None and encoder.frozen is not None:
        log.info(f"LLM calls: micro-batches of {sizes.microbatch} envs, refreshes in calls of "
                 f"{sizes.refresh} (about {sizes.efficiency:.0%} of a refresh call is row work)")
    return Agent(network, LLMInput(encoder, sizes.microbatch, sizes.refresh, num_envs))


def needs_text(cfg: AgentConfig) -> bool:
    """A pixel env whose policy has a text LLM: its env observes the text twin after the frame
    (a Qwen3-VL reads the frame itself)."""
    return (spec(cfg.env.name).is_pixels and cfg.llm.active_backend != "none"
            and not kind_of(cfg.llm).reads_frames)


def network_kind(cfg: AgentConfig) -> str:
    """mlp, cnn or gru: `--policy.kind`, `auto` being cnn on frames (pixel envs), mlp else."""
    if cfg.policy.kind != "auto":
        return cfg.policy.kind
    return "cnn" if spec(cfg.env.name).is_pixels else "mlp"


def policy_network(cfg: AgentConfig) -> nn.Module:
    """The network of `cfg`'s policy (feed-forward, CNN or GRU, plain or with an LLM state),
    built without loading the LLM (offline training reads hidden states from label sets)."""
    s, p = spec(cfg.env.name), cfg.policy
    kind = network_kind(cfg)
    gru = kind == "gru"
    if cfg.llm.active_backend == "none":
        if kind == "cnn":
            return ConvActorCritic(s.num_actions, s.image, p.layer_width, p.conv)
        return (RecurrentActorCritic(s.num_actions, p.layer_width, p.num_layers, image=s.image,
                                     conv=p.conv)
                if gru else ActorCritic(s.num_actions, p.layer_width, p.num_layers))
    if kind == "mlp" and s.is_pixels:
        raise ConfigError(f"--policy.kind mlp with an LLM on {cfg.env.name}: an LLM state joins "
                          "a frame's CNN features (--policy.kind cnn or gru)")
    cls = RecurrentActorCritic if gru else AugmentedActorCritic
    return cls(s.num_actions, p.layer_width, p.num_layers, cfg.llm.projection == "layernorm",
                cfg.llm.constant_hidden, image=s.image, conv=p.conv)
