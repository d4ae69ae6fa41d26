"""Shared test setup: two virtual CPU devices (for the sharding tests), a persistent compilation
cache, and session-scoped compiled trainers so each config compiles once per run."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".jax_cache"))
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=2").strip()
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402

jax.config.update("jax_compilation_cache_dir", CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


def subprocess_env() -> dict:
    """Environment for child processes: same cache, repo importable, one CPU device."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_COMPILATION_CACHE_DIR=CACHE)
    env["XLA_FLAGS"] = env["XLA_FLAGS"].replace("--xla_force_host_platform_device_count=2", "")
    return env
