"""Settings of the pure core: which env and how it resets, PPO's hyperparameters, the policy
network's kind, the exploration bonus. Frozen dataclasses; every field's docstring becomes its
`--help` text through tyro. Shape-fixing fields (env count, rollout length, minibatches,
widths) are static: changing one recompiles."""

from __future__ import annotations

import dataclasses
from typing import Literal

from fused.envspec import SPECS, EnvName
from fused.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class GameSettings:
    """Which env and how long its episodes run: what every command that steps one takes (those
    whose episodes never reset, `play.py llm` and `human`, take only this)."""

    name: EnvName = "Craftax-Symbolic-v1"
    """Environment: Craftax-Symbolic-v1, Craftax-Classic-Symbolic-v1, their frames
    (Craftax-Pixels-v1, Craftax-Classic-Pixels-v1), or a probe-* test env."""
    max_episode_steps: int | None = None
    """Override the env's episode limit (truncation); None keeps the env default."""
    impl: Literal["craftax", "fast"] = "craftax"
    """Whose step: Craftax's own, or ours written for the compiler (`fused.envs`: fewer, fuller
    kernels, equal to Craftax's bit for bit; Craftax-Classic, symbolic and pixels)."""


@dataclasses.dataclass(frozen=True)
class EnvSettings(GameSettings):
    """Which env and how it resets (everything but how many copies run)."""

    reset: Literal["optimistic", "auto"] = "optimistic"
    """`optimistic`: finished envs take worlds from a small pool refilled a few worlds per step
    (Craftax baselines' idea, amortised further); `auto`: every finished episode gets a freshly
    generated world (exact, slow when episodes end often)."""
    reset_pool: int = 16
    """Optimistic reset: worlds kept ready per device (>= 1)."""
    worlds_per_step: int = 1
    """Optimistic reset: new worlds generated on each step where some env finished (<= reset_pool).
    If more envs finish in a step than this, some start from a world another env already got
    (counted in the `reset_reuse` metric)."""


@dataclasses.dataclass(frozen=True)
class EnvConfig(EnvSettings):
    num_envs: int = 128
    """Parallel environments (global, across all devices)."""


def validate_policy(p: "PolicyConfig", env_name: str, field: str = "policy") -> None:
    """The network fits the env: a CNN reads frames."""
    from fused.envspec import PIXEL_ENVS, spec

    if p.kind == "cnn" and not spec(env_name).is_pixels:
        raise ConfigError(f"{field}.kind=cnn reads frames but env.name={env_name!r} gives "
                          f"vectors; use mlp or gru (or auto), or a pixel env "
                          f"({', '.join(PIXEL_ENVS)})")
    for name in ("layer_width", "num_layers"):
        if getattr(p, name) <= 0:
            raise ConfigError(f"{field}.{name}={getattr(p, name)} must be positive")


def env_settings(env: EnvSettings) -> EnvSettings:
    """The settings alone (an `EnvConfig`'s env count dropped): what a policy acts in."""
    return EnvSettings(**{f.name: getattr(env, f.name) for f in dataclasses.fields(EnvSettings)})


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    num_steps: int = 64
    """Rollout length per env per update."""
    lr: float = 2e-4
    """Adam learning rate."""
    anneal_lr: bool = True
    """Linearly anneal the learning rate to 0 over the run."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.8
    """GAE lambda."""
    clip_eps: float = 0.2
    """PPO ratio clip (also clips the value update)."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    update_epochs: int = 4
    """Passes over each rollout."""
    num_minibatches: int = 8
    """Minibatches per epoch (per device the local batch is split this many ways)."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """The policy network (what every command that trains or acts builds alike)."""

    kind: Literal["auto", "mlp", "cnn", "gru"] = "auto"
    """`mlp`: separate feed-forward actor and critic (tanh, --policy.num-layers x
    --policy.layer-width). `cnn` (frames: the pixel envs): the public baselines'
    ActorCriticConv, three conv + max-pool layers shared by a relu actor and critic of
    --policy.layer-width. `gru`: the public baselines' PPO-RNN: Dense+relu embedding (of the
    CNN's features on frames), a GRU of --policy.layer-width whose carry restarts at episode
    starts, then relu actor and critic heads of --policy.num-layers - 1 layers; PPO epochs
    replay whole env sequences from the rollout's first carry. `auto`: cnn on pixel envs, mlp
    on the others."""
    layer_width: int = 512
    """Hidden width of the actor and critic (the GRU's width)."""
    num_layers: int = 3
    """Hidden layers in each of the actor and critic."""
    conv: Literal["auto", "im2col", "lax"] = "auto"
    """How a CNN's convolutions compute (the same function either way): `im2col`, shifted
    copies of the input and one matmul (XLA:CPU runs a convolution's gradient through a slow
    generic loop), `lax`, `lax.conv` (cuDNN on GPUs); `auto` is im2col on CPUs, lax
    elsewhere."""


@dataclasses.dataclass(frozen=True)
class ExploreConfig:
    kind: Literal["none", "rnd", "icm", "e3b"] = "none"
    """Exploration bonus (`fused.rl.explore`): none; RND (random network distillation); ICM
    (forward-model error on inverse-model features); E3B (elliptical episodic bonus on ICM's
    features). The bonus is added to the reward as `reward + coef * bonus`."""
    coef: float = 1.0
    """Intrinsic reward coefficient (the baselines' *_reward_coeff)."""
    lr: float = 3e-4
    """Adam learning rate of the explorer's networks."""
    layer_width: int = 256
    """Hidden width of the explorer's networks."""
    num_layers: int = 3
    """Hidden layers of each explorer network."""
    update_epochs: int = 4
    """Passes over each rollout when training the explorer (in --ppo.num-minibatches)."""
    rnd_output: int = 512
    """RND: output width of the random and predictor networks."""
    latent: int = 32
    """ICM / E3B: feature width of the encoder."""
    e3b_lambda: float = 0.1
    """E3B: the inverse covariance starts each episode at I / e3b_lambda."""
    icm_inverse_coef: float = 1.0
    """ICM / E3B: weight of the inverse (action prediction) loss."""
    icm_forward_coef: float = 1.0
    """ICM / E3B: weight of the forward (next features) loss."""



def validate_game(e: GameSettings) -> None:
    if e.name not in SPECS:
        raise ConfigError(f"env.name={e.name!r} is unknown; choose one of {', '.join(SPECS)}")
    if e.impl == "fast" and not SPECS[e.name].fast_step:
        raise ConfigError(f"env.impl=fast: {e.name} has no fast step yet (there: "
                          f"{', '.join(n for n, s in SPECS.items() if s.fast_step)}); use "
                          "--env.impl craftax")
    if e.max_episode_steps is not None and e.max_episode_steps <= 0:
        raise ConfigError(f"env.max_episode_steps={e.max_episode_steps} must be positive or None")


def validate_env(e: EnvSettings, num_envs: int, num_devices: int = 1,
                 num_envs_field: str = "env.num_envs") -> None:
    validate_game(e)
    for name, value in {num_envs_field: num_envs, "env.reset_pool": e.reset_pool,
                        "env.worlds_per_step": e.worlds_per_step}.items():
        if value <= 0:  # (a flag, --episodes, named as flags are: `--episodes 0`)
            said = f"{name} {value}" if name.startswith("--") else f"{name}={value}"
            raise ConfigError(f"{said} must be positive")
    if e.worlds_per_step > e.reset_pool:
        raise ConfigError(
            f"env.worlds_per_step={e.worlds_per_step} exceeds env.reset_pool={e.reset_pool}; "
            "raise the pool or lower worlds_per_step")
    if num_envs % num_devices:
        raise ConfigError(
            f"{num_envs_field}={num_envs} is not divisible by the {num_devices} devices in use; "
            "pick a multiple or set --num-devices")

