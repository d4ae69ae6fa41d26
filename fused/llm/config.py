"""The --llm.* settings: which Qwen3, which layer and pooling, how often it is called, the
ablations; their checks (the model's config.json is read, nothing loaded) and the built-in tiny
random model."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Literal

import jax

from fused.errors import ConfigError
from llm_jax.config import Qwen3Config, Qwen3ConfigError, resolve_dtype
from llm_jax.loader import WeightsError, check_weights, resolve_folder
from llm_jax.memory import MemoryFitError, check_fits, fixes
from llm_jax.model import AttentionForm
from llm_jax.sampling import GenerateError, Resolved, SamplingFlags, check_flags, resolve_sampling
from llm_jax.tokenizer import Qwen3Tokenizer, TokenizerError, load_tokenizer

log = logging.getLogger(__name__)

# The built-in tiny random Qwen3 (real vocabulary so real prompt tokens embed): no meaning;
# its mixture-of-experts sibling: layer 0 dense (mlp_only_layers), layer 1 8 experts, top 2.
TINY = Qwen3Config.shape("qwen3-tiny")
TINY_MOE = Qwen3Config.shape("qwen3-tiny-moe")
RANDOM_MODELS = {"tiny": TINY, "tiny-moe": TINY_MOE}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Which Qwen3 (weights or a random one) and how it computes."""

    weights: str | None = None
    """HuggingFace Qwen3 folder or hub id, dense or mixture-of-experts (`qwen3_moe`); None uses
    a built-in RANDOM Qwen3 (see --llm.random-model) whose outputs carry no meaning (for tests
    and speed measurements)."""
    random_model: Literal["tiny", "tiny-moe", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b",
                          "qwen3-8b", "qwen3-30b-a3b"] = "tiny"
    """Shape of the random Qwen3 used when --llm.weights is not given: the built-in tiny one
    (tiny-moe: a dense layer, then a layer of 8 experts, top 2), or a released size's architecture
    with random weights (speed and memory measurements; qwen3-30b-a3b: 48 layers of 128
    experts, top 8, ~61 GB in bfloat16)."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """LLM compute dtype (jax backend): auto is float32 on CPU and on a GPU/TPU the checkpoint's
    own (bfloat16 for Qwen3 and the random models), as HF's torch_dtype=auto and vLLM's
    dtype=auto; or float32 / bfloat16."""
    attention: AttentionForm = "auto"
    """Attention form (jax backend): auto (row by row on CPU; on an NVIDIA GPU in bf16/fp16 the
    Pallas kernel after the prompt prefix and cuDNN for causal calls; blocked otherwise), or one
    of cudnn / blocked / row / pallas; all compute the same function."""

    @property
    def folder(self):
        """The weights' local folder (a hub id resolved from the local cache), or None."""
        if self.weights is None:
            return None
        try:
            return resolve_folder(self.weights)
        except WeightsError as e:
            raise ConfigError(f"llm.weights={self.weights!r}: {e}") from None

    @property
    def compute_dtype(self) -> str:
        """float32 or bfloat16: --llm.dtype, `auto` resolved for this process's device."""
        return resolve_dtype(self.dtype, self.folder, jax.default_backend())[0]


@dataclasses.dataclass(frozen=True)
class ImagineConfig(SamplingFlags):
    """Imagination: the hidden state is pooled over tokens the LLM generates about the state
    (after the prompt), not read at the prompt's last token. Sampling: the checkpoint's
    generation_config.json unless a flag says otherwise; greedy where it has none."""

    tokens: int = 0
    """Tokens generated per state (0: no imagination, the prompt's state as usual). A reply
    may stop earlier, at the end-of-turn token."""
    pool: str = "mean"
    """Pooling over the generated tokens' states at --llm.layer: `mean`, `last`, or `every:K`
    (the mean over generated tokens 0, K, 2K, ...)."""
    prompt: str | None = None
    """File whose text replaces the prompt's instruction (default: imagine the next steps)."""
    seed: int = 0
    """Seed of the sampling (each state's draws depend on it and the state's row or env)."""
    thinking: bool = False
    """Leave Qwen3's thinking on (the generation starts inside <think>)."""

    @property
    def every(self) -> int | None:
        """K of `every:K` (1 for mean and last; None for a pool no rule knows)."""
        return pool_every(self.pool)


def pool_every(pool: str) -> int | None:
    """The one reading of an imagination pool: `mean` and `last` -> 1, `every:K` -> K (K >= 1),
    anything else -> None."""
    if pool in ("mean", "last"):
        return 1
    k = pool.removeprefix("every:")
    return int(k) if pool.startswith("every:") and k.isdigit() and int(k) >= 1 else None


def validate_imagine(im: ImagineConfig, field: str = "llm.imagine") -> None:
    if im.tokens < 0:
        raise ConfigError(f"{field}.tokens={im.tokens} must be >= 0 (0: no imagination)")
    if not im.tokens:
        return
    if im.every is None:
        raise ConfigError(f"{field}.pool={im.pool!r}: use mean, last or every:K (K >= 1)")
    if im.prompt is not None:
        path = Path(im.prompt).expanduser()
        if not path.is_file() or not path.read_text().strip():
            raise ConfigError(f"{field}.prompt={im.prompt!r} is not a file with text in it")
    try:
        check_flags(im, f"--{field.replace('_', '-')}.")
    except GenerateError as e:
        raise ConfigError(str(e)) from None


def sampling_of(flags: SamplingFlags, model: ModelConfig, prefix: str = "--") -> Resolved:
    """The sampling the flags and the model's generation_config.json give (ConfigError: one
    line)."""
    try:
        return resolve_sampling(flags, model.folder, prefix)
    except GenerateError as e:
        raise ConfigError(str(e)) from None


@dataclasses.dataclass(frozen=True)
class LLMConfig(ModelConfig):
    """The model (`ModelConfig`), then how its hidden state augments the policy."""

    backend: Literal["none", "jax", "vllm"] = "none"
    """`none`: plain PPO. `jax`: the Flax Qwen3 runs inside the jitted chunk (render -> encode
    against the cached prompt prefix). `vllm`: observations go to the host every call, are
    rendered there and sent to the vLLM server at --llm.url (the prior architecture, for parity
    and comparison). Giving --llm.weights with backend none means jax."""
    url: str = "http://127.0.0.1:8000"
    """vLLM server (backend vllm)."""
    layer: int | None = None
    """Hidden state after this many layers (HF convention, 0 = embeddings); None = the last.
    Later layers are not computed. The vllm backend serves only the last layer (truncate the
    checkpoint with `python -m llm_jax truncate` for another)."""
    pool: str = "last"
    """last (the last prompt token) or mean (over the observation and instruction tokens);
    a Qwen3-VL reading frames also image-mean or every:K (the mean of every K-th image token:
    the prior system's every:8)."""
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
    device_costs: str = ""
    """A JSON file of GPU cost models by kind (docs/gpu/device_costs.json: data-sheet and
    measured figures) that sizes the calls above on a GPU it names; empty: every GPU is costed
    as the generic one (`fused.llm.batching`)."""
    hidden: Literal["real", "zero", "shuffle", "garbage-prompt"] = "real"
    """Ablation: the real hidden state, zeros, hidden states shuffled across envs at each call,
    or states of a prompt whose prefix tokens are shuffled into nonsense."""
    normalize: bool = True
    """Normalise hidden states by running mean/std (saved in checkpoints) before the policy."""
    projection: Literal["dense", "layernorm"] = "dense"
    """Policy's hidden-state branch: Dense+tanh (prior), or LayerNorm then Dense+tanh."""
    imagine: ImagineConfig = ImagineConfig()
    """Imagination: pool the states of tokens the LLM generates (jax backend)."""
    encode_lengths: tuple[int, ...] = ()
    """Padded token lengths of the text encoder's calls below the prompt's bound, ascending
    (e.g. 512, or 256 512); empty: steps of 64 up to 512, then doubling (`fused.text.buckets`).
    Each length is compiled at every call site of a fused program: fewer compile faster and pad
    more. The states are the same up to float rounding; runs and label cards record the value,
    so a resume encodes as the run did. (Imagination pads its prompts to its own three lengths.)"""
    encoder: str = "auto"
    """Which encoder reads the game (`fused.llm.encoders`): auto picks by the settings (a
    Qwen3-VL folder reads frames, backend vllm asks the server, imagination tokens generate,
    else the text encoder with its cached prompt prefix), or a registered encoder's name."""

    @property
    def constant_hidden(self) -> bool:
        """The policy sees the same hidden state for every env: the LLM is never called."""
        return self.skip_n == 0 or self.hidden == "zero"

    @property
    def pooled(self) -> str:
        """What the hidden state pools: `last` / `mean` over the prompt, `imagine:<pool>` over
        generated tokens (label cards record it)."""
        return f"imagine:{self.imagine.pool}" if self.imagine.tokens else self.pool

    @property
    def active_backend(self) -> str:
        return "jax" if self.backend == "none" and self.weights is not None else self.backend



def validate_model(m: ModelConfig) -> None:
    """The weights folder holds safetensors (config.json was read by `model_config`) and a
    tokenizer with its chat template."""
    if m.weights is not None:
        try:
            check_weights(resolve_folder(m.weights))
        except WeightsError as e:
            raise ConfigError(f"llm.weights={m.weights!r}: {e}") from None
    tokenizer_of(m.weights)


def tokenizer_of(weights: str | None) -> Qwen3Tokenizer:
    """The model folder's tokenizer (None: the packaged Qwen3 one) with its chat template; a
    missing or damaged file is a ConfigError naming it."""
    try:
        tok = load_tokenizer(weights)
        tok.require_chat_template()
    except (TokenizerError, WeightsError) as e:
        raise ConfigError(f"llm.weights={weights!r}: {e}") from None
    return tok


def check_llm_memory(model: ModelConfig, need: dict[str, int], generates: bool) -> float:
    """ConfigError (one line: every figure and the flags that help) unless `need` (from
    `llm_jax.memory.generation_need`) fits this process's first device; logs the estimate;
    returns the bytes left over. `generates`: every layer is read whatever --llm.layer says."""
    name = model.weights or f"random {model.random_model}"
    dtype = model.compute_dtype
    try:
        left, line = check_fits(need, fixes(dtype, "--llm.dtype",
                                            None if generates else "--llm.layer",
                                            "--llm.microbatch, --llm.refresh-batch"))
    except MemoryFitError as e:
        raise ConfigError(f"llm.weights={name!r} ({dtype}): {e}") from None
    log.info(f"{name} ({dtype}) {line}")
    return left


def is_vl(m: ModelConfig) -> bool:
    """--llm.weights is a Qwen3-VL checkpoint (config.json with a vision part)."""
    try:
        folder = m.folder
    except ConfigError:
        return False
    try:
        return folder is not None and "vision_config" in json.loads(
            (folder / "config.json").read_text())
    except (OSError, ValueError):
        return False


def model_config(m: ModelConfig) -> Qwen3Config:
    """The Qwen3 architecture --llm.* names: the weights folder's config.json, or the random
    model's shape. A folder that is not a Qwen3 checkpoint is a ConfigError on llm.weights."""
    if m.weights is None:
        return RANDOM_MODELS.get(m.random_model) or Qwen3Config.shape(m.random_model)
    try:
        return Qwen3Config.from_folder(resolve_folder(m.weights))
    except (Qwen3ConfigError, WeightsError) as e:
        raise ConfigError(f"llm.weights={m.weights!r}: {e}") from None

