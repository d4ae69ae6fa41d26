"""Qwen3 (dense and mixture-of-experts) in JAX: config, typed weights and safetensors loader,
offline tokenizer, hidden-state API with prefix cache, text generation.

Jit-friendly pieces (`encode`, `prefill`, `generate`) are pure functions; the loader, tokenizer and vLLM
client are host-only and never called under jit.
"""

from llm_jax.config import Qwen3Config, Qwen3ConfigError
from llm_jax.loader import WeightsError, load_params
from llm_jax.decode import Generated, GenerateSpec, check_generate, generate
from llm_jax.sampling import GREEDY, GenerateError, Sampling, SamplingFlags, resolve_sampling
from llm_jax.model import AttentionConfig, PrefixCache, encode, prefill
from llm_jax.weights import (Attention, DenseMLP, Layer, MoE, Stacked, Weights, first_layers,
                             init_params)

__all__ = ["Qwen3Config", "Qwen3ConfigError", "WeightsError", "load_params", "AttentionConfig",
           "PrefixCache", "encode", "first_layers", "init_params", "prefill", "generate",
           "Generated", "GenerateSpec", "Sampling", "GREEDY", "GenerateError", "check_generate",
           "SamplingFlags", "resolve_sampling", "Weights", "Layer", "Stacked", "Attention",
           "DenseMLP", "MoE"]
