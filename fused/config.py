"""The online training run's configuration (`train.py`): the core's settings
(`fused.rl.config`), the LLM's (`fused.llm.config`), logging and checkpoint cadence; its
validation, presets and resume rules."""

from __future__ import annotations

import dataclasses
from typing import Literal

from fused.errors import ConfigError
from fused.llm.config import LLMConfig, validate_llm
from fused.rl.config import (EnvConfig, ExploreConfig, PolicyConfig, PPOConfig, validate_env)


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
    llm: LLMConfig = LLMConfig()
    """LLM hidden-state augmentation (off by default)."""
    policy: PolicyConfig = PolicyConfig()
    """Policy network: feed-forward or recurrent (either takes the LLM state when one is on)."""
    explore: ExploreConfig = ExploreConfig()
    """Exploration bonus (off by default)."""
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
    """Resume from this run folder's latest good checkpoint: its saved config, with the flags
    given now applied over it (printed); what fixes the saved state's shapes cannot change."""
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


# On resume, fields under these prefixes cannot change (the checkpoint's shapes, the run's
# identity); the learning rate schedule follows a changed total_timesteps.
RESUME_FIXED = ("env.", "seed", "ppo.num_steps", "ppo.layer_width", "ppo.num_layers", "llm.",
                "policy.", "explore.", "out_dir", "run_name")
RESUME_FREE = ("llm.url",)


def validate(cfg: TrainConfig, num_devices: int = 1) -> None:
    """Reject values that cannot work, with one line naming the field and the fix."""
    e, p = cfg.env, cfg.ppo
    validate_env(e, e.num_envs, num_devices)
    positive = {
        "ppo.num_steps": p.num_steps,
        "ppo.update_epochs": p.update_epochs, "ppo.num_minibatches": p.num_minibatches,
        "ppo.layer_width": p.layer_width, "ppo.num_layers": p.num_layers,
        "total_timesteps": cfg.total_timesteps, "updates_per_chunk": cfg.updates_per_chunk,
        "keep_checkpoints": cfg.keep_checkpoints,
    }
    for name, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{name}={value} must be positive")
    local_batch = e.num_envs // num_devices * p.num_steps
    if cfg.policy.kind == "gru" and (e.num_envs // num_devices) % p.num_minibatches:
        raise ConfigError(
            f"policy.kind gru splits whole env sequences into minibatches: the "
            f"{e.num_envs // num_devices} envs per device are not divisible by "
            f"ppo.num_minibatches={p.num_minibatches}; pick a divisor")
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
    x = cfg.explore
    if x.kind != "none":
        for name, value in {"explore.lr": x.lr, "explore.layer_width": x.layer_width,
                            "explore.num_layers": x.num_layers,
                            "explore.update_epochs": x.update_epochs,
                            "explore.rnd_output": x.rnd_output, "explore.latent": x.latent,
                            "explore.e3b_lambda": x.e3b_lambda}.items():
            if value <= 0:
                raise ConfigError(f"{name}={value} must be positive")
        if x.coef < 0:
            raise ConfigError(f"explore.coef={x.coef} must be >= 0")
    if cfg.checkpoint_every_updates < 0 or cfg.checkpoint_every_minutes < 0:
        raise ConfigError("checkpoint_every_updates and checkpoint_every_minutes must be >= 0")
    validate_llm(cfg.llm, cfg.env.name, cfg.env.num_envs // num_devices, num_devices)


def _preset(**kw) -> TrainConfig:
    return dataclasses.replace(TrainConfig(), **kw)


CPU = _preset(
    env=EnvConfig(name="Craftax-Classic-Symbolic-v1", num_envs=64, reset_pool=8),
    ppo=PPOConfig(num_steps=32, layer_width=256, num_minibatches=4, lr=5e-4, update_epochs=2),
    total_timesteps=819_200, updates_per_chunk=50, checkpoint_every_updates=100,
)

PRESETS: dict[str, tuple[str, TrainConfig]] = {
    "cpu": (
        "Default: Craftax-Classic-Symbolic, 64 envs, 819k steps; learns visibly in minutes on 2 cores.",
        CPU,
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
    "gpu-rnn": (
        "Accelerator: the public baselines' PPO-RNN (Craftax_Baselines ppo_rnn.py defaults: "
        "GRU 512, 1024 envs, 64 steps, 4 x 8 minibatches, lr 2e-4, 1B steps).",
        _preset(
            env=EnvConfig(num_envs=1024, reset_pool=64, worlds_per_step=8),
            policy=PolicyConfig("gru"), total_timesteps=1_000_000_000, updates_per_chunk=20,
            checkpoint_every_updates=500,
        ),
    ),
    "cpu-rnn": ("The cpu preset with the GRU policy (compare with cpu at equal steps).",
                dataclasses.replace(CPU, policy=PolicyConfig("gru"))),
    "cpu-rnd": ("The cpu preset with the RND bonus (the baselines' RND sizes, coef 1).",
                dataclasses.replace(CPU, explore=ExploreConfig("rnd"))),
    "symbolic": (
        "The prior system's Craftax-Symbolic PPO (its published defaults) at 128 envs.",
        _preset(env=EnvConfig(num_envs=128), total_timesteps=100_000_000, updates_per_chunk=10),
    ),
}
