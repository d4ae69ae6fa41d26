"""Qwen3 in JAX: config, safetensors loader, offline tokenizer, hidden-state API with prefix cache.

Jit-friendly pieces (`encode`, `prefill`) are pure functions; the loader, tokenizer and vLLM
client are host-only and never called under jit.
"""

from llm_jax.config import Qwen3Config, Qwen3ConfigError
from llm_jax.loader import WeightsError, load_params
from llm_jax.model import AttentionConfig, PrefixCache, encode, init_params, prefill

__all__ = ["Qwen3Config", "Qwen3ConfigError", "WeightsError", "load_params", "AttentionConfig",
           "PrefixCache", "encode", "init_params", "prefill"]
