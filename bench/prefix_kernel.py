"""The Pallas shared-prefix attention kernel (`kernels.prefix_attention`) compiled for this
device, against its plain-jnp reference and llm_jax's other attention forms, on the fused loop's
shapes: B rows of T suffix tokens after one P-token prefix, Qwen3-4B heads (32 query heads, 8 kv
heads of 128), bf16. `python bench/prefix_kernel.py --out F.json` (a GPU session; on a CPU the
kernel only runs interpreted, `--interpret`, for a smoke run at small sizes).

Rows (JSON, one a line): name (kernel | form | machine), rows, suffix, prefix, block_q / block_k
(kernel rows), form (form rows: reference, blocked, cudnn), seconds (median of `--repeats` timed
calls after a warm-up), tflops (the useful attention FLOPs: 4 x D x heads per visible key of each
valid query), rel_err (||out - ref|| / ||ref|| over the valid queries, against the reference
computed in float32 from the same bf16 inputs; fresh random inputs for every case) and
compile_s. Every output element is checked to be finite and padding queries to be zero.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


@dataclasses.dataclass(frozen=True)
class Args:
    rows: tuple[int, ...] = (32, 128)
    """Batch rows (envs refreshed in one call)."""
    suffixes: tuple[int, ...] = (32, 256)
    """Tokens of each row after the prefix."""
    prefix: int = 1024
    """Shared prefix tokens."""
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    blocks: tuple[str, ...] = ("32x64", "64x64", "64x128")
    """Kernel block sizes to try, block_q x block_k."""
    forms: tuple[str, ...] = ("reference", "blocked", "cudnn")
    """llm_jax attention forms timed beside the kernel (cudnn needs a GPU)."""
    repeats: int = 20
    interpret: bool = False
    """Run the kernel through Pallas' interpreter (CPU smoke runs)."""
    out: str | None = None


def inputs(b, t, args, seed):
    import jax
    import jax.numpy as jnp

    ks = jax.random.split(jax.random.PRNGKey(seed), 5)
    n, kh, d, p = args.heads, args.kv_heads, args.head_dim, args.prefix
    bf = jnp.bfloat16
    q = jax.random.normal(ks[0], (b, t, n, d)).astype(bf)
    k = jax.random.normal(ks[1], (b, t, kh, d)).astype(bf)
    v = jax.random.normal(ks[2], (b, t, kh, d)).astype(bf)
    pk = jax.random.normal(ks[3], (p, kh, d)).astype(bf)
    pv = jax.random.normal(ks[4], (p, kh, d)).astype(bf)
    # ragged lengths: full rows, a one-token row, the rest spread over 1..t
    lengths = np.maximum(1, (t * (np.arange(b) + 1)) // b).astype(np.int32)
    lengths[0], lengths[-1] = 1, t
    return q, k, v, jnp.asarray(lengths), pk, pv


def flops(lengths, args) -> float:
    """4 x D x heads per (valid query, visible key): each query t sees P + t + 1 keys."""
    ell = np.asarray(lengths, np.float64)
    keys = (ell * args.prefix + ell * (ell + 1) / 2).sum()
    return 4.0 * args.head_dim * args.heads * keys


def timed(fn, repeats):
    """(output, median seconds of `repeats` calls after 3 warm ones, first call's seconds)."""
    import jax
    from llm_encode import median_time

    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    compile_s = time.perf_counter() - t0
    call = lambda: jax.block_until_ready(fn())  # noqa: E731
    for _ in range(3):
        call()
    return out, median_time(call, repeats), compile_s


def error(out, ref, lengths) -> dict:
    out, ref = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    valid = np.arange(out.shape[1])[None, :] < np.asarray(lengths)[:, None]
    diff = (out - ref)[valid]
    return {"rel_err": float(np.linalg.norm(diff) / np.linalg.norm(ref[valid])),
            "finite": bool(np.isfinite(out).all()),
            "padding_zero": bool(not out[~valid].any())}


def run(args: Args, emit) -> None:
    import jax
    import jax.numpy as jnp

    from kernels import prefix_attention, prefix_attention_reference
    from llm_jax.model import AttentionConfig, attention

    emit({"name": "machine", "backend": jax.default_backend(), "devices": str(jax.devices())})
    ref_fn = jax.jit(prefix_attention_reference)
    seed = 0
    for b in args.rows:
        for t in args.suffixes:
            seed += 1
            q, k, v, lengths, pk, pv = inputs(b, t, args, seed)
            ref = ref_fn(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
                         lengths, pk.astype(jnp.float32), pv.astype(jnp.float32))
            base = {"rows": b, "suffix": t, "prefix": args.prefix, "heads": args.heads,
                    "kv_heads": args.kv_heads, "head_dim": args.head_dim, "dtype": "bfloat16",
                    "gflop": flops(lengths, args) / 1e9}
            for blk in args.blocks:
                bq, bk = (int(x) for x in blk.split("x"))
                fn = jax.jit(lambda *a, bq=bq, bk=bk: prefix_attention(
                    *a, block_q=bq, block_k=bk, interpret=args.interpret))
                try:
                    out, dt, c = timed(lambda: fn(q, k, v, lengths, pk, pv), args.repeats)
                except Exception as e:  # a block shape the backend rejects: say so, go on
                    emit(dict(base, name="kernel", block_q=bq, block_k=bk,
                              error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"))
                    continue
                emit(dict(base, name="kernel", block_q=bq, block_k=bk, seconds=dt,
                          tflops=base["gflop"] / dt / 1e3, compile_s=c,
                          **error(out, ref, lengths)))
            mask = (jnp.arange(t)[None, :, None] >= jnp.arange(t)[None, None, :]) & (
                jnp.arange(t)[None, None, :] < lengths[:, None, None])
            for form in args.forms:
                if form == "reference":
                    fn = jax.jit(prefix_attention_reference)
                    call = lambda fn=fn: fn(q, k, v, lengths, pk, pv)  # noqa: E731
                else:
                    cfg = AttentionConfig(form)
                    fn = jax.jit(lambda *a, cfg=cfg: attention(*a, cfg))
                    call = lambda fn=fn: fn(q, k, v, mask, lengths, pk, pv)  # noqa: E731
                try:
                    out, dt, c = timed(call, args.repeats)
                except Exception as e:
                    emit(dict(base, name="form", form=form,
                              error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"))
                    continue
                emit(dict(base, name="form", form=form, seconds=dt,
                          tflops=base["gflop"] / dt / 1e3, compile_s=c,
                          **error(out, ref, lengths)))


def main(args: Args):
    from llm_encode import run_rows

    rows = run_rows(args.out, lambda emit: run(args, emit))
    print(f"{'rows':>5} {'T':>4} {'what':>14} {'ms':>8} {'TFLOP/s':>8} {'rel_err':>8}")
    for r in rows:
        if "seconds" in r:
            what = (f"kernel {r['block_q']}x{r['block_k']}" if r["name"] == "kernel"
                    else r["form"])
            print(f"{r['rows']:>5} {r['suffix']:>4} {what:>14} {r['seconds'] * 1e3:>8.3f} "
                  f"{r['tflops']:>8.1f} {r['rel_err']:>8.1e}")


if __name__ == "__main__":
    main(tyro.cli(Args))
