"""The encoders there are, and the one place that picks among them.

`--llm.encoder auto` asks the registered kinds in order and takes the first that accepts the
settings: a Qwen3-VL folder reads frames (with imagination, or pooling its prompt), the vllm
backend asks a vLLM server, imagination tokens make the text encoder generate, and otherwise
the text encoder reads each observation against its cached prompt prefix. A kind named with
`--llm.encoder NAME` is taken as it is. `register` adds a kind (a user's own model that reads
the game): training, labelling, evaluation and the probes then use it with no other change.
"""

from __future__ import annotations

from typing import Callable

from fused.envspec import TEXT_ENVS, text_env
from fused.errors import ConfigError
from fused.llm.batching import gpu_kinds
from fused.llm.config import (LLMConfig, check_llm_memory, is_vl, model_config, sampling_of,
                              validate_imagine, validate_model)
from fused.llm.encoder import Encoder, EncoderKind
from fused.llm.text_encoder import ImaginingEncoder, TextEncoder
from fused.llm.vl import VLEncoder, VLImaginingEncoder, validate_vl
from fused.llm.vllm_host import HostEncoder
from llm_jax.memory import generation_need
from llm_jax.vl_config import VLConfig


class Kind:
    """An `EncoderKind` made of its parts: `build(cfg, env_name, seed, like)` makes the
    encoder, `accepts(cfg)` says whether `auto` picks it, `validate` checks its settings."""

    def __init__(self, name: str, build: Callable[..., Encoder],
                 accepts: Callable[[LLMConfig], bool],
                 validate: Callable[[LLMConfig, str, int, int, bool], None],
                 hidden_size: Callable[[LLMConfig], int], ablations: tuple[str, ...],
                 reads_frames: bool = False):
        self.name, self.build, self.accepts, self.validate = name, build, accepts, validate
        self.hidden_size, self.ablations, self.reads_frames = hidden_size, ablations, \
            reads_frames


def _text_hidden_size(cfg: LLMConfig) -> int:
    return model_config(cfg).hidden_size


def _vl_hidden_size(cfg: LLMConfig) -> int:
    return VLConfig.from_folder(cfg.folder).text.hidden_size


def _check_pool(cfg: LLMConfig) -> None:
    if cfg.pool not in ("last", "mean"):
        raise ConfigError(f"llm.pool={cfg.pool!r}: use last or mean (image-mean and every:K pool "
                          "a Qwen3-VL's image tokens, with --llm.weights VL_DIR on a pixel env)")


def _check_text(cfg: LLMConfig, env_name: str) -> int:
    """The text settings every text kind shares; returns the model's layer count."""
    _check_pool(cfg)
    if text_env(env_name) is None:
        raise ConfigError(f"--llm needs a text renderer; env.name={env_name!r} has none "
                          f"(use one of {', '.join(TEXT_ENVS)} or their pixel envs)")
    q = model_config(cfg)
    if cfg.layer is not None and cfg.layer > q.num_layers:
        raise ConfigError(f"llm.layer={cfg.layer} but the model "
                          f"({cfg.weights or cfg.random_model}) has {q.num_layers} layers; pick "
                          f"0..{q.num_layers}")
    validate_imagine(cfg.imagine)
    return q.num_layers


def _validate_text(cfg: LLMConfig, env_name: str, local_envs: int, num_devices: int,
                   online: bool) -> None:
    layers = _check_text(cfg, env_name)
    validate_model(cfg)
    # the weights alone, before anything is built (the encoder adds caches and activations)
    check_llm_memory(cfg, generation_need(model_config(cfg), cfg.compute_dtype,
                                          layers if cfg.layer is None else cfg.layer),
                     generates=False)


def _validate_imagining(cfg: LLMConfig, env_name: str, local_envs: int, num_devices: int,
                        online: bool) -> None:
    layers = _check_text(cfg, env_name)
    validate_model(cfg)
    sampling_of(cfg.imagine, cfg, "--llm.imagine.")
    check_llm_memory(cfg, generation_need(model_config(cfg), cfg.compute_dtype, layers),
                     generates=True)


def _validate_host(cfg: LLMConfig, env_name: str, local_envs: int, num_devices: int,
                   online: bool) -> None:
    if cfg.layer is not None:
        raise ConfigError("llm.layer cannot be chosen with backend vllm (it serves the last "
                          "layer); truncate the checkpoint with `python -m llm_jax truncate`")
    if num_devices > 1:
        raise ConfigError("llm.backend vllm runs on one device; pass --num-devices 1")
    _check_text(cfg, env_name)
    if cfg.imagine.tokens:
        raise ConfigError("llm.imagine needs the jax backend (the vLLM fallback serves prompt "
                          "states only)")


def _validate_frames(cfg: LLMConfig, env_name: str, local_envs: int, num_devices: int,
                     online: bool) -> None:
    validate_vl(cfg, env_name, online)


KINDS: dict[str, EncoderKind] = {}


def register(kind: EncoderKind) -> None:
    """Add `kind` (after those there are: `auto` asks it last); a name taken is an error."""
    if kind.name in KINDS or kind.name == "auto":
        raise ValueError(f"an encoder kind named {kind.name!r} is registered already")
    KINDS[kind.name] = kind


for _kind in (
        Kind("vl-imagine", VLImaginingEncoder.create,
             lambda c: is_vl(c) and c.imagine.tokens > 0, _validate_frames, _vl_hidden_size,
             VLImaginingEncoder.ablations, reads_frames=True),
        Kind("vl", VLEncoder.create, is_vl, _validate_frames, _vl_hidden_size,
             VLEncoder.ablations, reads_frames=True),
        Kind("vllm", HostEncoder.create, lambda c: c.active_backend == "vllm", _validate_host,
             _text_hidden_size, HostEncoder.ablations),
        Kind("text-imagine", ImaginingEncoder.create, lambda c: c.imagine.tokens > 0,
             _validate_imagining, _text_hidden_size, ImaginingEncoder.ablations),
        Kind("text", TextEncoder.create, lambda c: True, _validate_text, _text_hidden_size,
             TextEncoder.ablations)):
    register(_kind)


def kind_of(cfg: LLMConfig) -> EncoderKind:
    """The kind that reads the game under `cfg` (`--llm.encoder`, `auto` asking each in
    order); an unknown name is a ConfigError listing the kinds there are."""
    if cfg.encoder != "auto":
        if cfg.encoder not in KINDS:
            raise ConfigError(f"llm.encoder={cfg.encoder!r} is not a registered encoder (there: "
                              f"auto, {', '.join(KINDS)})")
        return KINDS[cfg.encoder]
    return next(k for k in KINDS.values() if k.accepts(cfg))


def make_encoder(cfg: LLMConfig, env_name: str, seed: int = 0,
                 like: Encoder | None = None) -> Encoder:
    """Host setup of the encoder of `cfg` (checked by `validate_llm`): problems a model brings
    (too few layers, a prompt past its context, a foreign vocabulary, memory) are ConfigErrors
    naming the field, raised before anything compiles. `seed`: a random model's weights;
    `like`: an encoder of the same model already built, whose weights an ablation shares."""
    kind = kind_of(cfg)
    if cfg.hidden not in kind.ablations:
        raise ConfigError(f"llm.hidden={cfg.hidden} is not built for the {kind.name} encoder; "
                          f"use {' or '.join(kind.ablations)}")
    return kind.build(cfg, env_name, seed, like)


def validate_llm(m: LLMConfig, env_name: str, local_envs: int, num_devices: int = 1,
                 online: bool = True) -> None:
    """The --llm.* checks, the encoder's own among them (a model's config.json is read,
    nothing loaded). `online`: a policy acts on the states (else a label set is made)."""
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
    lengths = m.encode_lengths
    if lengths and (min(lengths) <= 0 or list(lengths) != sorted(set(lengths))):
        raise ConfigError(f"llm.encode_lengths={' '.join(map(str, lengths))}: ascending positive "
                          "token counts, e.g. 512 or 256 512 (none for the default)")
    gpu_kinds(m.device_costs)  # (a missing or malformed file: one line)
    if m.layer is not None and m.layer < 0:
        raise ConfigError(f"llm.layer={m.layer} must be >= 0 (0 = embeddings) or None")
    if m.backend == "vllm" and m.weights is None:
        raise ConfigError("llm.backend vllm needs --llm.weights: the model folder the server "
                          "serves (its tokenizer and config.json are read here)")
    if m.active_backend == "none":
        if m.encoder != "auto":
            raise ConfigError(f"llm.encoder={m.encoder!r} without an LLM: pass --llm.backend "
                              "jax (or --llm.weights)")
        return
    kind = kind_of(m)
    kind.validate(m, env_name, local_envs, num_devices, online)
    if m.microbatch and local_envs % m.microbatch:
        raise ConfigError(f"llm.microbatch={m.microbatch} must divide the {local_envs} envs per "
                          "device")
