"""The Qwen3-VL frames encoder with and without its prefix cache (`VLEncoder(prefix_cache=True)`:
the 4 prompt tokens before the image computed once a call, the rows continuing them), the same
random-weight checkpoints as `bench/vl_encode.py`, Craftax-Classic frames, every:8 pooling, in
one process, timed in alternating rounds (median).

    python bench/vl_prefix_cache.py --out r.json

Rows: model, batch, frames_per_s with and without, ratio (without's time / with's: > 1 means
the cache pays), row_tokens of each, max_abs_diff of the pooled states.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from llm_encode import run_rows  # noqa: E402
from vl_encode import ENV, MODELS  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Args:
    models: tuple[str, ...] = ("tiny", "vl-100m")
    batches: tuple[int, ...] = (8, 64)
    rounds: int = 5
    out: str | None = None


def rows(args: Args, emit) -> None:
    import jax
    import jax.numpy as jnp

    from fused.llm.config import LLMConfig
    from fused.llm.vl import VLEncoder
    from qwen_fixtures import build_tiny_qwen3_vl

    for name in args.models:
        folder = Path(tempfile.mkdtemp(prefix=f"bench-vl-prefix-{name}-")) / name
        build_tiny_qwen3_vl(folder, vocab=151_680, seed=0, **MODELS[name])
        for b in args.batches:
            x = jax.random.uniform(jax.random.PRNGKey(1), (b, 63 * 63 * 3))
            runs = {}
            for cache in (True, False):
                enc = VLEncoder(LLMConfig(weights=str(folder), pool="every:8", dtype="float32"),
                                ENV, b, prefix_cache=cache)
                f = jax.jit(enc.fn)
                runs[cache] = (enc, f, f(enc.params, x).block_until_ready(), [])
            for _ in range(args.rounds):
                for enc, f, _, times in runs.values():
                    t0 = time.perf_counter()
                    f(enc.params, x).block_until_ready()
                    times.append(time.perf_counter() - t0)
            (e1, _, o1, t1), (e0, _, o0, t0_) = runs[True], runs[False]
            m1, m0 = statistics.median(t1), statistics.median(t0_)
            emit({"name": "vl_prefix_cache", "model": name, "batch": b,
                  "frames_per_s_with": b / m1, "frames_per_s_without": b / m0,
                  "ratio": m0 / m1, "row_tokens_with": e1.row_tokens,
                  "row_tokens_without": e0.row_tokens,
                  "max_abs_diff": float(jnp.abs(o1 - o0).max()), "rounds": args.rounds})


if __name__ == "__main__":
    a = tyro.cli(Args)
    run_rows(a.out, lambda emit: rows(a, emit))
