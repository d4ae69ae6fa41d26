"""A trained policy read back from a run folder, online (train.py) or offline (offline.py): the
config it acts under, the agent built from it (network + policy input, an LLM loaded if it has
one) and the parameters of one checkpoint. What label.py and offline.py use to act with a run's
policy. An offline run keeps that config in `policy.json` beside its own config.json."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, NamedTuple

import jax

from fused.agent import Agent, make_agent
from fused.config import TrainConfig
from fused.errors import ConfigError
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


def is_offline(run_dir: str | Path) -> bool:
    return (Path(run_dir).expanduser() / "policy.json").is_file()


def run_config(run_dir: str | Path) -> TrainConfig:
    """The train.py config a run's policy acts under (an offline run's policy.json)."""
    run_dir = Path(run_dir).expanduser()
    path = run_dir / ("policy.json" if is_offline(run_dir) else "config.json")
    if not path.is_file():
        raise ConfigError(f"policy {run_dir}: no config.json there; pass a run folder written "
                          "by train.py (or `random`)")
    return config_io.from_json(TrainConfig, path.read_text(), str(path))


def on_one_device(shapes):
    """Restore targets on this process's first device, whatever devices wrote the checkpoint
    (a run trained on several devices is read back whole)."""
    one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return abstract_like(shapes, jax.tree.map(lambda _: one, shapes))


def saved_devices(run_dir: Path, checkpoint: int | None) -> int:
    """How many devices the run trained on (train.py records it with each checkpoint)."""
    root = run_dir / "checkpoints"
    steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() \
        else []
    if checkpoint is None and steps:
        checkpoint = steps[-1]
    meta = root / str(checkpoint) / "meta" / "metadata"
    return json.loads(meta.read_text()).get("num_devices", 1) if meta.is_file() else 1


def trained_on(abstract, num_devices: int):
    """A one-device run's state shapes as a run on `num_devices` devices saved them: each device
    keeps its own reset pool, so the pools are `num_devices` times as long (all else is split
    by env or replicated, the same shapes)."""
    if num_devices == 1 or abstract.env.pool is None:
        return abstract
    pool = jax.tree.map(lambda x: jax.ShapeDtypeStruct((x.shape[0] * num_devices,)
                                                       + x.shape[1:], x.dtype), abstract.env.pool)
    return abstract.replace(env=abstract.env.replace(pool=pool))


def load_policy(run_dir: str | Path, num_envs: int, checkpoint: int | None = None,
                num_devices: int = 1, llm_overrides: dict | None = None) -> TrainedPolicy:
    """The run's policy, set up to act in `num_envs` envs. `checkpoint` picks an update (default
    the newest checkpoint that reads back and matches its digest); `llm_overrides` replace
    --llm.* fields of the acting config (ablations: `{"hidden": "zero"}`)."""
    run_dir = Path(run_dir).expanduser()
    cfg = run_config(run_dir)
    offline = is_offline(run_dir)
    like = None
    if offline:
        from fused.offline import OfflineConfig, abstract_state

        ocfg = config_io.from_json(OfflineConfig, (run_dir / "config.json").read_text(),
                                   str(run_dir / "config.json"))
        abstract = on_one_device(abstract_state(ocfg, cfg))
    else:
        online = build(cfg)  # the run's own shapes: the restore target
        abstract = on_one_device(trained_on(
            jax.eval_shape(online.trainer.init, jax.random.PRNGKey(0), online.frozen),
            saved_devices(run_dir, checkpoint)))
        like = online.agent
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
        again = (f"python offline.py {ocfg.algo} --resume {run_dir}" if offline else
                 f"python train.py --resume {run_dir}")
        raise ConfigError(f"policy {run_dir}: {e}; train it first: `{again}`") from None
    finally:
        ckpt.close()
    acting = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, num_envs=num_envs))
    if llm_overrides:
        acting = dataclasses.replace(acting, llm=dataclasses.replace(acting.llm, **llm_overrides))
    agent = make_agent(acting, num_devices, like=None if llm_overrides else like)
    if offline:  # the policy input's state as training normalised it: the data's moments
        inputs_state = None
        if state.norm is not None:
            from fused.llm.policy_input import init_llm_state

            inputs_state = init_llm_state(agent.inputs.llm, 1).replace(norm=state.norm)
        return TrainedPolicy(run_dir, acting, agent, state.params, inputs_state, step)
    return TrainedPolicy(run_dir, acting, agent, state.params, state.inputs, step)
