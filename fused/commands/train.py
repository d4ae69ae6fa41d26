"""Online PPO on Craftax, rollout and update compiled into chunks: `train.py [PRESET] [flags]`.

Presets: cpu (default), smoke, gpu, symbolic. `python train.py --help` lists every flag;
`python train.py smoke --help` shows a preset's values. `python train.py --resume RUN [--flags]`
continues a run from its last good checkpoint with its saved config (flags change what may change).
"""

from __future__ import annotations

import sys
import time
from typing import NamedTuple
from pathlib import Path

import jax
from jax.sharding import Mesh
from rich.console import Console

from fused.config import TrainConfig, PRESETS, RESUME_FIXED, RESUME_FREE, validate
from fused.errors import ConfigError
from fused.agent import Agent, make_agent
from fused.commands import process
from fused.rl.env_api import Env
from fused.rl.envs import make_env
from fused.rl.ppo import RunnerState
from fused.rl.sharding import AXIS, make_mesh, shard, state_shardings
from fused.rl.trainer import Trainer, make_train
from fused.runs import config_io
from fused.runs.files import require_writable
from fused.runs.run_dir import RunDir, default_name

DEFAULT_PRESET = "cpu"
DESCRIPTION = "Train PPO on Craftax with the whole rollout and update compiled."


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
    env = make_env(cfg.env)
    agent = make_agent(cfg, num_devices, like)
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
    cfg = config_io.parse(TrainConfig, PRESETS, DEFAULT_PRESET, argv, DESCRIPTION, "train.py")
    if cfg.resume is None:
        return cfg, {}
    return config_io.resume(TrainConfig, RunDir.reopen(cfg.resume).config_path, argv, PRESETS,
                            RESUME_FIXED, RESUME_FREE)


def main(argv: list[str] | None = None) -> Path:
    process.one_line_warnings()
    try:
        cfg, changed = load_config(sys.argv[1:] if argv is None else argv)
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
        online = build(cfg, num_devices)  # host setup; model problems are ConfigErrors here
    except ConfigError as e:
        sys.exit(f"error: {e}")
    for k, (old, new) in changed.items():
        console.print(f"resume: {k} {old!r} -> {new!r}")
    return train(online, run, console)


def train(online: Online, run: RunDir, console: Console) -> Path:
    from fused.runs.checkpoint import abstract_like
    from fused.runs.loop import Chunk, Job, run_job
    from fused.runs.metrics import chunk_rows

    cfg, trainer, inputs = online.cfg, online.trainer, online.agent.inputs
    chunk = jax.jit(trainer.chunk, donate_argnums=0)
    profiled = False

    def step(state, update: int, first: bool) -> Chunk:
        nonlocal profiled
        # Trace the second chunk: the first one includes compilation.
        profiling = cfg.profile_dir is not None and not first and not profiled
        if profiling:
            jax.profiler.start_trace(cfg.profile_dir)
        tc = time.time()
        state, metrics = chunk(state, online.frozen)
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
            f"{sum(returns) / len(returns) if returns else float('nan'):6.2f}"
            + (f"  (first chunk incl. compile {dt:.0f}s)" if first else "")))

    devices = online.mesh.size if online.mesh else 1
    job = Job(
        cfg, cfg.num_updates,
        header=(f"[bold]craftax-fused[/] {cfg.env.name}: {cfg.env.num_envs} envs x "
                f"{cfg.ppo.num_steps} steps, {cfg.num_updates} updates "
                f"({cfg.num_updates * cfg.steps_per_update:,} env steps) on {devices} "
                f"{jax.devices()[0].platform} device(s) -> {run.path}"),
        init=lambda: commit(online, jax.jit(trainer.init)(jax.random.PRNGKey(cfg.seed),
                                                          online.frozen)),
        abstract=lambda state: abstract_like(state, shardings(online, state)),
        step=step, update_of=lambda state: int(state.update_step),
        meta=lambda u: {"update": u, "env_steps": u * cfg.steps_per_update,
                        "num_devices": devices},
        resume_command=f"python train.py --resume {run.path}",
        lead=jax.process_index() == 0,  # writes the run folder's files; every process checkpoints
        wandb_step="env_steps")
    t0 = time.time()
    done = run_job(job, run, console)
    console.print(f"done: {done.update}/{cfg.num_updates} updates in {time.time() - t0:.0f}s. "
                  f"Outputs in {run.path}: config.json, metrics.jsonl"
                  f"{', curve.png' if done.curve else ''}, checkpoints/ (steps "
                  f"{done.checkpoints})")
    return run.path


if __name__ == "__main__":
    main()
