"""A trained policy read back from a run folder, online (train.py) or offline (offline.py): the
`AgentConfig` it acts under (a train.py run's `TrainConfig.agent`, an offline run's saved
`agent`), the agent built from it (network + policy input, an LLM loaded if it has one), and
the parameters and input normaliser of one checkpoint. What label.py and offline.py use to act
with a run's policy."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, NamedTuple

from fused.agent import Agent, AgentConfig, make_agent
from fused.errors import ConfigError
from fused.llm.norm import RunningNorm
from fused.llm.policy_input import init_llm_state
from fused.runs import config_io
from fused.runs.checkpoint import Checkpointer, CheckpointError
from fused.runs.invocation import command


class TrainedPolicy(NamedTuple):
    run_dir: Path
    cfg: AgentConfig  # how the run's policy acts
    num_envs: int  # it is set up to act in
    agent: Agent
    params: Any
    inputs_state: Any  # the run's policy-input state (e.g. its hidden-state normaliser)
    step: int  # the checkpoint's update


def is_offline(run_dir: str | Path) -> bool:
    """An offline.py run (its config names the algorithm; runs written before the agent went
    into config.json kept it in policy.json)."""
    run_dir = Path(run_dir).expanduser()
    if (run_dir / "policy.json").is_file():
        return True
    try:
        return "algo" in json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return False


def is_run(run_dir: str | Path) -> bool:
    """A run folder: its config.json (or, of an offline run of an earlier version, policy.json)."""
    run_dir = Path(run_dir).expanduser()
    return (run_dir / "config.json").is_file() or (run_dir / "policy.json").is_file()


def agent_config(run_dir: str | Path) -> AgentConfig:
    """How a run's policy acts, read from its config.json: an offline run's `agent`; of a
    train.py run, the fields that make its agent (`TrainConfig.agent`)."""
    run_dir = Path(run_dir).expanduser()
    path = run_dir / "config.json"
    if (run_dir / "policy.json").is_file():  # an offline run of an earlier version
        path = run_dir / "policy.json"
    if not is_run(run_dir):
        raise ConfigError(f"{run_dir}: no config.json there; pass a run folder written by "
                          "train.py or offline.py")
    try:
        saved = config_io.upgrade(json.loads(path.read_text()))
    except ValueError as e:
        raise ConfigError(f"{path} is not valid JSON ({e})") from None
    if "algo" in saved:
        if saved.get("agent") is None:
            raise ConfigError(f"policy {run_dir}: its config.json has no `agent` (the run "
                              "stopped before it started training); train it first")
        return config_io.from_dict(AgentConfig, saved["agent"], f"{path} (agent)")
    env = {k: v for k, v in saved.get("env", {}).items() if k != "num_envs"}
    return config_io.from_dict(AgentConfig, {"env": env, "policy": saved.get("policy", {}),
                                             "llm": saved.get("llm", {}),
                                             "seed": saved.get("seed", 0)}, str(path))


def load_policy(run_dir: str | Path, num_envs: int, checkpoint: int | None = None,
                num_devices: int = 1, llm_overrides: dict | None = None,
                like: Agent | None = None) -> TrainedPolicy:
    """The run's policy, set up to act in `num_envs` envs: its parameters and what its policy
    input learned (an LLM run's hidden-state normaliser) read from one checkpoint, nothing of
    the trainer (optimiser, envs) built or read. `checkpoint` picks an update (default the
    newest checkpoint that reads back); `llm_overrides` replace --llm.* fields of the acting
    config (ablations: `{"hidden": "zero"}`); `like`, an agent of this run already set up (for
    another env count or ablation), lends its LLM's weights."""
    run_dir = Path(run_dir).expanduser()
    acting = agent_config(run_dir)
    offline = is_offline(run_dir)
    if llm_overrides:
        acting = dataclasses.replace(acting, llm=dataclasses.replace(acting.llm, **llm_overrides))

    def select(saved: dict) -> dict:
        """The parameters, and the hidden-state normaliser where the run has one (an offline
        run keeps it as `norm`, an online one in its policy input's state)."""
        part = {"params": saved["params"]}
        if offline and saved.get("norm") is not None:
            part["norm"] = saved["norm"]
        if not offline and saved.get("inputs") is not None:
            part["inputs"] = {"norm": saved["inputs"]["norm"]}
        return part

    ckpt = Checkpointer(run_dir / "checkpoints")
    try:
        if checkpoint is None:
            step, part = ckpt.restore_latest_part(select)
        else:
            if checkpoint not in ckpt.steps():
                raise ConfigError(f"checkpoint={checkpoint} is not in {run_dir}/checkpoints "
                                  f"(there: {ckpt.steps()})")
            step, part = checkpoint, ckpt.restore_part(checkpoint, select)
    except CheckpointError as e:
        again = (f"{command('offline.py')} {run_algo(run_dir)} --resume {run_dir}" if offline
                 else f"{command('train.py')} --resume {run_dir}")
        raise ConfigError(f"policy {run_dir}: {e}; train it first: `{again}`") from None
    finally:
        ckpt.close()
    agent = make_agent(acting, num_envs, num_devices, like=like)
    norm = part.get("norm") or part.get("inputs", {}).get("norm")
    inputs_state = None
    if norm is not None:  # the policy input's state as training normalised it
        inputs_state = init_llm_state(agent.inputs.encoder.hidden_size, 1).replace(
            norm=RunningNorm(**norm))
    return TrainedPolicy(run_dir, acting, num_envs, agent, part["params"], inputs_state, step)


def run_algo(run_dir: Path) -> str:
    """An offline run's algorithm (awr or bc), read from its config.json."""
    try:
        return json.loads((run_dir / "config.json").read_text())["algo"]
    except (OSError, ValueError, KeyError):
        return "awr"
