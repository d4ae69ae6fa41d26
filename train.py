"""Online PPO on Craftax, rollout + update compiled into chunks: `python train.py [PRESET] [--flags]`.

Presets: cpu (default), smoke, gpu, symbolic. `python train.py --help` lists every flag;
`python train.py smoke --help` shows a preset's values.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import signal
import sys
import time
from pathlib import Path

import tyro

from fused.config import (PRESETS, ConfigError, TrainConfig, config_from_dict, config_to_dict,
                          validate)

DEFAULT_PRESET = "cpu"


def parse_args(argv: list[str]) -> TrainConfig:
    """A preset name may lead; without one the `cpu` preset is used."""
    if not argv or (argv[0] not in PRESETS and argv[0] not in ("-h", "--help")):
        argv = [DEFAULT_PRESET, *argv]
    return tyro.extras.overridable_config_cli(
        {k: v for k, v in PRESETS.items()}, args=argv,
        description="Train PPO on Craftax with the whole rollout and update compiled.")


def setup_jax() -> None:
    import jax

    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR",
                           os.path.expanduser("~/.cache/craftax-fused/jax"))
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    if os.environ.get("JAX_COORDINATOR_ADDRESS"):  # multi-host: cluster read from the environment
        jax.distributed.initialize()


class StopFlag:
    """SIGINT/SIGTERM ask for a checkpoint and a clean exit at the next chunk boundary;
    a second SIGINT interrupts at once."""

    def __init__(self):
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        print(f"\nsignal {signal.Signals(signum).name}: checkpointing at the end of this chunk",
              flush=True)


def resolve_run(cfg: TrainConfig) -> tuple[TrainConfig, Path, bool]:
    if cfg.resume:
        run_dir = Path(cfg.resume)
        saved = run_dir / "config.json"
        if not saved.exists():
            raise ConfigError(f"--resume {run_dir}: no config.json there; pass a run folder "
                              "written by train.py")
        saved_cfg = config_from_dict(json.loads(saved.read_text()))
        return dataclasses.replace(saved_cfg, resume=cfg.resume), run_dir, True
    name = cfg.run_name or (f"{cfg.env.name}-s{cfg.seed}-"
                            f"{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    run_dir = Path(cfg.out_dir) / name
    if (run_dir / "checkpoints").exists():
        raise ConfigError(f"run folder {run_dir} already has checkpoints; use --resume {run_dir} "
                          "or another --run-name")
    return cfg, run_dir, False


def main(argv: list[str] | None = None) -> Path:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg, run_dir, resuming = resolve_run(cfg)
        setup_jax()
        import jax

        num_devices = cfg.num_devices or jax.device_count()
        if num_devices > jax.device_count():
            raise ConfigError(f"num_devices={num_devices} but only {jax.device_count()} "
                              "devices are visible")
        validate(cfg, num_devices)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    return run(cfg, run_dir, resuming, num_devices)


def run(cfg: TrainConfig, run_dir: Path, resuming: bool, num_devices: int) -> Path:
    import jax
    from rich.console import Console

    from fused.checkpoint import Checkpointer, abstract_like
    from fused.runlog import RunLog, atomic_write_text, chunk_rows
    from fused.train import initial_state, make_train, state_shardings

    console = Console(soft_wrap=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.json", json.dumps(config_to_dict(cfg), indent=2))
    log = RunLog(run_dir, cfg.plot)
    ckpt = Checkpointer(run_dir / "checkpoints", cfg.keep_checkpoints)
    console.print(f"[bold]craftax-fused[/] {cfg.env.name}: {cfg.env.num_envs} envs x "
                  f"{cfg.ppo.num_steps} steps, {cfg.num_updates} updates "
                  f"({cfg.num_updates * cfg.steps_per_update:,} env steps) on {num_devices} "
                  f"{jax.devices()[0].platform} device(s) -> {run_dir}")

    trainer = make_train(cfg, num_devices)
    chunk = trainer.chunk if trainer.mesh is not None else jax.jit(trainer.chunk, donate_argnums=0)
    t0 = time.time()
    state = initial_state(trainer, jax.random.PRNGKey(cfg.seed))
    if resuming:
        step, state, _ = ckpt.restore_latest(abstract_like(state, state_shardings(trainer, state)))
        log.truncate_after(step)
        console.print(f"resumed from checkpoint at update {step}")
    wandb_run = start_wandb(cfg, run_dir)
    llm_call_s = calibrate_llm(trainer, state) if trainer.llm is not None else None

    stop = StopFlag()
    update = int(state.update_step)
    last_ckpt_update, last_ckpt_time = update, time.time()
    first, profiled = True, False
    while update < cfg.num_updates:
        # Trace the second chunk: the first one includes compilation.
        profiling = cfg.profile_dir is not None and not first and not profiled
        if profiling:
            jax.profiler.start_trace(cfg.profile_dir)
        tc = time.time()
        state, metrics = chunk(state, trainer.frozen)
        metrics = jax.device_get(metrics)  # waits for the chunk
        dt = time.time() - tc
        if profiling:
            jax.profiler.stop_trace()
            profiled = True
            console.print(f"profile of one chunk written to {cfg.profile_dir}")
        new_update = min(update + cfg.updates_per_chunk, cfg.num_updates)
        rows = chunk_rows(metrics, cfg.steps_per_update, trainer.env.achievement_names, update,
                          new_update)
        sps = (new_update - update) * cfg.steps_per_update / dt
        for r in rows:
            r["steps_per_s"] = sps
            if "llm/calls" in r:
                encodes = r["llm/calls"] * cfg.env.num_envs + r["llm/refreshed"]
                r["llm/tokens_per_encode"] = r["llm/tokens"] / max(encodes, 1.0)
                if llm_call_s is not None:
                    r["llm/time_share_est"] = min(1.0, encodes / cfg.env.num_envs * llm_call_s
                                                  * len(rows) / dt)
        log.write(rows)
        if wandb_run is not None:
            for r in rows:
                wandb_run.log(r, step=r["env_steps"])
        report(console, cfg, rows, sps, dt if first else None, t0)
        update, first = new_update, False
        due_updates = (cfg.checkpoint_every_updates
                       and update - last_ckpt_update >= cfg.checkpoint_every_updates)
        due_time = (cfg.checkpoint_every_minutes
                    and time.time() - last_ckpt_time >= 60 * cfg.checkpoint_every_minutes)
        due = due_updates or due_time
        if due or stop.requested or update >= cfg.num_updates:
            ckpt.save(update, state, {"update": update, "env_steps": update * cfg.steps_per_update})
            last_ckpt_update, last_ckpt_time = update, time.time()
            log.plot()
        if stop.requested:
            console.print(f"stopped at update {update}; continue with: python train.py "
                          f"--resume {run_dir}")
            break
    ckpt.close()
    if wandb_run is not None:
        wandb_run.finish()
    png = log.plot()
    console.print(f"done: {update}/{cfg.num_updates} updates in {time.time() - t0:.0f}s. "
                  f"Outputs in {run_dir}: config.json, metrics.jsonl"
                  f"{', curve.png' if png else ''}, checkpoints/ (steps {ckpt.steps()})")
    return run_dir


def calibrate_llm(trainer, state) -> float | None:
    """Seconds of one LLM call over all envs (the jitted encoder alone, after warm-up): the
    `llm/time_share_est` metric is calls x this / chunk time (XLA gives no per-op clock inside
    a compiled chunk). None for the vllm backend, which times its host calls itself."""
    import jax

    from fused.llm import encode_observations

    llm = trainer.llm
    if llm.backend != "jax":
        return None
    obs = jax.device_get(state.env.obs)
    f = jax.jit(lambda o, fr: encode_observations(llm, fr, o, trainer.llm_microbatch))
    jax.block_until_ready(f(obs, trainer.frozen))
    t = time.perf_counter()
    jax.block_until_ready(f(obs, trainer.frozen))
    return time.perf_counter() - t


def report(console, cfg, rows, sps, compile_s, t0):
    last = rows[-1]
    ret = [r["return"] for r in rows if "return" in r]
    eta = (cfg.num_updates - last["update"]) * cfg.steps_per_update / max(sps, 1e-9)
    extra = f" (first chunk incl. compile {compile_s:.0f}s)" if compile_s is not None else ""
    console.print(
        f"update {last['update']:>6}/{cfg.num_updates}  steps {last['env_steps']:>11,}  "
        f"{sps:>8,.0f} steps/s  return {sum(ret) / len(ret) if ret else float('nan'):6.2f}  "
        f"ETA {eta / 60:5.1f} min{extra}")


def start_wandb(cfg: TrainConfig, run_dir: Path):
    if cfg.wandb.mode == "disabled":
        return None
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    return wandb.init(project=cfg.wandb.project, entity=cfg.wandb.entity, mode=cfg.wandb.mode,
                      dir=str(run_dir), config=config_to_dict(cfg), name=run_dir.name,
                      id=run_dir.name.replace("/", "_")[:120], resume="allow")


if __name__ == "__main__":
    main()
