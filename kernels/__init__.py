"""Pallas kernels, each beside the plain-jnp reference it is tested against. Imports neither
llm_jax nor fused."""

from kernels.prefix_attention import prefix_attention, prefix_attention_reference

__all__ = ["prefix_attention", "prefix_attention_reference"]
