"""Prefill throughput: our JAX Qwen3 encoder vs HF transformers (torch) vs a vLLM server, same
random-weight model and prompts, plus prefix-cache scaling. `python bench/llm_encode.py --out F.json`

Rows: name (jax | hf_torch | vllm | jax_prefix | jax_full), model, params, batch, seq_len,
tokens_per_s, compile_s (jax only). Hidden state: last layer, post-norm, every position computed.
With `--shapes qwen3-0.6b qwen3-4b` (GPU sessions): ours only, released shapes with random bf16
weights, plus `mfu` against a bf16 matmul measured in the same process.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fused.commands.process import setup_compilation_cache  # noqa: E402
from fused.runs.files import atomic_write_json  # noqa: E402

MODELS = {
    # name: (hidden, layers, heads, kv_heads, head_dim, intermediate, vocab)
    "tiny-h64": (128, 2, 4, 2, 64, 264, 151_680),
    # 127M parameters in all (97M of them the embedding), named for the first sizing tried.
    "qwen3-134m": (640, 8, 10, 5, 64, 1288, 151_680),
}


@dataclasses.dataclass(frozen=True)
class Args:
    models: tuple[str, ...] = ("tiny-h64", "qwen3-134m")
    """Random-weight models to measure (see MODELS)."""
    batches: tuple[int, ...] = (1, 8)
    """Batch sizes."""
    lengths: tuple[int, ...] = (128, 512)
    """Sequence lengths (tokens per sequence)."""
    prefix_len: int = 1024
    """Prefix-cache rows: shared prefix length."""
    suffix_lengths: tuple[int, ...] = (16, 64, 256)
    """Prefix-cache rows: suffix lengths (batch 8)."""
    vllm: bool = True
    """Also measure a vLLM server (scripts/vllm_server.sh; skipped if it cannot start)."""
    repeats: int = 3
    """Timed repeats (median)."""
    out: str | None = None
    """JSON rows output."""
    shapes: tuple[str, ...] = ()
    """Released Qwen3 shapes (qwen3-0.6b, qwen3-4b, ...) with random weights made on the device,
    ours only (bf16), with MFU against a bf16 matmul measured here; replaces --models when given
    (for GPU sessions)."""
    forms: tuple[str, ...] = ("auto",)
    """--shapes rows: attention forms to time in turn (auto, or cudnn / blocked / row / pallas);
    each form's pooled states are compared with the first form's (rel_diff_vs_first_form)."""


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def interleaved(fns, repeats, settle_s=0.05):
    """Seconds of each of `fns` in each of `repeats` rounds that call every fn in turn. Before
    its timed call, each fn runs untimed for at least `settle_s`, so that no timing holds the
    previous fn's idle threads: torch's OpenMP threads spin ~20 ms after a call, and a JAX call
    just after a torch call was measured 1.7x slower (the next one 1.35x) than JAX alone."""
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t = time.perf_counter()
            while time.perf_counter() - t < settle_s:
                fn()
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return times


def build(name, folder):
    from qwen_fixtures import build_tiny_qwen3

    h, layers, heads, kv, hd, inter, vocab = MODELS[name]
    return build_tiny_qwen3(folder, hidden=h, layers=layers, heads=heads, kv_heads=kv,
                            head_dim=hd, vocab=vocab, intermediate=inter, tied=True)


def start_vllm(folder, port):
    """The project's launcher (llm_jax.vllm_client.launch_server); (None, None) if the server
    does not come up, so the vLLM rows are skipped with the reason printed."""
    from llm_jax.vllm_client import VLLMError, launch_server

    try:
        proc, client = launch_server(ROOT / "scripts/vllm_server.sh", folder, port)
    except VLLMError as e:
        print(f"vLLM rows skipped: {e}", file=sys.stderr, flush=True)
        return None, None
    client.timeout = 600  # a batch of 8 x 512 tokens on 2 cores takes a while
    return proc, client


def shape_rows(args: Args, emit) -> None:
    import jax

    from fused_sps import matmul_flops

    peak = matmul_flops("bfloat16")
    emit({"name": "machine", "devices": str(jax.devices()), "bf16_matmul_flops_per_s": peak})
    ref: dict = {}
    for form in args.forms:
        _shape_rows(args, emit, peak, ref, form)


def _shape_rows(args: Args, emit, peak, ref: dict, form: str) -> None:
    import jax
    import jax.numpy as jnp

    from llm_jax.config import Qwen3Config
    from llm_jax.model import AttentionConfig, encode, prefill, resolve_form
    from llm_jax.weights import random_params

    attn = AttentionConfig(form)

    def check(key, out):
        """Max |difference| of the pooled states from the first form's (same inputs), relative
        to the largest |state| of the first form."""
        out = np.asarray(out, np.float32)
        first = ref.setdefault(key, out)
        return float(np.abs(out - first).max() / np.abs(first).max())

    rng = np.random.default_rng(0)
    for name in args.shapes:
        cfg = Qwen3Config.shape(name)
        params = random_params(cfg, jax.random.PRNGKey(0), jnp.bfloat16)
        base = {"model": name, "params": cfg.num_params(), "dtype": "bfloat16",
                "attention": resolve_form(form, jnp.bfloat16)}
        fn = jax.jit(lambda p, x, n: encode(p, cfg, x, n, cfg.num_layers, "last", True,
                                            attn=attn))
        for b in args.batches:
            for t in args.lengths:
                tokens = rng.integers(0, 150_000, (b, t)).astype(np.int32)
                lengths = np.full(b, t, np.int32)
                t0 = time.perf_counter()
                out = jax.block_until_ready(fn(params, tokens, lengths))
                compile_s = time.perf_counter() - t0
                dt = median_time(lambda: jax.block_until_ready(fn(params, tokens, lengths)),
                                 args.repeats)
                emit(dict(base, name="jax", batch=b, seq_len=t, tokens_per_s=b * t / dt,
                          compile_s=compile_s, rel_diff_vs_first_form=check((name, b, t), out),
                          mfu=b * t * cfg.flops_per_token(cfg.num_layers, 0, t) / dt / peak))
        prefix = rng.integers(0, 150_000, args.prefix_len).astype(np.int32)
        cache = jax.jit(lambda p, x: prefill(p, cfg, x, attn=attn))(params, prefix)
        f_pre = jax.jit(lambda p, c, x, n: encode(p, cfg, x, n, cfg.num_layers, "last", True,
                                                  prefix=c, attn=attn))
        for b in args.batches:
            for s in args.suffix_lengths:
                suffix = rng.integers(0, 150_000, (b, s)).astype(np.int32)
                lens = np.full(b, s, np.int32)
                out = jax.block_until_ready(f_pre(params, cache, suffix, lens))
                dt = median_time(lambda: jax.block_until_ready(f_pre(params, cache, suffix, lens)),
                                 args.repeats)
                flops = b * s * cfg.flops_per_token(cfg.num_layers, args.prefix_len, s)
                emit(dict(base, name="jax_prefix", batch=b, seq_len=s, prefix_len=args.prefix_len,
                          attention=resolve_form(form, jnp.bfloat16, prefix=True),
                          seconds=dt, tokens_per_s=b * s / dt, mfu=flops / dt / peak,
                          rel_diff_vs_first_form=check((name, "prefix", b, s), out)))
        del params, cache


def run_rows(out: str | None, body) -> list[dict]:
    """A benchmark's rows: `body(emit)` emits each (printed as a JSON line as it comes); all of
    them are written to `out` at the end (the compilation cache on, as the commands have it)."""
    setup_compilation_cache()
    rows = []

    def emit(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    body(emit)
    if out:
        atomic_write_json(out, rows)
    return rows


def main(args: Args):
    run_rows(args.out, lambda emit: (shape_rows if args.shapes else cpu_rows)(args, emit))


def cpu_rows(args: Args, emit):
    import jax
    import torch

    from llm_jax.loader import load_params
    from llm_jax.model import encode, prefill

    torch.set_num_threads(os.cpu_count())
    rng = np.random.default_rng(0)
    for name in args.models:
        folder = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
        hf = build(name, folder)
        cfg, params = load_params(folder)
        n_params = cfg.num_params()
        base = {"model": name, "params": n_params,
                "non_embedding_params": n_params - cfg.vocab_size * cfg.hidden_size}
        cases = [(b, t, rng.integers(0, 150_000, (b, t)).astype(np.int32))
                 for b in args.batches for t in args.lengths]
        fn = jax.jit(lambda p, x, n: encode(p, cfg, x, n, cfg.num_layers, "none", True))
        # JAX and HF first, with no server running: an idle vLLM CPU server still takes cycles.
        # Timed in alternating rounds (JAX, HF, JAX, HF, ...) so that a slow spell of this noisy
        # machine hits both sides, each timed call after untimed ones of its own (`interleaved`);
        # vs_hf is the median over rounds of HF's time / ours.
        for b, t, tokens in cases:
            lengths = np.full(b, t, np.int32)
            ids = torch.tensor(tokens, dtype=torch.long)
            t0 = time.perf_counter()
            jax.block_until_ready(fn(params, tokens, lengths))
            compile_s = time.perf_counter() - t0
            with torch.no_grad():
                hf.model(input_ids=ids)
                ours, theirs = interleaved(
                    [lambda: jax.block_until_ready(fn(params, tokens, lengths)),
                     lambda: hf.model(input_ids=ids)], args.repeats)
            emit(dict(base, name="jax", batch=b, seq_len=t,
                      tokens_per_s=b * t / statistics.median(ours), compile_s=compile_s,
                      vs_hf=statistics.median(h / o for o, h in zip(ours, theirs)),
                      rounds=args.repeats))
            emit(dict(base, name="hf_torch", batch=b, seq_len=t,
                      tokens_per_s=b * t / statistics.median(theirs)))
        proc, client = start_vllm(folder, 8765) if args.vllm else (None, None)
        if client is not None:
            for b, t, tokens in cases:
                lst = tokens.tolist()
                client.token_states(lst)
                dt = median_time(lambda: client.token_states(lst), args.repeats)
                emit(dict(base, name="vllm", batch=b, seq_len=t, tokens_per_s=b * t / dt))
        if proc is not None:
            os.killpg(proc.pid, 9)
            proc.wait()
        # Prefix cache: cost should follow the suffix, not prefix + suffix.
        prefix = rng.integers(0, 150_000, args.prefix_len).astype(np.int32)
        cache = jax.jit(lambda p, x: prefill(p, cfg, x))(params, prefix)
        b = 8
        f_pre = jax.jit(lambda p, c, x, n: encode(p, cfg, x, n, cfg.num_layers, "last", True,
                                                  prefix=c))
        f_full = jax.jit(lambda p, x, n: encode(p, cfg, x, n, cfg.num_layers, "last", True))
        for s in args.suffix_lengths:
            suffix = rng.integers(0, 150_000, (b, s)).astype(np.int32)
            lens = np.full(b, s, np.int32)
            jax.block_until_ready(f_pre(params, cache, suffix, lens))
            dt = median_time(lambda: jax.block_until_ready(f_pre(params, cache, suffix, lens)), args.repeats)
            emit(dict(base, name="jax_prefix", batch=b, seq_len=s, prefix_len=args.prefix_len,
                      seconds=dt, tokens_per_s=b * s / dt))
            full = np.concatenate([np.broadcast_to(prefix, (b, args.prefix_len)), suffix], 1)
            jax.block_until_ready(f_full(params, full, lens + args.prefix_len))
            dt = median_time(lambda: jax.block_until_ready(f_full(params, full, lens + args.prefix_len)),
                             args.repeats)
            emit(dict(base, name="jax_full", batch=b, seq_len=s, prefix_len=args.prefix_len,
                      seconds=dt, tokens_per_s=b * s / dt))


if __name__ == "__main__":
    main(tyro.cli(Args))
