"""A Qwen3's weights for the code that runs it here: read from --llm.weights, or a random model
of the configured shape, after the memory check."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp

from fused.errors import ConfigError
from fused.llm.config import LLMConfig, ModelConfig, check_llm_memory
from llm_jax.config import Qwen3Config
from llm_jax.loader import WeightsError, load_params
from llm_jax.weights import Weights, random_params

log = logging.getLogger(__name__)


def same_weights(a: LLMConfig, b: LLMConfig) -> bool:
    """Two --llm.* settings that read the same (truncated) weights in the same dtype."""
    return ((a.weights, a.random_model, a.compute_dtype, a.layer, a.imagine.tokens > 0)
            == (b.weights, b.random_model, b.compute_dtype, b.layer, b.imagine.tokens > 0))


def load_llm_params(model: ModelConfig, qcfg: Qwen3Config, need: dict[str, int],
                    generates: bool, seed: int = 0, layers: int | None = None) -> Weights:
    """The model's weights in its dtype, its first `layers` layers (default all): read from
    --llm.weights, or the random model of `qcfg`'s shape made from `seed` (with a notice that
    its outputs mean nothing). Before anything is made or read, `need` (every device byte of
    the job: `llm_jax.memory.generation_need`) is checked against the device's memory: a
    ConfigError naming the figures and the fix when they do not fit."""
    check_llm_memory(model, need, generates)
    return make_or_read(model, qcfg, seed, layers, per_layer=generates)


def make_or_read(model: ModelConfig, qcfg: Qwen3Config, seed: int, layers: int | None,
                 per_layer: bool = False) -> Weights:
    """The weights, stacked by layer (`lax.scan` over them: encoding), or with `per_layer` one
    set of arrays per layer (`llm_jax.weights.per_layer`: the decode loop's layout)."""
    dtype = jnp.dtype(model.compute_dtype)
    if model.weights is None:
        log.info(f"notice: --llm.weights not given: using a RANDOM Qwen3 ({model.random_model}: "
                 f"{qcfg.num_layers} layers, hidden {qcfg.hidden_size}); its outputs carry no "
                 "meaning (for tests and speed only)")

        return random_params(qcfg, jax.random.PRNGKey(seed), dtype, layers, per_layer)
    try:
        return load_params(model.weights, dtype, layers, per_layer=per_layer)[1]
    except WeightsError as e:
        raise ConfigError(f"llm.weights={model.weights!r}: {e}") from None
