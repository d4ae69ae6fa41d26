"""Craftax's steps written for the compiler, equal to Craftax's bit for bit: few fused kernels,
no copies of the state (`make_craftax_env(name, "fast")`); `fused.envs.parity` steps two
implementations side by side and names the first field where they differ."""

from fused.envs.craftax_envs import IMPLS, Impl, has_fast_step, make_craftax_env

__all__ = ["IMPLS", "Impl", "has_fast_step", "make_craftax_env"]
