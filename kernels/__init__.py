"""Pallas kernels, each beside the plain-jnp reference it is tested against. Imports neither
llm_jax nor fused."""

from kernels.grouped_matmul import grouped_matmul, grouped_matmul_reference
from kernels.prefix_attention import prefix_attention, prefix_attention_reference

__all__ = ["grouped_matmul", "grouped_matmul_reference", "prefix_attention",
           "prefix_attention_reference"]
