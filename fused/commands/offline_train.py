"""Offline AWR / BC assembled for one config: the dataset's rows on the device, the online
agent's own network (plain, or LLM-augmented when a label set is named), the pure trainer
(`fused.rl.awr`). `offline.py` jits and runs it through the shared run machinery.

An offline run's one config (config.json) holds, besides its flags, `agent`: the policy as it
acts (env, network, and for an LLM-augmented policy the label set's --llm.* settings), so
evaluation, probes, datasets and online fine-tuning build the same agent as for an online run
(`fused.trained_policy.load_policy`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Literal, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tyro

from fused.agent import AgentConfig, policy_network
from fused.errors import ConfigError
from fused.llm.config import LLMConfig
from fused.llm.encoders import kind_of
from fused.rl.config import EnvSettings, PolicyConfig
from fused.data.store import Dataset, DatasetError
from fused.data.loader import (TrainingData, WindowStream, hidden_moments, load_training_data,
                               open_training_set)
from fused.envspec import spec
from fused.llm.norm import RunningNorm, normalize
from fused.rl.awr import AWRSettings, OfflineTrainer, Sequences, make_offline_train
from fused.rl.obs_codec import ObsCodec
from fused.runs import config_io
from fused.runs.checkpoint import abstract_like
from fused.runs.loop import Chunk, Job, run_job
from fused.runs.run_dir import RunDir
from fused.runs.settings import RESUME_FIXED as RUN_FIXED
from fused.runs.settings import RunSettings, WandbConfig, validate_run_settings
from fused.runs.invocation import command
from llm_jax import memory
from llm_jax.graphs import loop_jit
from llm_jax.memory import GB


@dataclasses.dataclass(frozen=True)
class OfflineConfig(RunSettings):
    """The run settings every training command has (`fused.runs.settings`), then AWR / BC's."""

    data: str = ""
    """Dataset folder (written by `label.py generate`, with a returns set)."""
    labels: str | None = None
    """Label set to train an LLM-augmented policy on (its hidden states); None: plain policy."""
    returns: str | None = None
    """Returns set (`label.py returns`); default the dataset's only one."""
    algo: tyro.conf.Suppress[Literal["awr", "bc"]] = "awr"
    """Set by the command (`offline.py awr|bc`), not a flag."""
    num_updates: int = 100_000
    """Minibatch updates."""
    batch_size: int = 256
    """Rows per minibatch, sampled uniformly among the rows with a valid return-to-go (GRU:
    batch_size / seq_len windows of consecutive rows)."""
    policy: PolicyConfig = PolicyConfig()
    """The network, as train.py's --policy.*: `gru` trains on windows of consecutive rows
    (--seq-len, --burn-in) and acts with its carry from each episode's start."""
    seq_len: int = 32
    """GRU: rows per window that count in the loss, from a uniformly drawn valid row on."""
    burn_in: int = 32
    """GRU: rows before the drawn row that only warm the carry up from zeros (it restarts where
    an episode starts, as when acting)."""
    lr: float = 3e-4
    """Adam learning rate."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm."""
    beta: float = 10.0
    """AWR temperature: weight exp((A - mean A) / beta)."""
    max_weight: float = 20.0
    """AWR weights are clipped at this."""
    value_coef: float = 1.0
    """Weight of the critic's 0.5 (R - V)^2 in the loss."""
    projection: Literal["dense", "layernorm"] = "dense"
    """With labels: the hidden-state branch's projection (as train.py's --llm.projection)."""
    device_rows: int = 0
    """0: the whole dataset goes on the device. N: data larger than N rows is streamed, each
    chunk training on a window of whole shards of at most N rows (seeded per chunk, read one
    window ahead with the dataset's zarr reader)."""
    agent: tyro.conf.Suppress[AgentConfig | None] = None
    """The policy as it acts (env, network, the label set's LLM), written by the run from the
    dataset's card; what evaluation, datasets and fine-tuning build. Not a flag."""

    @property
    def num_chunks(self) -> int:
        return -(-self.num_updates // self.updates_per_chunk)


def _preset(**kw) -> OfflineConfig:
    """A preset; --data stays required (tyro.MISSING) whichever preset is named. Minibatch
    updates are cheap: chunks of 1,000, checkpoints every 10,000 unless a preset says."""
    kw = {"updates_per_chunk": 1000, "checkpoint_every_updates": 10_000, **kw}
    return dataclasses.replace(OfflineConfig(), data=tyro.MISSING, **kw)


PRESETS: dict[str, tuple[str, OfflineConfig]] = {
    "cpu": ("Default: width 256, 20k updates of 256 rows (minutes on 2 cores).",
            _preset(policy=PolicyConfig(layer_width=256), num_updates=20_000)),
    "cpu-pixels": ("Frames on 2 cores: the public CNN at width 256, 1,000 updates of 128 rows "
                   "(about 5 minutes on Classic-Pixels).",
                   _preset(policy=PolicyConfig(layer_width=256), num_updates=1_000,
                           batch_size=128, updates_per_chunk=100,
                           checkpoint_every_updates=500)),
    "smoke": ("Seconds: width 32, 200 updates of 64 rows (tests).",
              _preset(policy=PolicyConfig(layer_width=32), num_updates=200, batch_size=64,
                      updates_per_chunk=50,
                      checkpoint_every_updates=100, plot=False,
                      wandb=WandbConfig(mode="disabled"))),
    "gpu": ("The prior system's AWR: width 512, 100k updates of 256 rows.",
            _preset()),
}
RESUME_FIXED = RUN_FIXED + ("data", "labels", "returns", "algo", "projection", "policy.",
                            "agent")


def validate(c: OfflineConfig) -> None:
    if not c.data:
        raise ConfigError("data is required: --data DIR (a dataset from `label.py generate`)")
    if c.device_rows < 0:
        raise ConfigError(f"device_rows={c.device_rows} must be >= 0 (0 = all on the device)")
    for name, value in {"num_updates": c.num_updates, "batch_size": c.batch_size,
                        "policy.layer_width": c.policy.layer_width,
                        "policy.num_layers": c.policy.num_layers}.items():
        if value <= 0:
            raise ConfigError(f"{name}={value} must be positive")
    validate_run_settings(c)
    for name in ("lr", "beta", "max_weight"):
        if not getattr(c, name) > 0:
            raise ConfigError(f"{name}={getattr(c, name)} must be positive")
    if c.policy.kind == "gru":
        if c.seq_len <= 0 or c.burn_in < 0:
            raise ConfigError(f"seq_len={c.seq_len}, burn_in={c.burn_in}: seq_len must be "
                              "positive and burn_in at least 0")
        if c.batch_size % c.seq_len:
            raise ConfigError(f"batch_size={c.batch_size} is not a multiple of seq_len="
                              f"{c.seq_len}: a GRU minibatch is batch_size / seq_len windows")


def agent_config(c: OfflineConfig, card: dict) -> AgentConfig:
    """The policy this run trains, as it will act: the dataset's env, the network of
    --policy.*, and with labels the label set's LLM (jax backend; a vLLM-made set is post-norm
    last layer)."""
    llm = LLMConfig()
    if c.labels:
        entry = card.get("labels", {}).get(c.labels)
        if entry is None or entry.get("llm") is None:
            raise ConfigError(f"label set {c.labels!r} has no LLM settings in {c.data}/card.json "
                              "(the `behaviour` set of an LLM run is not trainable here yet)")
        fields = {f.name for f in dataclasses.fields(LLMConfig)}
        saved = config_io.from_dict(LLMConfig, {k: v for k, v in entry["llm"].items()
                                                if k in fields}, f"{c.data}/card.json")
        llm = dataclasses.replace(saved, backend="jax", hidden="real",
                                  normalize=True, projection=c.projection,
                                  post_norm=bool(entry["post_norm"]), layer=entry["layer"])
    # seed 0: a random-weight model is made from the seed; label.py labels with seed 0
    return AgentConfig(EnvSettings(name=card["env"]), c.policy, llm, seed=0)


class Offline(NamedTuple):
    cfg: OfflineConfig  # its `agent` set
    network: nn.Module
    data: TrainingData
    device_data: dict | None
    trainer: OfflineTrainer
    norm: RunningNorm | None
    returns: str
    stream: WindowStream | None  # data larger than the device: a window per chunk

    def chunk_data(self, update: int):
        """The device data of the chunk starting at `update`."""
        if self.stream is None:
            return self.device_data
        return jax.device_put(self.stream.window(update // self.cfg.updates_per_chunk))


def network_inputs(codec: ObsCodec, has_hidden: bool):
    """(rows, data, norm) -> the network input of sampled rows: observations decoded from their
    stored form, hidden states looked up in the table and normalised as the policy input does."""
    def inputs_of(rows, data, norm):
        obs = codec.decode(jnp, {k: rows[k] for k in codec.columns})
        if not has_hidden:
            return obs
        h = data["hidden_table"][rows["hidden_index"]].astype(jnp.float32)
        return {"obs": obs, "hidden": normalize(norm, h)}

    return inputs_of


def check_in_memory(c: OfflineConfig, ts) -> None:
    """DatasetError (one line, before anything is read) when the whole dataset would not fit
    beside itself in three quarters of the free memory (the shards read and their
    concatenation, then that and the device's copy: on a CPU all in RAM; a million
    Classic-Pixels rows, 23.9 GB so, were killed for memory on a 24 GB machine), naming
    --device-rows with a window that fits (two windows read ahead and one on the device)."""

    per_row = ObsCodec(spec(ts.env)).row_bytes + 32  # + action, return, flags, indexes
    rows = sum(ts.rows)
    need = 2 * rows * per_row
    have, what = memory.available_bytes()  # (through the module: tests set it)
    if need > 0.75 * have:
        window = max(max(ts.rows), int(have / 8 / per_row) // 1024 * 1024)
        raise DatasetError(f"{c.data}: its {rows:,} rows take ~{need / GB:.1f} GB in memory "
                           f"(the host's arrays and the device's copy) but {have / GB:.1f} GB "
                           f"are free ({what}; 3/4 of it usable); stream it from disk: "
                           f"--device-rows {window}")


def build(c: OfflineConfig) -> Offline:
    """Reads the dataset (host), builds the agent and the trainer; nothing compiles yet."""

    card = Dataset(c.data).card()
    ts = open_training_set(c.data, c.returns, c.labels)
    sequences = c.policy.kind == "gru"
    stream = device_data = None
    if c.device_rows and sum(ts.rows) > c.device_rows:
        stream = WindowStream(ts, c.device_rows, c.seed, sequences)
        mean = var = None
        size = 0
        if c.labels:
            mean, var, _ = hidden_moments(ts)
            size = len(mean)
        valid = sum(int(ts.ds.read_returns(ts.returns, n)["valid"].sum()) for n in ts.names)
        data = TrainingData(None, ts.env, sum(ts.rows), valid, size, mean, var)
    else:
        check_in_memory(c, ts)
        data, _, _ = load_training_data(c.data, c.returns, c.labels, sequences)
        device_data = jax.device_put(data.arrays)
    agent = agent_config(c, card)
    if c.agent is not None and c.agent != agent:  # resuming: the card says otherwise now
        raise ConfigError(f"the dataset {c.data} now describes the policy otherwise than when "
                          f"this run started ({c.agent} vs {agent}); train a new run")
    c = dataclasses.replace(c, agent=agent)
    network = policy_network(agent)
    trainer = make_trainer(c, network, network_inputs(ObsCodec(spec(data.env)), bool(c.labels)))
    norm = None
    if c.labels:
        norm = RunningNorm(jnp.float32(data.valid), jnp.asarray(data.hidden_mean, jnp.float32),
                           jnp.asarray(data.hidden_var, jnp.float32))
    return Offline(c, network, data, device_data, trainer, norm, ts.returns, stream)


def make_trainer(c: OfflineConfig, network, inputs_of=None) -> OfflineTrainer:
    tx = optax.chain(optax.clip_by_global_norm(c.max_grad_norm), optax.adam(c.lr))
    settings = AWRSettings(c.algo, c.beta, c.max_weight, c.value_coef)
    seq = Sequences(c.seq_len, c.burn_in) if c.policy.kind == "gru" else None
    return make_offline_train(network, settings, tx, c.batch_size, c.updates_per_chunk,
                              c.num_updates, inputs_of, seq)


def example_input(agent: AgentConfig):
    obs = jnp.zeros((1, spec(agent.env.name).obs_dim), jnp.float32)
    if agent.llm.active_backend == "none":
        return obs
    return {"obs": obs, "hidden": jnp.zeros((1, kind_of(agent.llm).hidden_size(agent.llm)),
                                            jnp.float32)}


def train(off: Offline, run: RunDir, console) -> Path:
    """Trains to `num_updates` (or resumes `run`) in the one job loop (`fused.runs.loop`)."""

    cfg = off.cfg
    d = off.data
    labels = f", labels {cfg.labels!r} (H={d.hidden_size})" if cfg.labels else ""
    streamed = (f", streamed in windows of {cfg.device_rows:,} rows" if off.stream is not None
                else "")
    chunk = loop_jit(off.trainer.chunk, cfg.cuda_graphs, donate_argnums=0)

    def step(state, update: int, first: bool) -> Chunk:
        tc = time.time()
        state, metrics = chunk(state, off.chunk_data(update))
        metrics = jax.device_get(metrics)
        dt = time.time() - tc
        active = np.asarray(metrics.pop("active"))
        new_update = update + int(active.sum())
        rows = [{"update": update + i + 1, **{k: float(v[i]) for k, v in metrics.items()},
                 "samples_per_s": cfg.batch_size * int(active.sum()) / dt}
                for i in range(new_update - update)]
        last = rows[-1]
        return Chunk(state, rows, new_update, (
            f"loss {last['loss']:.4f}  value {last['loss/value']:.4f}  "
            f"{last['samples_per_s']:,.0f} samples/s"
            + (f"  (first chunk incl. compile {dt:.0f}s)" if first else "")))

    job = Job(
        cfg, cfg.num_updates,
        header=(f"[bold]craftax-fused offline[/] {cfg.algo.upper()} on {cfg.data} ({d.env}: "
                f"{d.valid:,} of {d.rows:,} rows with a valid return, returns "
                f"{off.returns!r}{labels}{streamed}), {cfg.num_updates:,} updates of "
                f"{cfg.batch_size} -> {run.path}"),
        init=lambda: jax.jit(off.trainer.init)(jax.random.PRNGKey(cfg.seed),
                                               example_input(cfg.agent), off.norm),
        abstract=abstract_like, step=step, update_of=lambda state: int(state.update),
        meta=lambda u: {"update": u},
        resume_command=f"{command('offline.py')} {cfg.algo} --resume {run.path}")
    t0 = time.time()
    done = run_job(job, run, console)
    console.print(f"done: {done.update}/{cfg.num_updates} updates in {time.time() - t0:.0f}s "
                  f"-> {run.path} (evaluate: {command('offline.py')} eval --run {run.path})")
    return run.path
