"""label.py throughput in one process: `python bench/label_sps.py --out F.json [--vllm]`.

Rows:
- `env_no_reset`, `env_optimistic`, `env_auto`: the env-only rows of bench/ppo_sps.py (same env
  count, same process): `env_no_reset` is the ceiling, `env_optimistic` the env with the resets
  generation really does;
- `generate`: env steps written per second by the whole `label.py generate` call (random policy;
  tracing, rollout, host assembly of episodes, zstd zarr shards, commits, resume points, the
  manifest), timed on a second dataset after a first one filled the compilation cache;
- `label_jax` / `label_vllm`: observations labelled per second by `label.py label` at skip 1,
  the in-jit path vs the vLLM fallback (host text + HTTP), the same tiny random Qwen3 checkpoint
  (written with HF transformers; needs the test extras), the jax side after a warm-up pass that
  compiled it (the vLLM server has answered its health check before).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from fused.commands.process import setup_compilation_cache  # noqa: E402
from fused.runs.files import atomic_write_json  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Args:
    out: str | None = None
    """Write the rows here as JSON."""
    env: str = "Craftax-Classic-Symbolic-v1"
    """Environment."""
    num_envs: int = 64
    """Envs for generation (and the env-only row)."""
    steps: int = 4096
    """Env steps per env of the timed dataset."""
    label_rows: int = 1024
    """Rows labelled per timed pass (the jax and vllm passes label the same rows)."""
    vllm: bool = False
    """Also time the vLLM fallback (starts a server from scripts/vllm_server.sh)."""


def emit(rows: list, row: dict) -> None:
    rows.append(row)
    print(json.dumps(row), flush=True)


def main(a: Args) -> list[dict]:
    import shutil

    from rich.console import Console

    from fused.llm.config import LLMConfig
    from fused.rl.config import EnvSettings
    from fused.data.config import GenerateConfig, LabelConfig
    from fused.data.generate import generate
    from fused.data.labelling import label
    from ppo_sps import Args as PPOArgs, env_rows

    setup_compilation_cache()
    quiet = Console(quiet=True)
    rows: list[dict] = []
    ceiling = env_rows(PPOArgs(env=a.env, env_counts=(a.num_envs,), reset_pool=8))
    for row in ceiling:
        emit(rows, row)
    tmp = Path(tempfile.mkdtemp(prefix="label-bench-"))
    gen = GenerateConfig(out=str(tmp / "warm"), env=EnvSettings(name=a.env, reset_pool=8),
                         num_envs=a.num_envs, steps=a.steps)
    generate(dataclasses.replace(gen, steps=gen.block_steps * 2), quiet)  # compiles
    t = time.perf_counter()
    ds = generate(dataclasses.replace(gen, out=str(tmp / "timed"), seed=1), quiet)
    dt = time.perf_counter() - t
    sps = a.num_envs * a.steps / dt
    emit(rows, {"name": "generate", "env": a.env, "num_envs": a.num_envs, "steps": a.steps,
                "steps_per_s": sps, "seconds": dt,
                "vs_env_no_reset": sps / ceiling[0]["steps_per_s"],
                "vs_env_optimistic": sps / ceiling[1]["steps_per_s"], "bytes_on_disk": sum(
                    p.stat().st_size for p in (ds.root / "shards").rglob("*") if p.is_file())})
    # Labelling: a small dataset of `label_rows` rows to keep the vLLM side short.
    small = GenerateConfig(out=str(tmp / "small"), env=EnvSettings(name=a.env, reset_pool=8),
                           num_envs=16, steps=a.label_rows // 16, shard_rows=a.label_rows)
    generate(small, quiet)
    weights = tmp / "tiny-qwen3"
    from fused_sps import build_checkpoint

    build_checkpoint(weights)
    backends = {"jax": LLMConfig(backend="jax", weights=str(weights), post_norm=True,
                                 skip_n=1)}
    proc = None
    if a.vllm:
        from llm_jax.vllm_client import launch_server

        proc, client = launch_server(ROOT / "scripts/vllm_server.sh", weights,
                                     8600 + os.getpid() % 300)
        backends["vllm"] = LLMConfig(backend="vllm", weights=str(weights), url=client.url,
                                     skip_n=1)
    try:
        for name, llm in backends.items():
            cfg = LabelConfig(data=small.out, name=name, llm=llm, batch=64, overwrite=True)
            if name == "jax":
                label(cfg, quiet)  # warm-up: compiles (the vLLM server is warm already)
            t = time.perf_counter()
            label(cfg, quiet)
            dt = time.perf_counter() - t
            emit(rows, {"name": f"label_{name}", "env": a.env, "states": a.label_rows,
                        "states_per_s": a.label_rows / dt, "seconds": dt, "model": "tiny h128 x2",
                        "batch": 64})
    finally:
        if proc is not None:
            os.killpg(proc.pid, 15)
    if a.vllm:
        rows[-2]["vs_vllm"] = rows[-2]["states_per_s"] / rows[-1]["states_per_s"]
        print(f"label jax / vllm = {rows[-2]['vs_vllm']:.1f}x", flush=True)
    import jax

    emit(rows, {"name": "machine", "devices": str(jax.devices()), "cpu_count": os.cpu_count()})
    shutil.rmtree(tmp, ignore_errors=True)
    if a.out:
        atomic_write_json(a.out, rows)
    return rows


if __name__ == "__main__":
    main(tyro.cli(Args))
