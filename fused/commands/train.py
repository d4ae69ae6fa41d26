"""Online PPO on Craftax, rollout and update compiled into chunks: `train.py [PRESET] [flags]`.

Presets: cpu (default), smoke, gpu, symbolic. `python train.py --help` lists every flag;
`python train.py smoke --help` shows a preset's values. `python train.py --resume RUN [--flags]`
continues a run from its last good checkpoint with its saved config (flags change what may change).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh
from rich.console import Console

from fused.agent import Agent, AgentConfig, make_agent, needs_text
from fused.errors import ConfigError
from fused.llm.config import LLMConfig
from fused.llm.encoders import validate_llm
from fused.rl.config import (EnvConfig, ExploreConfig, PolicyConfig, PPOConfig, env_settings,
                             validate_env, validate_policy)
from fused.commands import process
from fused.rl.env_api import Env
from fused.rl.envs import make_env
from fused.rl.ppo import RunnerState
from fused.rl.sharding import AXIS, jit_init, make_mesh, shard, state_shardings
from fused.rl.trainer import Trainer, make_train
from fused.runs import config_io
from fused.runs.files import require_writable
from fused.runs.run_dir import RunDir, default_name
from fused.runs.settings import RESUME_FIXED as RUN_FIXED
from fused.runs.settings import RunSettings, WandbConfig, validate_run_settings
from fused.runs.invocation import command
from llm_jax.graphs import loop_jit

DEFAULT_PRESET = "cpu"
DESCRIPTION = ("Train PPO on Craftax with the whole rollout and update compiled. `--plan CARD` "
               "(a GPU bench/gpu_target.py describes), after a preset and flags: whether the run "
               "fits that GPU, its predicted steps/s and wall time; compiled here, nothing run.")


@dataclasses.dataclass(frozen=True)
class TrainConfig(RunSettings):
    """The run settings every training command has (`fused.runs.settings`), then PPO's."""

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
    total_timesteps: int = 1_000_000
    """Env steps to train for (rounded down to whole updates)."""
    profile_dir: str | None = None
    """Write a jax.profiler trace of the second chunk here."""
    num_devices: int | None = None
    """Local devices to shard envs over; None uses all."""

    @property
    def agent(self) -> AgentConfig:
        """The policy this run trains, as evaluation and datasets build it."""
        return AgentConfig(env_settings(self.env), self.policy, self.llm, self.seed)

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
RESUME_FIXED = RUN_FIXED + ("env.", "ppo.num_steps", "llm.", "policy.", "explore.")
RESUME_FREE = ("llm.url",)


def validate(cfg: TrainConfig, num_devices: int = 1) -> None:
    """Reject values that cannot work, with one line naming the field and the fix."""
    e, p = cfg.env, cfg.ppo
    validate_env(e, e.num_envs, num_devices)
    validate_policy(cfg.policy, e.name)
    positive = {
        "ppo.num_steps": p.num_steps,
        "ppo.update_epochs": p.update_epochs, "ppo.num_minibatches": p.num_minibatches,
        "total_timesteps": cfg.total_timesteps,
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
    validate_run_settings(cfg)
    validate_llm(cfg.llm, cfg.env.name, cfg.env.num_envs // num_devices, num_devices)


def _preset(**kw) -> TrainConfig:
    return dataclasses.replace(TrainConfig(), **kw)


CPU = _preset(
    env=EnvConfig(name="Craftax-Classic-Symbolic-v1", num_envs=64, reset_pool=8),
    ppo=PPOConfig(num_steps=32, num_minibatches=4, lr=5e-4, update_epochs=2),
    policy=PolicyConfig(layer_width=256),
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
            ppo=PPOConfig(num_steps=8, num_minibatches=2, update_epochs=1),
            policy=PolicyConfig(layer_width=32),
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
                dataclasses.replace(CPU, policy=dataclasses.replace(CPU.policy, kind="gru"))),
    "cpu-rnd": ("The cpu preset with the RND bonus (the baselines' RND sizes, coef 1).",
                dataclasses.replace(CPU, explore=ExploreConfig("rnd"))),
    "cpu-pixels": (
        "Frames on 2 cores: Craftax-Classic-Pixels (63 x 63), the public CNN at width 256, "
        "64 envs x 32 steps, 2 epochs x 4 mb, 82k steps (~8 minutes on 2 cores).",
        dataclasses.replace(CPU, env=dataclasses.replace(CPU.env, name="Craftax-Classic-Pixels-v1"),
                            total_timesteps=81_920, updates_per_chunk=10,
                            checkpoint_every_updates=20),
    ),
    "gpu-pixels": (
        "Accelerator: Craftax-Pixels (130 x 110 frames), the public pixel PPO (CNN 512, 1024 "
        "envs, 64 steps, 4 x 8 minibatches, lr 2e-4, lambda 0.8), 1B steps.",
        _preset(
            env=EnvConfig(name="Craftax-Pixels-v1", num_envs=1024, reset_pool=64,
                          worlds_per_step=8),
            total_timesteps=1_000_000_000, updates_per_chunk=20, checkpoint_every_updates=500,
        ),
    ),
    "symbolic": (
        "The prior system's Craftax-Symbolic PPO (its published defaults) at 128 envs.",
        _preset(env=EnvConfig(num_envs=128), total_timesteps=100_000_000, updates_per_chunk=10),
    ),
}


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


def build(cfg: TrainConfig, num_devices: int = 1, like: Agent | None = None) -> Online:
    """Host setup (env, policy, an LLM's weights and prefix cache, shared with `like`'s where
    it has the same model); nothing compiles yet."""
    env = make_env(cfg.env, needs_text(cfg.agent))
    agent = make_agent(cfg.agent, cfg.env.num_envs, num_devices, like)
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


def load_config(argv: list[str]) -> tuple[TrainConfig, dict]:
    """The config to run and, when resuming, the fields the flags changed."""
    cfg = config_io.parse(TrainConfig, PRESETS, DEFAULT_PRESET, argv, DESCRIPTION,
                          command("train.py"))
    if cfg.resume is None:
        return cfg, {}
    return config_io.resume(TrainConfig, RunDir.reopen(cfg.resume).config_path, argv, PRESETS,
                            RESUME_FIXED, RESUME_FREE)


def plan(argv: list[str]) -> None:
    """`--plan CARD`: the run compiled here for that GPU and its predicted speed, nothing
    trained (a checkout's bench/plan.py: the cards' figures and the fit live there)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "plan.py"
    if not path.is_file():
        sys.exit("error: --plan needs a checkout of the repository (its bench/plan.py)")
    spec = importlib.util.spec_from_file_location("plan", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(argv)


@process.ends_in_one_line
def main(argv: list[str] | None = None) -> Path:
    process.one_line_warnings()
    argv = sys.argv[1:] if argv is None else argv
    if any(a == "--plan" or a.startswith("--plan=") for a in argv):
        return plan(argv)
    try:
        cfg, changed = load_config(argv)
        process.setup_compilation_cache()
        process.join_cluster()  # several hosts: the cluster the environment describes, if any
        import jax

        console = Console(soft_wrap=True, quiet=jax.process_index() != 0)
        process.log_to(console)
        num_devices = cfg.num_devices or jax.device_count()
        if num_devices > jax.device_count():
            raise ConfigError(f"num_devices={num_devices} but only {jax.device_count()} "
                              "devices are visible")
        validate(cfg, num_devices)
        require_writable(cfg.resume or cfg.out_dir, "--resume" if cfg.resume else "--out-dir")
        run = (RunDir.reopen(cfg.resume) if cfg.resume else
               RunDir.create(cfg.out_dir, cfg.run_name or default_name(cfg.env.name,
                                                                       f"s{cfg.seed}")))
        run.check_total(cfg.num_updates, f"--total-timesteps {cfg.total_timesteps:,}")
        online = build(cfg, num_devices)  # host setup; model problems are ConfigErrors here
    except ConfigError as e:
        sys.exit(f"error: {e}")
    for k, (old, new) in changed.items():
        console.print(f"resume: {k} {old!r} -> {new!r}")
    trained = cfg.num_updates * cfg.steps_per_update
    if trained != cfg.total_timesteps and not cfg.resume:
        console.print(f"note: --total-timesteps {cfg.total_timesteps:,} is not a whole number of "
                      f"updates ({cfg.steps_per_update:,} env steps each): training "
                      f"{cfg.num_updates:,} updates, {trained:,} steps")
    return train(online, run, console)


cli = process.console_script(main)  # craftax-train


def train(online: Online, run: RunDir, console: Console) -> Path:
    from fused.runs.checkpoint import abstract_like
    from fused.runs.loop import Chunk, Job, run_job
    from fused.runs.metrics import chunk_rows

    cfg, trainer, inputs = online.cfg, online.trainer, online.agent.inputs
    chunk = loop_jit(trainer.chunk, cfg.cuda_graphs, donate_argnums=0)
    length = np.int32(cfg.num_updates)  # (data: a resume with another length, same program)
    profiled = False

    def step(state, update: int, first: bool) -> Chunk:
        nonlocal profiled
        # Trace the second chunk: the first one includes compilation.
        profiling = cfg.profile_dir is not None and not first and not profiled
        if profiling:
            jax.profiler.start_trace(cfg.profile_dir)
        tc = time.time()
        state, metrics = chunk(state, online.frozen, length)
        metrics = jax.device_get(metrics)  # waits for the chunk
        dt = time.time() - tc
        if profiling:
            jax.profiler.stop_trace()
            profiled = True
            console.print(f"profile of one chunk written to {cfg.profile_dir}")
        new_update = min(update + cfg.updates_per_chunk, cfg.num_updates)
        rows = chunk_rows(metrics, cfg.steps_per_update, online.env.achievement_names,
                          update, new_update)
        sps = (new_update - update) * cfg.steps_per_update / dt
        for r in rows:
            r["steps_per_s"] = sps
            r.update(inputs.host_metrics(r, dt, len(rows), state.env.obs))
        returns = [r["return"] for r in rows if "return" in r]
        return Chunk(state, rows, new_update, (
            f"{rows[-1]['env_steps']:>11,} steps  {sps:>8,.0f} steps/s  return "
            + (f"{sum(returns) / len(returns):6.2f}" if returns else f"{'-':>6}")  # (none ended)
            + (f"  (first chunk incl. compile {dt:.0f}s)" if first else "")))

    devices = online.mesh.size if online.mesh else 1
    job = Job(
        cfg, cfg.num_updates,
        header=(f"[bold]craftax-fused[/] {cfg.env.name}: {cfg.env.num_envs} envs x "
                f"{cfg.ppo.num_steps} steps, {cfg.num_updates} updates "
                f"({cfg.num_updates * cfg.steps_per_update:,} env steps) on {devices} "
                f"{jax.devices()[0].platform} device(s) -> {run.path}"),
        init=lambda: commit(online, jit_init(trainer)(jax.random.PRNGKey(cfg.seed),
                                                      online.frozen)),
        abstract=lambda state: abstract_like(state, shardings(online, state)),
        step=step, update_of=lambda state: int(state.update_step),
        meta=lambda u: {"update": u, "env_steps": u * cfg.steps_per_update,
                        "num_devices": devices},
        resume_command=f"{command('train.py')} --resume {run.path}",
        lead=jax.process_index() == 0,  # writes the run folder's files; every process checkpoints
        wandb_step="env_steps")
    t0 = time.time()
    done = run_job(job, run, console)
    console.print(f"done: {done.update}/{cfg.num_updates} updates in {time.time() - t0:.0f}s. "
                  f"Outputs in {run.path}: config.json, metrics.jsonl"
                  f"{', curve.png' if done.curve else ''}, checkpoints/ (steps "
                  f"{done.checkpoints})"
                  + (", wandb/" if (run.path / "wandb").is_dir() else ""))
    return run.path


if __name__ == "__main__":
    main()
