"""Frozen, validated configuration for online training.

Shape-fixing fields (env count, rollout length, minibatches, widths) are static: changing one
recompiles. Every field's docstring becomes its `--help` text through tyro.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from fused.envspec import SPECS, TEXT_ENVS, EnvName, spec
from llm_jax.config import Qwen3Config, Qwen3ConfigError
from llm_jax.model import AttentionForm

# The built-in tiny random Qwen3 (real vocabulary so real prompt tokens embed): no meaning.
TINY = Qwen3Config(vocab_size=151_936, hidden_size=128, intermediate_size=384, num_layers=2,
                   num_heads=2, num_kv_heads=1, head_dim=64, rope_theta=1_000_000.0,
                   rms_norm_eps=1e-6, tie_word_embeddings=True)


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class EnvSettings:
    """Which env and how it resets (everything but how many copies run)."""

    name: EnvName = "Craftax-Symbolic-v1"
    """Environment: Craftax-Symbolic-v1, Craftax-Classic-Symbolic-v1, or a probe-* test env."""
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
class EnvConfig(EnvSettings):
    num_envs: int = 128
    """Parallel environments (global, across all devices)."""


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
class LLMConfig:
    backend: Literal["none", "jax", "vllm"] = "none"
    """`none`: plain PPO. `jax`: the Flax Qwen3 runs inside the jitted chunk (render -> encode
    against the cached prompt prefix). `vllm`: observations go to the host every call, are
    rendered there and sent to the vLLM server at --llm.url (the prior architecture, for parity
    and comparison). Giving --llm.weights with backend none means jax."""
    weights: str | None = None
    """HuggingFace Qwen3 folder; None with backend jax uses a built-in RANDOM Qwen3 (see
    --llm.random-model) whose hidden states carry no meaning (for tests and speed measurements)."""
    random_model: Literal["tiny", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"] = "tiny"
    """Shape of the random Qwen3 used when --llm.weights is not given: the built-in tiny one, or
    a released size's architecture with random weights (speed and memory measurements)."""
    url: str = "http://127.0.0.1:8000"
    """vLLM server (backend vllm)."""
    layer: int | None = None
    """Hidden state after this many layers (HF convention, 0 = embeddings); None = the last.
    Later layers are not computed. The vllm backend serves only the last layer (truncate the
    checkpoint with `python -m llm_jax truncate` for another)."""
    pool: Literal["last", "mean"] = "last"
    """Last prompt token, or mean over the observation and instruction tokens."""
    post_norm: bool = False
    """Apply the final RMSNorm (always on for the vllm backend, whose states are post-norm)."""
    skip_n: int = 25
    """Call the LLM every skip_n env steps (any value >= 1); 0 = never (hidden state stays 0:
    what the fused program costs without LLM calls)."""
    refresh_on_reset: bool = True
    """Re-encode an env within --llm.refresh-wait steps of its episode's end instead of keeping
    the previous episode's hidden state until the next call (the prior system's staleness bug)."""
    refresh_batch: int = 0
    """Envs per refresh call (envs whose episode ended, re-encoded between periodic calls; a
    refresh encodes every waiting env in calls of this size). 0 = sized from the env count:
    about the envs expected to end within --llm.refresh-wait steps (`fused.llm.batching`)."""
    refresh_wait: int = 4
    """A refresh runs once refresh_batch envs are waiting or one has waited this many steps
    (1 = at the first step after the reset): fewer refreshes padded with rows that need none."""
    microbatch: int = 0
    """Envs per micro-batch of a periodic LLM call over all envs (must divide the envs per
    device). 0 = the largest the device's activation budget allows (`fused.llm.batching`)."""
    hidden: Literal["real", "zero", "shuffle", "garbage-prompt"] = "real"
    """Ablation: the real hidden state, zeros, hidden states shuffled across envs at each call,
    or states of a prompt whose prefix tokens are shuffled into nonsense."""
    normalize: bool = True
    """Normalise hidden states by running mean/std (saved in checkpoints) before the policy."""
    projection: Literal["dense", "layernorm"] = "dense"
    """Policy's hidden-state branch: Dense+tanh (prior), or LayerNorm then Dense+tanh."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """LLM compute dtype (jax backend)."""
    attention: AttentionForm = "auto"
    """Attention form (jax backend): auto (row by row on CPU, cuDNN on a GPU in bf16/fp16,
    blocked otherwise), or one of cudnn / blocked / row; all compute the same function."""

    @property
    def constant_hidden(self) -> bool:
        """The policy sees the same hidden state for every env: the LLM is never called."""
        return self.skip_n == 0 or self.hidden == "zero"

    @property
    def active_backend(self) -> str:
        return "jax" if self.backend == "none" and self.weights is not None else self.backend


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    kind: Literal["mlp", "gru"] = "mlp"
    """`mlp`: separate feed-forward actor and critic (tanh, --ppo.num-layers x --ppo.layer-width).
    `gru`: the public baselines' PPO-RNN: Dense+relu embedding, a GRU of --ppo.layer-width whose
    carry restarts at episode starts, then relu actor and critic heads of --ppo.num-layers - 1
    layers; PPO epochs replay whole env sequences from the rollout's first carry."""


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


def validate_env(e: EnvSettings, num_envs: int, num_devices: int = 1,
                 num_envs_field: str = "env.num_envs") -> None:
    if e.name not in SPECS:
        raise ConfigError(f"env.name={e.name!r} is unknown; choose one of {', '.join(SPECS)}")
    for name, value in {num_envs_field: num_envs, "env.reset_pool": e.reset_pool,
                        "env.worlds_per_step": e.worlds_per_step}.items():
        if value <= 0:
            raise ConfigError(f"{name}={value} must be positive")
    if e.max_episode_steps is not None and e.max_episode_steps <= 0:
        raise ConfigError(f"env.max_episode_steps={e.max_episode_steps} must be positive or None")
    if e.worlds_per_step > e.reset_pool:
        raise ConfigError(
            f"env.worlds_per_step={e.worlds_per_step} exceeds env.reset_pool={e.reset_pool}; "
            "raise the pool or lower worlds_per_step")
    if num_envs % num_devices:
        raise ConfigError(
            f"{num_envs_field}={num_envs} is not divisible by the {num_devices} devices in use; "
            "pick a multiple or set --num-devices")


def validate_llm(m: LLMConfig, env_name: str, local_envs: int, num_devices: int = 1) -> None:
    """The --llm.* checks, the model's among them (its config.json is read, nothing loaded)."""
    if m.skip_n < 0:
        raise ConfigError(f"llm.skip_n={m.skip_n} must be >= 1, or 0 for never")
    if m.refresh_batch < 0:
        raise ConfigError(f"llm.refresh_batch={m.refresh_batch} must be >= 0 (0 = sized from "
                          "the env count)")
    if m.refresh_wait <= 0:
        raise ConfigError(f"llm.refresh_wait={m.refresh_wait} must be positive")
    if m.microbatch < 0:
        raise ConfigError(f"llm.microbatch={m.microbatch} must be >= 0 (0 = sized from the "
                          "device's memory)")
    if m.layer is not None and m.layer < 0:
        raise ConfigError(f"llm.layer={m.layer} must be >= 0 (0 = embeddings) or None")
    if m.backend == "vllm" and m.weights is None:
        raise ConfigError("llm.backend vllm needs --llm.weights: the model folder the server "
                          "serves (its tokenizer and config.json are read here)")
    if m.active_backend == "none":
        return
    if not spec(env_name).has_text:
        raise ConfigError(f"--llm needs a text renderer; env.name={env_name!r} has none "
                          f"(use one of {', '.join(TEXT_ENVS)})")
    if m.microbatch and local_envs % m.microbatch:
        raise ConfigError(f"llm.microbatch={m.microbatch} must divide the {local_envs} envs per "
                          "device")
    if m.active_backend == "vllm":
        if m.layer is not None:
            raise ConfigError("llm.layer cannot be chosen with backend vllm (it serves the last "
                              "layer); truncate the checkpoint with `python -m llm_jax truncate`")
        if num_devices > 1:
            raise ConfigError("llm.backend vllm runs on one device; pass --num-devices 1")
    q = model_config(m)
    if m.layer is not None and m.layer > q.num_layers:
        raise ConfigError(f"llm.layer={m.layer} but the model "
                          f"({m.weights or m.random_model}) has {q.num_layers} layers; pick "
                          f"0..{q.num_layers}")
    if m.weights is not None and m.active_backend == "jax":  # vLLM reads them, not us
        from llm_jax.loader import WeightsError, check_weights, resolve_folder

        try:
            check_weights(resolve_folder(m.weights))
        except WeightsError as e:
            raise ConfigError(f"llm.weights={m.weights!r}: {e}") from None


def model_config(m: LLMConfig) -> Qwen3Config:
    """The Qwen3 architecture --llm.* names: the weights folder's config.json, or the random
    model's shape. A folder that is not a Qwen3 checkpoint is a ConfigError on llm.weights."""
    if m.weights is None:
        return TINY if m.random_model == "tiny" else Qwen3Config.shape(m.random_model)
    from llm_jax.loader import WeightsError, resolve_folder

    try:
        return Qwen3Config.from_folder(resolve_folder(m.weights))
    except (Qwen3ConfigError, WeightsError) as e:
        raise ConfigError(f"llm.weights={m.weights!r}: {e}") from None


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
