"""Qwen3 MoE encode throughput: our JAX model vs HF transformers' Qwen3MoeForCausalLM (torch,
CPU) in the same run, same random checkpoint and tokens. `python bench/moe_encode.py --out F.json`

Rows (JSON, one a line): name (jax | hf_torch | jax_prefix | machine), model, params,
active_params, batch, seq_len, tokens_per_s; jax rows add compile_s, vs_hf (median over
alternating rounds of HF's time / ours, against HF's faster experts implementation of the run)
and max_rel_diff (ours vs HF's post-norm states, relative to their scale: the two computed the
same thing); hf rows add experts_implementation (transformers 5's grouped_mm default and its
per-expert `eager` loop). Every position's last-layer post-norm state is computed.
With `--shapes qwen3-30b-a3b` (a GPU): ours only, the released shape with random bf16 weights
made on the device after the memory check, causal rows and rows after a cached prefix (the
fused loop's path), MFU against a bf16 matmul measured in the same process.
"""

from __future__ import annotations

import dataclasses
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
sys.path.insert(0, str(ROOT / "bench"))

from llm_encode import interleaved  # noqa: E402  (each fn timed after its own untimed calls)

# name: build_tiny_qwen3_moe arguments (random HF checkpoints; a 32,768-token vocabulary: the
# embedding lookup is not what is measured). mid-moe keeps the released model's proportions at
# a CPU's size: expert width / hidden 1/3 (768 / 2048 released), top 8 of 64 (8 of 128).
MODELS = {
    "tiny-moe": dict(hidden=128, layers=2, heads=4, kv_heads=2, head_dim=64, experts=8, top_k=2,
                     expert_width=64, vocab=32_768),
    "mid-moe": dict(hidden=768, layers=8, heads=12, kv_heads=4, head_dim=64, experts=64,
                    top_k=8, expert_width=256, vocab=32_768),
}


@dataclasses.dataclass(frozen=True)
class Args:
    models: tuple[str, ...] = ("tiny-moe", "mid-moe")
    """Random-weight MoE models (see MODELS), ours vs HF."""
    batches: tuple[int, ...] = (1, 8)
    """Batch sizes."""
    lengths: tuple[int, ...] = (128, 512)
    """Sequence lengths (tokens per sequence)."""
    hf_impls: tuple[str, ...] = ("grouped_mm", "eager")
    """HF experts implementations to time (transformers 5's default is grouped_mm)."""
    repeats: int = 3
    """Timed rounds (median)."""
    out: str | None = None
    """JSON rows output."""
    shapes: tuple[str, ...] = ()
    """Released shapes (qwen3-30b-a3b) with random bf16 weights, ours only (GPU sessions);
    replaces --models when given."""
    prefix_len: int = 1024
    """--shapes rows: shared prefix length of the prefix-cache rows."""
    suffix_lengths: tuple[int, ...] = (256,)
    """--shapes rows: tokens per row after the prefix."""
    forms: tuple[str, ...] = ("auto",)
    """--shapes rows: expert forms to time in turn (auto = ragged_dot on TPU, tiled elsewhere at
    these sizes; tiled; ragged; pallas: `kernels.grouped_matmul`, through Pallas' interpreter
    on a CPU; gathered; llm_jax/moe.py). A form that fails gets an error row; the others run."""


def cpu_rows(args: Args, emit) -> None:
    import jax
    import torch
    from qwen_fixtures import build_tiny_qwen3_moe

    from llm_jax.loader import load_params
    from llm_jax.model import encode

    torch.set_num_threads(os.cpu_count())
    rng = np.random.default_rng(0)
    for name in args.models:
        folder = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
        spec = MODELS[name]
        hf = build_tiny_qwen3_moe(folder, intermediate=3 * spec["hidden"], **spec)
        cfg, params = load_params(folder)
        base = {"model": name, "params": cfg.num_params(), "active_params": cfg.active_params(),
                "experts": cfg.num_experts, "top_k": cfg.num_experts_per_tok,
                "layers": cfg.num_layers, "hidden": cfg.hidden_size}
        fn = jax.jit(lambda p, x, n: encode(p, cfg, x, n, cfg.num_layers, "none", True))
        for b in args.batches:
            for t in args.lengths:
                tokens = rng.integers(0, cfg.vocab_size, (b, t)).astype(np.int32)
                lengths = np.full(b, t, np.int32)
                ids = torch.tensor(tokens, dtype=torch.long)
                t0 = time.perf_counter()
                ours = np.asarray(jax.block_until_ready(fn(params, tokens, lengths)))
                compile_s = time.perf_counter() - t0
                impls = {}
                for impl in args.hf_impls:
                    hf.config._experts_implementation = impl
                    with torch.no_grad():
                        out = hf.model(input_ids=ids, output_hidden_states=True)
                    ref = out.hidden_states[-1].numpy()
                    impls[impl] = float(np.abs(ours - ref).max() / np.abs(ref).max())

                def hf_call(impl):
                    def call():
                        hf.config._experts_implementation = impl
                        with torch.no_grad():
                            hf.model(input_ids=ids)
                    return call

                fns = [lambda: jax.block_until_ready(fn(params, tokens, lengths))]
                fns += [hf_call(impl) for impl in args.hf_impls]
                times = interleaved(fns, args.repeats)
                best = min(range(1, len(fns)), key=lambda i: statistics.median(times[i]))
                emit(dict(base, name="jax", batch=b, seq_len=t,
                          tokens_per_s=b * t / statistics.median(times[0]), compile_s=compile_s,
                          vs_hf=statistics.median(h / o for o, h in zip(times[0], times[best])),
                          vs_hf_impl=args.hf_impls[best - 1], max_rel_diff=max(impls.values()),
                          rounds=args.repeats))
                for i, impl in enumerate(args.hf_impls, 1):
                    emit(dict(base, name="hf_torch", batch=b, seq_len=t,
                              experts_implementation=impl,
                              tokens_per_s=b * t / statistics.median(times[i])))
        del hf, params


def shape_rows(args: Args, emit) -> None:
    """Released shapes, ours only: causal rows and rows after a cached prefix, per expert form."""
    import jax
    import jax.numpy as jnp
    from fused_sps import matmul_flops

    from llm_jax.config import Qwen3Config
    from llm_jax.memory import activation_bytes, check_fits, kv_bytes, weight_bytes
    from llm_jax.model import AttentionConfig, encode, prefill
    from llm_jax.moe import resolve_moe_form
    from llm_jax.weights import random_params

    peak = matmul_flops("bfloat16")
    emit({"name": "machine", "devices": str(jax.devices()), "bf16_matmul_flops_per_s": peak})
    rng = np.random.default_rng(0)
    for name in args.shapes:
        cfg = Qwen3Config.shape(name)
        rows = max(args.batches)
        longest = max(args.lengths + tuple(args.prefix_len + s for s in args.suffix_lengths))
        _, line = check_fits({"weights": weight_bytes(cfg, jnp.bfloat16),
                              "caches": kv_bytes(cfg, cfg.num_layers, rows * longest, "bfloat16"),
                              "activations": activation_bytes(cfg, rows, longest, 0, "bfloat16")},
                             "lower --batches / --lengths, or raise "
                             "XLA_PYTHON_CLIENT_MEM_FRACTION (JAX takes 75% of a GPU by default)")
        emit({"name": "memory", "model": name, "estimate": line})
        params = random_params(cfg, jax.random.PRNGKey(0), jnp.bfloat16)
        emit(parity_row(cfg, name, params, args.forms))
        for form in args.forms:
            try:  # a form that fails (a kernel on a new GPU) leaves the others' rows
                attn = AttentionConfig(moe_form=form)
                base = {"model": name, "params": cfg.num_params(),
                        "active_params": cfg.active_params(), "dtype": "bfloat16",
                        "moe_form": resolve_moe_form(form)}
                fn = jax.jit(lambda p, x, n, attn=attn: encode(p, cfg, x, n, cfg.num_layers,
                                                               "last", True, attn=attn))
                for b in args.batches:
                    for t in args.lengths:
                        tokens = rng.integers(0, 150_000, (b, t)).astype(np.int32)
                        lengths = np.full(b, t, np.int32)
                        t0 = time.perf_counter()
                        jax.block_until_ready(fn(params, tokens, lengths))
                        compile_s = time.perf_counter() - t0
                        ts = interleaved([lambda: jax.block_until_ready(
                            fn(params, tokens, lengths))], args.repeats)[0]
                        dt = statistics.median(ts)
                        emit(dict(base, name="jax", batch=b, seq_len=t, tokens_per_s=b * t / dt,
                                  compile_s=compile_s,
                                  mfu=b * t * cfg.flops_per_token(cfg.num_layers, 0, t)
                                  / dt / peak))
                prefix = rng.integers(0, 150_000, args.prefix_len).astype(np.int32)
                cache = jax.jit(lambda p, x, attn=attn: prefill(p, cfg, x, attn=attn))(
                    params, prefix)
                f_pre = jax.jit(lambda p, c, x, n, attn=attn: encode(
                    p, cfg, x, n, cfg.num_layers, "last", True, prefix=c, attn=attn))
                for b in args.batches:
                    for s in args.suffix_lengths:
                        suffix = rng.integers(0, 150_000, (b, s)).astype(np.int32)
                        lens = np.full(b, s, np.int32)
                        jax.block_until_ready(f_pre(params, cache, suffix, lens))
                        ts = interleaved([lambda: jax.block_until_ready(
                            f_pre(params, cache, suffix, lens))], args.repeats)[0]
                        dt = statistics.median(ts)
                        flops = b * s * cfg.flops_per_token(cfg.num_layers, args.prefix_len, s)
                        emit(dict(base, name="jax_prefix", batch=b, seq_len=s,
                                  prefix_len=args.prefix_len, seconds=dt,
                                  tokens_per_s=b * s / dt, mfu=flops / dt / peak))
            except Exception as e:  # noqa: BLE001 (reported as a row, then the next form)
                emit({"name": "error", "model": name, "moe_form": form,
                      "error": f"{type(e).__name__}: {str(e)[:500]}"})
        del params


def parity_row(cfg, name: str, params, forms, tokens: int = 256) -> dict:
    """The first sparse layer's MLP in each expert form vs the dense oracle (every expert on
    every token, float32) on `tokens` random bf16 states: max |difference| over the oracle's
    scale (bf16 rounds at ~4e-3)."""
    import jax
    import jax.numpy as jnp

    from llm_jax.moe import dense_reference, moe_mlp, resolve_moe_form, route

    mp = jax.tree.map(lambda v: v[0], params.layers.moe)
    h = jax.random.normal(jax.random.PRNGKey(1), (1, tokens, cfg.hidden_size), jnp.bfloat16)
    want = jax.jit(lambda m, x: dense_reference(cfg, m, x[0], route(cfg, m.router, x[0])))(
        mp, h).astype(jnp.float32)
    scale = float(jnp.abs(want).max())
    out = {"name": "parity", "model": name, "tokens": tokens, "oracle": "dense_reference"}
    for form in forms:
        try:  # one form's failure (a kernel on a new GPU) is its row's, not the run's
            got = jax.jit(lambda m, x, form=form: moe_mlp(cfg, m, x, form=form)[0])(mp, h)
            out[f"max_rel_diff_{resolve_moe_form(form)}"] = float(
                jnp.abs(got[0].astype(jnp.float32) - want).max()) / scale
        except Exception as e:  # noqa: BLE001
            out[f"error_{form}"] = f"{type(e).__name__}: {str(e)[:500]}"
    return out


def main(args: Args):
    from typing import get_args

    from llm_encode import run_rows
    from llm_jax.moe import MoEForm

    bad = [f for f in args.forms if f not in get_args(MoEForm)]
    if bad:
        raise SystemExit(f"error: --forms {' '.join(bad)}: each one of "
                         f"{', '.join(get_args(MoEForm))}")
    run_rows(args.out, lambda emit: (shape_rows if args.shapes else cpu_rows)(args, emit))


if __name__ == "__main__":
    main(tyro.cli(Args))
