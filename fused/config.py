"""Frozen, validated configuration for online training.

Shape-fixing fields (env count, rollout length, minibatches, widths) are static: changing one
recompiles. Every field's docstring becomes its `--help` text through tyro.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

ENV_NAMES = (
    "Craftax-Symbolic-v1",
    "Craftax-Classic-Symbolic-v1",
    "probe-constant",
    "probe-obs-reward",
    "probe-delayed",
    "probe-action-reward",
    "probe-obs-action",
    "probe-truncated",
)


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    name: str = "Craftax-Symbolic-v1"
    """Environment: Craftax-Symbolic-v1, Craftax-Classic-Symbolic-v1, or a probe-* test env."""
    num_envs: int = 128
    """Parallel environments (global, across all devices)."""
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
    max_episode_steps: int | None = None
    """Override the env's episode limit (truncation); None keeps the env default."""


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
    layer_width: int = 512
    """Hidden width of the actor and critic MLPs."""
    num_layers: int = 3
    """Hidden layers in each of the actor and critic."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""


@dataclasses.dataclass(frozen=True)
class WandbConfig:
    mode: Literal["offline", "online", "disabled"] = "offline"
    """wandb mode: offline by default (sync later with `wandb sync`), online, or disabled."""
    project: str = "craftax-fused"
    """wandb project."""
    entity: str | None = None
    """wandb entity (team or user)."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    env: EnvConfig = EnvConfig()
    """Environment settings."""
    ppo: PPOConfig = PPOConfig()
    """PPO hyperparameters."""
    wandb: WandbConfig = WandbConfig()
    """Weights & Biases logging."""
    seed: int = 0
    """PRNG seed."""
    total_timesteps: int = 1_000_000
    """Env steps to train for (rounded down to whole updates)."""
    updates_per_chunk: int = 10
    """Updates compiled into one jitted chunk; the host logs and checkpoints between chunks."""
    out_dir: str = "runs"
    """Folder under which each run gets its own folder."""
    run_name: str | None = None
    """Run folder name; default `<env>-s<seed>-<time>`."""
    resume: str | None = None
    """Resume from this run folder's latest good checkpoint (its saved config is used)."""
    checkpoint_every_updates: int = 50
    """Checkpoint after at least this many updates (checked at chunk boundaries); 0 disables."""
    checkpoint_every_minutes: float = 10.0
    """Also checkpoint when this many minutes passed since the last one; 0 disables."""
    keep_checkpoints: int = 3
    """Checkpoints kept on disk."""
    profile_dir: str | None = None
    """Write a jax.profiler trace of the second chunk here."""
    num_devices: int | None = None
    """Local devices to shard envs over; None uses all."""
    plot: bool = True
    """Write a learning-curve PNG into the run folder at each log."""

    @property
    def steps_per_update(self) -> int:
        return self.env.num_envs * self.ppo.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.steps_per_update

    @property
    def num_chunks(self) -> int:
        return -(-self.num_updates // self.updates_per_chunk)


def validate(cfg: TrainConfig, num_devices: int = 1) -> None:
    """Reject values that cannot work, with one line naming the field and the fix."""
    e, p = cfg.env, cfg.ppo
    if e.name not in ENV_NAMES:
        raise ConfigError(f"env.name={e.name!r} is unknown; choose one of {', '.join(ENV_NAMES)}")
    positive = {
        "env.num_envs": e.num_envs, "env.reset_pool": e.reset_pool,
        "env.worlds_per_step": e.worlds_per_step, "ppo.num_steps": p.num_steps,
        "ppo.update_epochs": p.update_epochs, "ppo.num_minibatches": p.num_minibatches,
        "ppo.layer_width": p.layer_width, "ppo.num_layers": p.num_layers,
        "total_timesteps": cfg.total_timesteps, "updates_per_chunk": cfg.updates_per_chunk,
        "keep_checkpoints": cfg.keep_checkpoints,
    }
    for name, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{name}={value} must be positive")
    if e.max_episode_steps is not None and e.max_episode_steps <= 0:
        raise ConfigError(f"env.max_episode_steps={e.max_episode_steps} must be positive or None")
    if e.worlds_per_step > e.reset_pool:
        raise ConfigError(
            f"env.worlds_per_step={e.worlds_per_step} exceeds env.reset_pool={e.reset_pool}; "
            "raise the pool or lower worlds_per_step")
    if e.num_envs % num_devices:
        raise ConfigError(
            f"env.num_envs={e.num_envs} is not divisible by the {num_devices} devices in use; "
            "pick a multiple or set --num-devices")
    local_batch = e.num_envs // num_devices * p.num_steps
    if local_batch % p.num_minibatches:
        raise ConfigError(
            f"per-device batch {local_batch} (num_envs/devices x num_steps) is not divisible by "
            f"ppo.num_minibatches={p.num_minibatches}; pick a divisor")
    for name, value in {"ppo.gamma": p.gamma, "ppo.gae_lambda": p.gae_lambda}.items():
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"{name}={value} must lie in [0, 1]")
    for name, value in {"ppo.lr": p.lr, "ppo.adam_eps": p.adam_eps, "ppo.clip_eps": p.clip_eps,
                        "ppo.max_grad_norm": p.max_grad_norm}.items():
        if value <= 0:
            raise ConfigError(f"{name}={value} must be positive")
    if cfg.num_updates < 1:
        raise ConfigError(
            f"total_timesteps={cfg.total_timesteps} is less than one update "
            f"({cfg.steps_per_update} = num_envs x num_steps); raise it")
    if cfg.checkpoint_every_updates < 0 or cfg.checkpoint_every_minutes < 0:
        raise ConfigError("checkpoint_every_updates and checkpoint_every_minutes must be >= 0")


def _preset(**kw) -> TrainConfig:
    return dataclasses.replace(TrainConfig(), **kw)


PRESETS: dict[str, tuple[str, TrainConfig]] = {
    "cpu": (
        "Default: Craftax-Classic-Symbolic, 64 envs, 819k steps; learns visibly in minutes on 2 cores.",
        _preset(
            env=EnvConfig(name="Craftax-Classic-Symbolic-v1", num_envs=64, reset_pool=8),
            ppo=PPOConfig(num_steps=32, layer_width=256, num_minibatches=4, lr=5e-4, update_epochs=2),
            total_timesteps=819_200, updates_per_chunk=50, checkpoint_every_updates=100,
        ),
    ),
    "smoke": (
        "Seconds: tiny Classic run for tests and CI.",
        _preset(
            env=EnvConfig(name="Craftax-Classic-Symbolic-v1", num_envs=8, reset_pool=2),
            ppo=PPOConfig(num_steps=8, layer_width=32, num_minibatches=2, update_epochs=1),
            total_timesteps=8 * 8 * 6, updates_per_chunk=2, checkpoint_every_updates=2,
            plot=False, wandb=WandbConfig(mode="disabled"),
        ),
    ),
    "gpu": (
        "Accelerator: Craftax-Symbolic, 1024 envs, 1B steps, prior PPO defaults.",
        _preset(
            env=EnvConfig(num_envs=1024, reset_pool=64, worlds_per_step=8),
            total_timesteps=1_000_000_000, updates_per_chunk=20, checkpoint_every_updates=500,
        ),
    ),
    "symbolic": (
        "The prior system's Craftax-Symbolic PPO (BRIEF section 4) at 128 envs.",
        _preset(env=EnvConfig(num_envs=128), total_timesteps=100_000_000, updates_per_chunk=10),
    ),
}


def config_to_dict(cfg: TrainConfig) -> dict:
    return dataclasses.asdict(cfg)


def config_from_dict(d: dict, cls=TrainConfig):
    """Rebuild a (nested) config dataclass from `config_to_dict` output; unknown keys are errors."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(d) - set(fields)
    if unknown:
        raise ConfigError(f"saved config has unknown fields {sorted(unknown)}; was it written by "
                          "another version of craftax-fused?")
    kw = {}
    for name, value in d.items():
        default = getattr(cls(), name)
        kw[name] = (config_from_dict(value, type(default))
                    if dataclasses.is_dataclass(default) else value)
    return cls(**kw)
