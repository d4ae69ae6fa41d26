"""Decode throughput: our `llm_jax.decode.generate` vs HF transformers' `generate` vs a vLLM
generation server, same random-weight model, prompts and token counts, one process, one machine.
`python bench/decode_sps.py --out F.json`

Workload: a shared prefix (`--prefix-len` tokens), then a `--prompt-len`-token prompt per row,
`--new-tokens` generated greedily past EOS. Ours computes the prefix cache once, outside the
timings (as its callers do: one system prompt for every state); HF and vLLM get prefix + prompt
as one sequence per row (vLLM may reuse the prefix through its own prefix caching). Each system
is timed generating 1 token and `--new-tokens` tokens:
- `tokens_per_s`: rows x new tokens / seconds of the whole call (prompt pass included);
- `decode_tokens_per_s`: rows x (new tokens - 1) / (seconds(N) - seconds(1)), the decode loop
  alone (none where seconds(N) <= seconds(1), and the per-round ratios leave such rounds out;
  the shapes' rows say so in a note).
Ours and HF are timed in alternating rounds (`interleaved` below); `vs_hf` is the median
over rounds of HF's seconds / ours. vLLM afterwards, once HF's rows are done (an idle server
still takes cycles), in alternating rounds with ours again (`ours_vs_vllm`).

`--shapes qwen3-4b` (GPU sessions): ours only, random bf16 weights of a released shape in the
decode loop's per-layer layout, at each of `--batches` and `--steps-per-check`, decode steps/s
beside the memory-bandwidth bound: bytes a step must read (every weight once: the tied embedding
is the LM head; the embedding lookup reads B rows only) plus the KV cache of the context, over
`--bandwidth` bytes/s (H100 SXM: 3.35e12, H200: 4.8e12), and over a device-to-device copy's rate
measured in the same process. `--trace F` also writes a `jax.profiler` trace of one
`--trace-tokens` burst at the first batch (profiler on only then: the timings are taken
without it) to F, for `bench/trace_report.py`. `--shapes qwen3-tiny` runs the same path on a CPU
(`scripts/gpu_check.sh --cpu-smoke`). Without a GPU the bound is still written
(`name: bandwidth_bound`), the measurement marked "not measured".
"""

from __future__ import annotations

import dataclasses
import functools
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
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from llm_encode import MODELS, build, run_rows  # noqa: E402
from llm_jax.graphs import Graphs  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Args:
    graphs: Graphs = "loops"
    """Our decode's CUDA graphs setting on a GPU (llm_jax/graphs.py; the commands' default)."""
    models: tuple[str, ...] = ("tiny-h64", "qwen3-134m")
    """Random-weight models (bench/llm_encode.py's MODELS)."""
    batches: tuple[int, ...] = (1, 8, 64)
    """Rows generated together."""
    prefix_len: int = 512
    """Shared prefix tokens."""
    prompt_len: int = 32
    """Tokens of each row's own prompt."""
    new_tokens: int = 64
    """Tokens generated per row (greedy, EOS ignored)."""
    repeats: int = 3
    """Timed rounds (median)."""
    hf: bool = True
    """Also time HF transformers' generate."""
    vllm: bool = True
    """Also time a vLLM server (scripts/vllm_server.sh serve-generate; skipped if it cannot
    start)."""
    shapes: tuple[str, ...] = ()
    """Released Qwen3 shapes (qwen3-4b, ...): ours only, bf16, at each of --batches, vs the
    bandwidth bound; replaces --models when given (GPU sessions)."""
    bandwidth: float = 3.35e12
    """Memory bandwidth of the GPU the bound is computed for, bytes/s (H100 SXM)."""
    steps_per_check: tuple[int, ...] = (1,)
    """Decode steps per read of the loop's condition (`llm_jax.decode.generate`), each timed
    (with --shapes)."""
    copy_gb: float = 4.0
    """Size of the device-to-device copy timed for the practical bandwidth (with --shapes)."""
    trace: str | None = None
    """With --shapes: write a profiler trace (Chrome trace JSON, gzipped) of one decode burst
    at the first batch here."""
    trace_tokens: int = 16
    """Tokens of the traced burst."""
    target: str | None = None
    """With --shapes: compile ours for this GPU (h100, h200) here, XLA:GPU without a device
    (bench/gpu_target.py), and write each program's memory and the kernels one decode step
    launches instead of timing (the prompt pass takes the blocked attention form, no cuDNN
    here; the decode loop is the GPU's)."""
    bound_shape: str = "qwen3-4b"
    """Shape whose bandwidth bound is written on every run."""
    out: str | None = None
    """JSON rows output."""


def interleaved(fns, repeats, settle_s=0.05, long_s=1.0):
    """Seconds of each of `fns` in `repeats` rounds calling every fn in turn (as
    `llm_encode.interleaved`: untimed calls for `settle_s` first, so that no timing holds the
    previous fn's spinning threads), except that calls which took over `long_s` last round go
    untimed-call-free: a ~20 ms spin is noise beside them, and HF's calls at batch 64 take
    minutes on 2 shared cores."""
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t = time.perf_counter()
            while (not ts or ts[-1] < long_s) and time.perf_counter() - t < settle_s:
                fn()
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return times


def bytes_per_step(cfg, batch: int, context: int, dtype_bytes: int = 2) -> dict:
    """Bytes one decode step reads at least: every weight once (the LM head whole; an untied
    model's input embedding only for the B rows looked up, negligible; a MoE model's experts
    counted whole: across a batch most are chosen) and the keys/values of `context` tokens per
    row."""
    weights = cfg.num_params() * dtype_bytes
    if not cfg.tie_word_embeddings:  # num_params counts the input embedding and the head
        weights -= cfg.vocab_size * cfg.hidden_size * dtype_bytes
    kv = batch * context * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
    return {"weight_bytes": weights, "kv_bytes": kv, "bytes_per_step": weights + kv}


def bound_row(args: Args, name: str, batch: int = 1) -> dict:
    from llm_jax.config import Qwen3Config

    cfg = Qwen3Config.shape(name)
    context = args.prefix_len + args.prompt_len + args.new_tokens // 2  # mean over the steps
    b = bytes_per_step(cfg, batch, context)
    return dict(b, name="bandwidth_bound", model=name, dtype="bfloat16", batch=batch,
                context=context, bandwidth=args.bandwidth,
                bound_steps_per_s=args.bandwidth / b["bytes_per_step"])


def our_fn(cfg, n_new, steps_per_check: int = 1, *, graphs: str):
    import jax

    from llm_jax.decode import GenerateSpec, generate
    from llm_jax.graphs import loop_jit

    spec = GenerateSpec(max_new_tokens=n_new, pad_id=0, steps_per_check=steps_per_check)
    return loop_jit(lambda p, c, t, n: generate(p, cfg, spec, t, n, key=jax.random.PRNGKey(0),
                                                prefix=c).tokens, graphs)


def decode_rate(b: int, n: int, t1: float, tn: float) -> float | None:
    """Tokens/s of the decode steps alone: the (n - 1) steps' tokens over the n-token call's
    seconds less the 1-token call's; None where the difference is not positive (timing noise
    outweighs the steps: tiny shapes on a busy CPU), never a negative or infinite figure."""
    return b * (n - 1) / (tn - t1) if tn > t1 else None


def median_ratio(pairs) -> float | None:
    """The median over rounds of num / den, rounds with a non-positive side left out (None if
    no round is left)."""
    kept = [a / b for a, b in pairs if a > 0 and b > 0]
    return statistics.median(kept) if kept else None


def cpu_rows(args: Args, emit) -> None:
    import jax
    import jax.numpy as jnp
    import torch

    from llm_jax.loader import load_params
    from llm_jax.model import prefill

    torch.set_num_threads(os.cpu_count())
    rng = np.random.default_rng(0)
    n = args.new_tokens
    for name in args.models:
        folder = Path(tempfile.mkdtemp(prefix=f"bench-decode-{name}-"))
        hf = build(name, folder)
        cfg, params = load_params(folder)
        base = {"model": name, "params": cfg.num_params(), "prefix_len": args.prefix_len,
                "prompt_len": args.prompt_len, "new_tokens": n}
        prefix = rng.integers(0, 150_000, args.prefix_len).astype(np.int32)
        cache = jax.block_until_ready(jax.jit(lambda p, x: prefill(p, cfg, x))(
            params, jnp.asarray(prefix)))
        fns = {k: our_fn(cfg, k, graphs=args.graphs) for k in (1, n)}
        cases = []
        for b in args.batches:
            prompts = rng.integers(0, 150_000, (b, args.prompt_len)).astype(np.int32)
            lengths = np.full(b, args.prompt_len, np.int32)
            full = torch.tensor(np.concatenate([np.broadcast_to(prefix, (b, args.prefix_len)),
                                                prompts], 1), dtype=torch.long)
            cases.append((b, prompts, full))
            t0 = time.perf_counter()
            ours = {k: jax.block_until_ready(f(params, cache, prompts, lengths))
                    for k, f in fns.items()}
            compile_s = time.perf_counter() - t0

            def hf_gen(k, full=full):
                with torch.no_grad():
                    return hf.generate(full, attention_mask=torch.ones_like(full),
                                       max_new_tokens=k, min_new_tokens=0, do_sample=False,
                                       eos_token_id=None, pad_token_id=0)

            same = None
            if args.hf:  # the same greedy tokens (a sanity check, not a parity test)
                same = bool((hf_gen(n)[:, full.shape[1]:].numpy() == np.asarray(ours[n])).all())
            calls = [lambda k=k, f=f: jax.block_until_ready(f(params, cache, prompts, lengths))
                     for k, f in fns.items()]
            if args.hf:
                calls += [lambda k=k: hf_gen(k) for k in (1, n)]
            times = interleaved(calls, args.repeats)
            o1, on = (statistics.median(t) for t in times[:2])
            emit(dict(base, name="jax", batch=b, seconds=on, tokens_per_s=b * n / on,
                      decode_tokens_per_s=decode_rate(b, n, o1, on), compile_s=compile_s,
                      same_tokens_as_hf=same, rounds=args.repeats,
                      vs_hf=statistics.median(h / o for o, h in zip(times[1], times[3]))
                      if args.hf else None,
                      decode_vs_hf=median_ratio(
                          (hn - h1, on_ - o1_) for o1_, on_, h1, hn in zip(*times))
                      if args.hf else None))
            if args.hf:
                h1, hn = (statistics.median(t) for t in times[2:])
                emit(dict(base, name="hf_torch", batch=b, seconds=hn, tokens_per_s=b * n / hn,
                          decode_tokens_per_s=decode_rate(b, n, h1, hn)))
        if args.vllm:
            ours = lambda k, prompts: jax.block_until_ready(  # noqa: E731
                fns[k](params, cache, prompts, np.full(len(prompts), args.prompt_len, np.int32)))
            vllm_rows(args, emit, base, folder, cases, n, ours)


def vllm_rows(args: Args, emit, base, folder, cases, n, ours) -> None:
    """vLLM's rows, ours timed again in the same rounds (alternating calls) with the server up:
    `ours_vs_vllm` compares them on equal footing (the idle server's polling slows ours, if
    anything)."""
    from llm_jax.vllm_client import VLLMError, launch_server

    try:
        proc, client = launch_server(ROOT / "scripts/vllm_server.sh", folder, 8765,
                                     mode="serve-generate")
    except VLLMError as e:
        print(f"vLLM rows skipped: {e}", file=sys.stderr, flush=True)
        return
    try:
        client.timeout = 1800
        for b, prompts, full in cases:
            seqs = full.tolist()
            calls = [lambda k=k: ours(k, prompts) for k in (1, n)]
            calls += [lambda k=k: client.generate_tokens(seqs, k) for k in (1, n)]
            for c in calls[2:]:
                c()  # warm: its compile/graph capture, and the prefix in its cache
            same = client.generate_tokens(seqs, n) == np.asarray(calls[1]()).tolist()
            times = interleaved(calls, args.repeats)
            o1, on, v1, vn = (statistics.median(t) for t in times)
            emit(dict(base, name="vllm", batch=b, seconds=vn, tokens_per_s=b * n / vn,
                      decode_tokens_per_s=decode_rate(b, n, v1, vn), same_tokens_as_ours=same,
                      ours_same_rounds_decode_tokens_per_s=decode_rate(b, n, o1, on),
                      ours_vs_vllm=statistics.median(v / o for o, v in zip(times[1], times[3])),
                      ours_vs_vllm_decode=median_ratio(
                          (vn_ - v1_, on_ - o1_) for o1_, on_, v1_, vn_ in zip(*times))))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def copy_bandwidth(gb: float = 4.0, repeats: int = 10) -> float:
    """Bytes/s of a large device-to-device copy here (bytes read plus bytes written): the
    practical bandwidth ceiling, beside the datasheet's `--bandwidth`."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((int(gb * 2**30) // 4,), jnp.float32)
    f = jax.jit(lambda a: a * 2.0)
    jax.block_until_ready(f(x))
    t = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(f(x))
    return repeats * 2 * x.nbytes / (time.perf_counter() - t)


def shape_rows(args: Args, emit) -> None:
    """Released shapes, random bf16 weights made on the device in the per-layer layout: decode
    steps/s at each batch and steps_per_check vs the bandwidth bound of that batch (the weights
    once, every row's KV cache)."""
    import jax
    import jax.numpy as jnp

    from llm_jax.config import Qwen3Config
    from llm_jax.model import prefill
    from llm_jax.weights import random_params

    rng = np.random.default_rng(0)
    n = args.new_tokens
    copy = copy_bandwidth(args.copy_gb)
    emit({"name": "machine", "devices": str(jax.devices()), "copy_bytes_per_s": copy,
          "jax": jax.__version__, "graphs": args.graphs})
    for name in args.shapes:
        cfg = Qwen3Config.shape(name)
        params = random_params(cfg, jax.random.PRNGKey(0), jnp.bfloat16, per_layer=True)
        prefix = jnp.asarray(rng.integers(0, 150_000, args.prefix_len).astype(np.int32))
        cache = jax.jit(lambda p, x: prefill(p, cfg, x))(params, prefix)
        fns_by = {}  # (tokens, steps_per_check) -> jitted: the trace reuses a timed one
        for k_check in args.steps_per_check:
            fns = {k: fns_by.setdefault((k, k_check), our_fn(cfg, k, k_check, graphs=args.graphs))
                   for k in (1, n)}
            for batch in args.batches:
                prompts = rng.integers(0, 150_000, (batch, args.prompt_len)).astype(np.int32)
                lengths = np.full(batch, args.prompt_len, np.int32)
                t0 = time.perf_counter()
                for f in fns.values():
                    jax.block_until_ready(f(params, cache, prompts, lengths))
                compile_s = time.perf_counter() - t0
                t1, tn = (statistics.median(t) for t in interleaved(
                    [lambda f=f: jax.block_until_ready(f(params, cache, prompts, lengths))
                     for f in fns.values()], args.repeats))
                bound = bound_row(args, name, batch)
                row = dict(bound, name="jax_gpu", devices=str(jax.devices()[0]), seconds=tn,
                           steps_per_check=k_check, tokens_per_s=batch * n / tn,
                           compile_s=compile_s)
                # the decode steps' seconds are the n-token call's less the 1-token call's: where
                # noise outweighs them (tiny shapes on a busy CPU) no figure rather than a wrong one
                if tn > t1:
                    steps = (n - 1) / (tn - t1)
                    row.update(decode_steps_per_s=steps, decode_tokens_per_s=batch * steps,
                               fraction_of_bound=steps / bound["bound_steps_per_s"],
                               fraction_of_copy_bound=steps * bound["bytes_per_step"] / copy)
                else:
                    row.update(decode_steps_per_s=None,
                               note=f"{n}-token call not slower than the 1-token call "
                                    "(timing noise?)")
                emit(row)
        if args.trace:
            write_trace(args, cfg, name, params, cache, rng, emit, fns_by)
        del params, cache


def write_trace(args: Args, cfg, name: str, params, cache, rng, emit, fns_by=None) -> None:
    """A profiler trace of one `--trace-tokens` burst at the first batch (compiled before the
    profiler starts, or timed already where `--trace-tokens` equals `--new-tokens`: no compile
    more), copied to `--trace`; its row names the bytes a step must move."""
    import shutil

    import jax

    batch = args.batches[0]
    key = (args.trace_tokens, args.steps_per_check[0])
    fn = (fns_by or {}).get(key) or our_fn(cfg, *key, graphs=args.graphs)
    prompts = rng.integers(0, 150_000, (batch, args.prompt_len)).astype(np.int32)
    lengths = np.full(batch, args.prompt_len, np.int32)
    jax.block_until_ready(fn(params, cache, prompts, lengths))
    with tempfile.TemporaryDirectory() as tmp:
        jax.profiler.start_trace(tmp, create_perfetto_trace=True)
        try:
            jax.block_until_ready(fn(params, cache, prompts, lengths))
        finally:
            jax.profiler.stop_trace()
        found = sorted(Path(tmp).rglob("perfetto_trace.json.gz"))
        if not found:
            emit({"name": "trace", "model": name, "error": "the profiler wrote no trace"})
            return
        shutil.copy(found[-1], args.trace)
    emit(dict(bound_row(args, name, batch), name="trace", path=args.trace,
              steps=args.trace_tokens - 1, bytes=Path(args.trace).stat().st_size))


def target_rows(args: Args, emit) -> None:
    """--target: each shape, batch and steps_per_check compiled for the GPU, not run."""
    import jax
    import jax.numpy as jnp

    import gpu_target
    from llm_jax.config import Qwen3Config
    from llm_jax.model import init_params, prefill

    dev = gpu_target.use(args.target)
    args = dataclasses.replace(args, bandwidth=gpu_target.TARGETS[args.target][2])
    put = functools.partial(gpu_target.abstract, device=dev)
    n = args.new_tokens
    for name in args.shapes:
        cfg = Qwen3Config.shape(name)
        with gpu_target.as_gpu():
            params = put(jax.eval_shape(
                lambda k: init_params(cfg, k, jnp.bfloat16, per_layer=True),
                jax.random.PRNGKey(0)))
            cache = put(jax.eval_shape(lambda p, x: prefill(p, cfg, x), params,
                                       jax.ShapeDtypeStruct((args.prefix_len,), jnp.int32)))
            for k_check in args.steps_per_check:
                for batch in args.batches:
                    t0 = time.perf_counter()
                    compiled = our_fn(cfg, n, k_check, graphs=args.graphs).lower(
                        params, cache, put(jax.ShapeDtypeStruct((batch, args.prompt_len),
                                                                jnp.int32)),
                        put(jax.ShapeDtypeStruct((batch,), jnp.int32))).compile()
                    loops = gpu_target.loop_kernels(compiled.as_text())
                    # one token's step: the biggest loop of steps_per_check iterations (> 1;
                    # a MoE's loops over experts nest in it), else the biggest loop (the decode
                    # loop's own body)
                    steps = [r for r in loops if k_check == 1 or r["trip_count"] == k_check]
                    step = max(steps, key=lambda r: r["kernels"], default={})
                    emit(dict(bound_row(args, name, batch), name="jax_gpu_compiled",
                              steps_per_check=k_check, graphs=args.graphs,
                              compile_s=time.perf_counter() - t0,
                              kernels_per_decode_step=step.get("kernels"),
                              kernels_by_op=step.get("by_op"),
                              kernels_exact=step.get("exact"),
                              **gpu_target.memory(compiled, args.target)))


def run(args: Args, emit) -> None:
    if args.target:
        if not args.shapes:
            raise SystemExit("error: --target compiles --shapes (e.g. --shapes qwen3-4b)")
        return target_rows(args, emit)
    import jax

    emit({"name": "machine", "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg(),
          "backend": jax.default_backend(), "graphs": args.graphs})
    emit(dict(bound_row(args, args.bound_shape),
              measured=None if args.shapes else "not measured (no GPU in this run)"))
    if args.shapes:
        if jax.default_backend() != "gpu":
            print("--shapes: no GPU here; the bandwidth comparison needs one", file=sys.stderr)
        shape_rows(args, emit)
    else:
        cpu_rows(args, emit)
    emit({"name": "machine_after", "load_average_at_end": os.getloadavg()})


def main(args: Args):
    run_rows(args.out, lambda emit: run(args, emit))


if __name__ == "__main__":
    main(tyro.cli(Args))
