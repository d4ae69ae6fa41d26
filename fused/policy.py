"""A trained policy read back from a run folder: its saved config, the agent built from it
(network + policy input, an LLM loaded if it had one) and the parameters of one checkpoint.
What label.py and offline.py use to act with a run's policy."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, NamedTuple

import jax

from fused.agent import Agent, make_agent
from fused.config import ConfigError, TrainConfig
from fused.online import build
from fused.runs import config_io
from fused.runs.checkpoint import Checkpointer, CheckpointError, abstract_like


class TrainedPolicy(NamedTuple):
    run_dir: Path
    cfg: TrainConfig  # the run's config, env count replaced by the caller's
    agent: Agent
    params: Any
    inputs_state: Any  # the run's policy-input state (e.g. its hidden-state normaliser)
    step: int  # the checkpoint's update


def run_config(run_dir: str | Path) -> TrainConfig:
    path = Path(run_dir).expanduser() / "config.json"
    if not path.is_file():
        raise ConfigError(f"policy {run_dir}: no config.json there; pass a run folder written "
                          "by train.py (or `random`)")
    return config_io.from_json(TrainConfig, path.read_text(), str(path))


def load_policy(run_dir: str | Path, num_envs: int, checkpoint: int | None = None,
                num_devices: int = 1) -> TrainedPolicy:
    """The run's policy, set up to act in `num_envs` envs. `checkpoint` picks an update (default
    the newest checkpoint that reads back and matches its digest)."""
    run_dir = Path(run_dir).expanduser()
    cfg = run_config(run_dir)
    online = build(cfg)  # the run's own shapes: the restore target
    abstract = abstract_like(jax.eval_shape(online.trainer.init, jax.random.PRNGKey(0),
                                            online.frozen))
    ckpt = Checkpointer(run_dir / "checkpoints")
    try:
        if checkpoint is None:
            step, state, _ = ckpt.restore_latest(abstract)
        else:
            if checkpoint not in ckpt.steps():
                raise ConfigError(f"checkpoint={checkpoint} is not in {run_dir}/checkpoints "
                                  f"(there: {ckpt.steps()})")
            step, state, _ = ckpt.restore(checkpoint, abstract)
    except CheckpointError as e:
        raise ConfigError(f"policy {run_dir}: {e}") from None
    finally:
        ckpt.close()
    acting = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, num_envs=num_envs))
    agent = make_agent(acting, num_devices, like=online.agent)
    return TrainedPolicy(run_dir, acting, agent, state.params, state.inputs, step)
