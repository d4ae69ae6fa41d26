"""Configs of `label.py`'s three commands (frozen; every field's docstring is its --help).
The LLM options are train.py's own `LLMConfig`, one definition for both."""

from __future__ import annotations

import dataclasses
from typing import Literal

import tyro

from fused.errors import ConfigError
from fused.llm.config import ImagineConfig, LLMConfig, validate_imagine
from fused.llm.encoders import validate_llm
from fused.rl.config import EnvSettings, validate_env
from fused.runs.settings import CudaGraphs
from fused.envspec import EnvName


@dataclasses.dataclass(frozen=True)
class GenerateConfig:
    out: str
    """Dataset folder to write (rerun the same command to resume it)."""
    policy: str = "random"
    """Behaviour policy: `random` (uniform actions), or a train.py run folder (its saved config
    and a checkpoint are read; an LLM-augmented run records the hidden states it acted on)."""
    checkpoint: int | None = None
    """With a run folder: the checkpoint (update) to act with; default the newest good one."""
    epsilon: float = 0.0
    """With a run folder: act uniformly at random with this probability (the log-probs stored
    are of that mixture)."""
    env: EnvSettings = EnvSettings()
    """Environment (with a run folder it must be the run's)."""
    num_envs: int = 64
    """Envs stepped in parallel, over all streams."""
    steps: int = 1024
    """Env steps per env: the dataset has num_envs x steps transitions before --min-return."""
    seed: int = 0
    """PRNG seed (same seed, same command: byte-identical shards)."""
    streams: int = 1
    """Independent groups of num_envs / streams envs, each with its own episodes and shards: the
    unit one process generates (process i of n takes streams i, i + n, ...)."""
    block_steps: int = 64
    """Env steps per compiled block (the host assembles and writes between blocks)."""
    shard_rows: int = 8192
    """Rows per shard (the last one of a stream shorter)."""
    min_return: float | None = None
    """Keep only whole episodes whose return reaches this (episodes cut by the end of the data
    are then dropped too: they cannot be judged); None keeps everything."""
    num_devices: int | None = None
    """Local devices a stream's envs are split over; None uses all."""
    part: str | None = None
    """`I/N`: write only streams I, I + N, ... and stop (for SLURM job arrays, whose tasks need
    not run at once); then the same command without --part checks every stream and writes the
    manifest. Not with jax.distributed (which splits the work itself)."""
    resume_seconds: float = 30.0
    """Save a resume point (device carry and the rows still waiting) at most this often: a
    killed run redoes at most this much work (0: after every block)."""
    cuda_graphs: CudaGraphs = "loops"

    @property
    def envs_per_stream(self) -> int:
        return self.num_envs // self.streams


@dataclasses.dataclass(frozen=True)
class LabelLLMConfig(LLMConfig):
    """train.py's --llm.* options; imagination is label.py's own --imagine.* here."""

    imagine: tyro.conf.Suppress[ImagineConfig] = ImagineConfig()


@dataclasses.dataclass(frozen=True)
class LabelImagine(ImagineConfig):
    """Imagination labels (train.py's --llm.imagine.*), and whether to keep the text."""

    keep_text: bool = False
    """Also store each state's generated tokens and their text (columns `imagined`,
    `imagined_len`, `imagined_text`: UTF-8 bytes) for inspection."""


@dataclasses.dataclass(frozen=True)
class LabelConfig:
    data: str
    """Dataset folder (written by `label.py generate`)."""
    name: str = "hidden"
    """Name of the label set (a folder under labels/): several can live side by side."""
    llm: LabelLLMConfig = LabelLLMConfig(backend="jax")
    """The LLM, prompt and hidden state: the same options as train.py's --llm.*. --llm.skip-n K
    labels the rows online training at skip K would encode (stream step % K == 0, and every
    episode start) and carries each label forward to the rows after it."""
    imagine: LabelImagine = LabelImagine()
    """Imagination labels: --imagine.tokens N pools the states of N tokens the LLM generates
    about each state (--imagine.pool mean|last|every:K at --llm.layer)."""
    env_name: EnvName | None = None
    """Env the prompt describes; default the dataset's (another is an error: a prompt
    describes one game's observations)."""
    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    """Storage dtype of the hidden states."""
    batch: int = 64
    """Observations encoded per call (per process, split over its devices)."""
    overwrite: bool = False
    """Replace a label set of this name (default: an existing complete one is an error)."""
    num_devices: int | None = None
    """Local devices to split each batch over; None uses all."""
    part: str | None = None
    """`I/N`: label only shards I, I + N, ... and stop (SLURM job arrays); then the same command
    without --part labels what is missing and writes the manifest."""
    cuda_graphs: CudaGraphs = "loops"

    @property
    def model(self) -> LLMConfig:
        """The LLM settings as train.py's --llm.* would give them (imagination included)."""
        fields = {f.name: getattr(self.llm, f.name) for f in dataclasses.fields(LLMConfig)}
        im = {f.name: getattr(self.imagine, f.name) for f in dataclasses.fields(ImagineConfig)}
        return LLMConfig(**dict(fields, imagine=ImagineConfig(**im)))


@dataclasses.dataclass(frozen=True)
class ReturnsConfig:
    data: str
    """Dataset folder."""
    gamma: float = 0.99
    """Discount."""
    incomplete: Literal["exclude", "bootstrap"] = "exclude"
    """Episodes cut by the end of the data: `exclude` flags their rows (complete = False;
    loaders skip them), `bootstrap` ends them with the behaviour critic's stored value."""
    name: str | None = None
    """Name of the returns set (a folder under returns/); default `gamma<G>`."""
    overwrite: bool = False
    """Replace a returns set of this name."""

    @property
    def set_name(self) -> str:
        return self.name or f"gamma{self.gamma:g}"


GENERATE_PRESETS: dict[str, tuple[str, GenerateConfig]] = {
    "cpu": ("Default: Craftax-Classic-Symbolic, 64 envs x 1,024 steps (65k transitions).",
            GenerateConfig(out="", env=EnvSettings(name="Craftax-Classic-Symbolic-v1",
                                                   reset_pool=8))),
    "smoke": ("Seconds: 8 Classic envs x 64 steps, small shards (tests).",
              GenerateConfig(out="", env=EnvSettings(name="Craftax-Classic-Symbolic-v1",
                                                     reset_pool=2),
                             num_envs=8, steps=64, block_steps=16, shard_rows=128)),
    "symbolic": ("The prior system's shards: Craftax-Symbolic, 128 envs, 8,192-row shards.",
                 GenerateConfig(out="", num_envs=128, steps=64 * 128)),
}

def parse_part(part: str | None, processes: int) -> tuple[int, int] | None:
    """`I/N` -> (I, N), checked; None without --part."""
    if part is None:
        return None
    try:
        i, n = (int(x) for x in part.split("/"))
    except ValueError:
        raise ConfigError(f"part={part!r}: write it as I/N, e.g. 0/4") from None
    if not 0 <= i < n:
        raise ConfigError(f"part={part!r}: I must lie in 0..N-1")
    if processes > 1:
        raise ConfigError("part splits work between independent runs; under jax.distributed "
                          "(several processes) leave it out")
    return i, n


def validate_generate(c: GenerateConfig, num_devices: int = 1) -> None:
    if c.streams <= 0 or c.num_envs % c.streams:
        raise ConfigError(f"streams={c.streams} must be positive and divide num_envs={c.num_envs}")
    validate_env(c.env, c.envs_per_stream, num_devices, "num_envs / streams")
    parse_part(c.part, 1)
    if c.resume_seconds < 0:
        raise ConfigError(f"resume_seconds={c.resume_seconds} must be >= 0")
    for name, value in {"steps": c.steps, "block_steps": c.block_steps,
                        "shard_rows": c.shard_rows}.items():
        if value <= 0:
            raise ConfigError(f"{name}={value} must be positive")
    if not 0.0 <= c.epsilon <= 1.0:
        raise ConfigError(f"epsilon={c.epsilon} must lie in [0, 1]")
    if c.policy == "random" and (c.epsilon or c.checkpoint is not None):
        raise ConfigError("epsilon and checkpoint apply to a run folder's policy, not `random`")


def validate_label(c: LabelConfig, env_name: str, num_devices: int = 1) -> None:
    parse_part(c.part, 1)
    if c.part is not None and c.overwrite:
        raise ConfigError("overwrite with part: parts would delete each other's shards; run "
                          "once with --overwrite (no --part) or pick a new --name")
    if c.env_name is not None and c.env_name != env_name:
        raise ConfigError(f"env_name={c.env_name!r} but the dataset's env is {env_name!r}: the "
                          "prompt must describe the data's observations")
    if c.llm.skip_n <= 0:
        raise ConfigError(f"llm.skip_n={c.llm.skip_n}: labelling needs >= 1 (1 = every row)")
    if c.batch <= 0 or c.batch % num_devices:
        raise ConfigError(f"batch={c.batch} must be a positive multiple of the {num_devices} "
                          "devices in use")
    if not c.name or "/" in c.name or c.name.startswith("."):
        raise ConfigError(f"name={c.name!r} must be a plain folder name")
    validate_imagine(c.imagine, "imagine")
    validate_llm(c.model, env_name, c.batch // num_devices, num_devices, online=False)


def validate_returns(c: ReturnsConfig) -> None:
    if not 0.0 <= c.gamma <= 1.0:
        raise ConfigError(f"gamma={c.gamma} must lie in [0, 1]")
    if "/" in c.set_name or c.set_name.startswith("."):
        raise ConfigError(f"name={c.set_name!r} must be a plain folder name")
