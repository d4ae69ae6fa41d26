"""Kernel accounting of our GPU programs, compiled on this CPU for an H100 or H200
(bench/gpu_target.py): for each program the kernels one iteration of its loops launches by kind,
the bytes and FLOPs they move (bench/hlo_cost.py), XLA's peak memory, and where a step's copies
come from; with --command-buffers also how XLA groups the launches into CUDA graphs.

    python bench/gpu_target.py report --target h200 [--only NAME ...] [--command-buffers]
        [--out docs/gpu/kernels_h200.json]

Each program is compiled once (80-150 s for a PPO chunk on 2 cores); --out keeps the rows of
programs not asked for, so programs can be added one at a time. A row's `profile` (every kernel
of what its measurement times, with its count) is what bench/gpu_predict.py fits and predicts
from."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import gpu_target  # noqa: E402
import hlo_cost  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Spec:
    """One program: how to compile it, what a run produces, which loops to tabulate."""

    what: str
    compile: Callable  # (device, options) -> (compiled, details dict)
    unit: str  # what the measurement counts: env steps, decode steps, tokens, frames
    per_run: float  # units one run of the whole program produces
    loop_names: Callable[[list[dict]], dict[str, dict]]  # name: loop row of interest
    measured_loop: str | None = None  # a measurement timing one loop's iterations (a unit each)
    weights: Callable = hlo_cost.heaviest


# ------------------------------------------------------------------ programs


def compile_train(cfg, device, options=None):
    """A training config's chunk (rollout and update of `cfg.updates_per_chunk` updates)
    compiled for `device` as train.py compiles it, with `cfg.cuda_graphs`' options (the report's
    configs: `default`; `options` are added to them, never take them away), from shapes only
    (an LLM's weights are made on this CPU by its host setup, then passed as shapes)."""
    import jax
    import numpy as np

    from fused.commands.train import build, validate
    from llm_jax.graphs import loop_jit

    validate(cfg)
    with gpu_target.as_gpu():
        like = None
        if cfg.llm.attention == "pallas":  # the prompt prefix's cache is computed on this CPU,
            # where Pallas runs interpreted only: made in another form, shared (the same values)
            blocked = dataclasses.replace(cfg.llm, attention="blocked")
            like = build(dataclasses.replace(cfg, llm=blocked)).agent
        online = build(cfg, like=like)
        frozen = gpu_target.abstract(online.frozen, device) if online.frozen is not None else None
        state = gpu_target.abstract(
            jax.eval_shape(online.trainer.init, jax.random.PRNGKey(0), online.frozen), device)
        chunk = loop_jit(online.trainer.chunk, cfg.cuda_graphs)  # (as train.py compiles it)
        length = gpu_target.abstract(np.int32(cfg.num_updates), device)
        return chunk.lower(state, frozen, length).compile(options or None)


def ppo_config(env: str, n: int, reset_pool: int, worlds: int, num_steps: int = 64,
               epochs: int = 4, minibatches: int = 8, width: int = 512, updates: int = 1,
               kind: str = "mlp", llm=None):
    from fused.commands.train import TrainConfig
    from fused.llm.config import LLMConfig
    from fused.rl.config import EnvConfig, PolicyConfig, PPOConfig
    from fused.runs.settings import WandbConfig

    return TrainConfig(env=EnvConfig(name=env, num_envs=n, reset_pool=reset_pool,
                                     worlds_per_step=worlds),
                       ppo=PPOConfig(num_steps=num_steps, update_epochs=epochs,
                                     num_minibatches=minibatches),
                       policy=PolicyConfig(kind, layer_width=width), llm=llm or LLMConfig(),
                       total_timesteps=n * num_steps * 10_000, updates_per_chunk=updates,
                       wandb=WandbConfig(mode="disabled"), plot=False,
                       cuda_graphs="default")  # (the report's rows: XLA's own launching)


def ppo_loops(num_steps: int, epochs: int, minibatches: int):
    """The rollout step (the biggest loop of `num_steps` iterations) and the update epoch (the
    biggest loop of `epochs` iterations, else `minibatches` minibatches), inside the chunk's
    loop over updates."""

    def pick(rows):
        out = {}
        rows = [r for r in rows if not r["outer"]]
        steps = [r for r in rows if r["trip_count"] == num_steps]
        if steps:
            out["rollout step"] = max(steps, key=lambda r: r["kernels"])
        ep = [r for r in rows if r["trip_count"] == epochs and r["kernels"] > 20]
        mb = [r for r in rows if r["trip_count"] == minibatches and r["kernels"] > 20]
        if ep and epochs > 1:
            out["update epoch"] = max(ep, key=lambda r: r["kernels"])
        elif mb:
            r = max(mb, key=lambda r: r["kernels"])
            out["update epoch"] = dict(r, **{k: r[k] * minibatches for k in
                                             ("kernels", "bytes", "flops", "kernels_min",
                                              "kernels_max")},
                                       by_kind={k: v * minibatches
                                                for k, v in r["by_kind"].items()})
        return out

    return pick


def ppo_spec(what: str, env: str, n: int, reset_pool: int, worlds: int, **kw) -> Spec:
    cfg = functools.partial(ppo_config, env, n, reset_pool, worlds, **kw)
    c = cfg()
    return Spec(what, lambda dev, opts: (compile_train(cfg(), dev, opts), {}), "env steps",
                c.steps_per_update * c.updates_per_chunk,
                ppo_loops(c.ppo.num_steps, c.ppo.update_epochs, c.ppo.num_minibatches))


def fused_weights(skip_n: int, refresh_per_step: float, bucket: int, pack: int):
    """Branch shares of the fused chunk's conditionals: the policy input's switch [full call,
    refresh, keep] by the call interval and the measured refreshes a step; a switch over
    encoding or packing lengths (`fused.text.buckets`) at the branch of the typical longest row
    (`bucket`-th / `pack`-th); any other at its heaviest branch (an env's reset taken)."""
    full = 1.0 / skip_n

    def weights(instr, sizes):
        n = len(sizes)
        if n == 3 and sizes[2] < min(sizes[:2]):  # (no other switch of 3 has a light last)
            return [full, refresh_per_step, 1.0 - full - refresh_per_step]
        if n > 4:
            return [1.0 if k == min(bucket, n - 1) else 0.0 for k in range(n)]
        if n == 4:
            return [1.0 if k == min(pack, n - 1) else 0.0 for k in range(n)]
        return hlo_cost.heaviest(instr, sizes)

    return weights


def fused_spec(what: str, model: str, layer: int | None, n: int, refresh_per_step: float,
               bucket: int = 4, pack: int = 2, num_steps: int = 50, updates: int = 2) -> Spec:
    """bench/fused_sps.py's chunk: Craftax-Classic-Symbolic, width 256, 2 epochs x 4
    minibatches, reset pool 8, skip 25, bf16, refresh on reset, the Pallas prefix attention (as
    measured; "auto" picks it on a GPU, but here cuDNN's probe fails and would pick the blocked
    form)."""
    from fused.llm.config import LLMConfig

    def cfg():
        llm = LLMConfig(backend="jax", skip_n=25, post_norm=True, layer=layer, dtype="bfloat16",
                        refresh_on_reset=True, random_model=model, attention="pallas")
        return ppo_config("Craftax-Classic-Symbolic-v1", n, 8, 1, num_steps, 2, 4, 256,
                          updates, llm=llm)

    return Spec(what, lambda dev, opts: (compile_train(cfg(), dev, opts), {}), "env steps",
                n * num_steps * updates, ppo_loops(num_steps, 2, 4),
                weights=fused_weights(25, refresh_per_step, bucket, pack))


def decode_spec(what: str, shape: str, batch: int, per_check: int = 8, prefix: int = 512,
                prompt: int = 32, new: int = 64) -> Spec:
    """bench/decode_sps.py's program: greedy, a shared prefix, one check every `per_check`
    steps (an iteration of the loop of `per_check` iterations, or of the decode loop, is one
    step)."""

    def build(dev, opts):
        import jax
        import jax.numpy as jnp

        from decode_sps import our_fn
        from llm_jax.config import Qwen3Config
        from llm_jax.model import init_params, prefill

        cfg = Qwen3Config.shape(shape)
        put = functools.partial(gpu_target.abstract, device=dev)
        with gpu_target.as_gpu():
            params = put(jax.eval_shape(
                lambda k: init_params(cfg, k, jnp.bfloat16, per_layer=True),
                jax.random.PRNGKey(0)))
            cache = put(jax.eval_shape(lambda p, x: prefill(p, cfg, x), params,
                                       jax.ShapeDtypeStruct((prefix,), jnp.int32)))
            return our_fn(cfg, new, per_check, graphs="default").lower(  # (the rows: XLA's own)
                params, cache, put(jax.ShapeDtypeStruct((batch, prompt), jnp.int32)),
                put(jax.ShapeDtypeStruct((batch,), jnp.int32))).compile(opts or None), {}

    def pick(rows):  # the loop of `per_check` steps runs one step an iteration
        steps = [r for r in rows if per_check == 1 or r["trip_count"] == per_check]
        return {"decode step": max(steps, key=lambda r: r["kernels"])}

    return Spec(what, build, "decode steps", new - 1, pick, "decode step")


def encode_spec(what: str, shape: str, batch: int, length: int, form: str = "tiled") -> Spec:
    """bench/moe_encode.py's causal call: `batch` rows of `length` tokens, the last layer's
    states at the last token."""

    def build(dev, opts):
        import jax
        import jax.numpy as jnp

        from llm_jax.config import Qwen3Config
        from llm_jax.model import AttentionConfig, encode, init_params

        cfg = Qwen3Config.shape(shape)
        put = functools.partial(gpu_target.abstract, device=dev)
        attn = AttentionConfig(moe_form=form)
        with gpu_target.as_gpu():
            params = put(jax.eval_shape(lambda k: init_params(cfg, k, jnp.bfloat16),
                                        jax.random.PRNGKey(0)))
            fn = jax.jit(lambda p, x, n: encode(p, cfg, x, n, cfg.num_layers, "last", True,
                                                attn=attn))
            return fn.lower(params, put(jax.ShapeDtypeStruct((batch, length), jnp.int32)),
                            put(jax.ShapeDtypeStruct((batch,), jnp.int32))).compile(
                opts or None), {}

    return Spec(what, build, "tokens", batch * length, lambda rows: {})


def vl_spec(what: str, shape: str, frames: int, microbatch: int) -> Spec:
    """bench/vl_encode.py's GPU call: `frames` Craftax-Pixels frames to pooled states (every
    8th image token), micro-batches of `microbatch` under `lax.map`."""

    def build(dev, opts):
        import jax
        import jax.numpy as jnp

        from fused.llm.config import LLMConfig
        from fused.llm.vl import VLEncoder
        from llm_jax.vl_config import VLConfig
        from llm_jax.vl_loader import random_vl_params
        from vl_encode import shape_folder

        folder = shape_folder(shape)
        cfg = VLConfig.from_folder(folder)
        with gpu_target.as_gpu():
            params = gpu_target.abstract(jax.eval_shape(
                lambda: random_vl_params(cfg, 0, jnp.bfloat16)), dev)
            enc = VLEncoder(LLMConfig(weights=str(folder), pool="every:8", dtype="bfloat16"),
                            "Craftax-Pixels-v1", microbatch, params=params)
            h, w, _ = enc.image

            def encode(p, x):
                return jax.lax.map(lambda f: enc.fn(p, f),
                                   x.reshape(-1, microbatch, x.shape[-1])).reshape(
                    x.shape[0], -1)

            x = gpu_target.abstract(jax.ShapeDtypeStruct((frames, h * w * 3), jnp.float32), dev)
            return jax.jit(encode).lower(params, x).compile(opts or None), {}

    return Spec(what, build, "frames", frames,
                lambda rows: {"micro-batch": max(rows, key=lambda r: r["kernels"])}
                if rows else {})


PPO = {  # name: (what, env, policy); the `gpu` presets' sizes at `@N` envs (1,024 without)
    "ppo-symbolic": ("PPO, `gpu` preset: Craftax-Symbolic, {n:,} envs x 64 steps, 4 x 8 "
                     "minibatches, width 512, reset pool 64, 8 worlds a step",
                     "Craftax-Symbolic-v1", "mlp"),
    "ppo-classic": ("PPO, `gpu` preset on Craftax-Classic-Symbolic, {n:,} envs",
                    "Craftax-Classic-Symbolic-v1", "mlp"),
    "ppo-pixels": ("PPO, `gpu-pixels` preset: Craftax-Pixels, the CNN at width 512, {n:,} envs "
                   "x 64 steps, 4 x 8 minibatches", "Craftax-Pixels-v1", "cnn"),
}


def spec_of(name: str) -> Spec | None:
    """A program by name; `ppo-symbolic@4096` (any of PPO's) at another env count."""
    base, _, n = name.partition("@")
    if base in PPO and (not n or n.isdigit() and int(n) > 0):
        what, env, kind = PPO[base]
        n = int(n or 1024)
        return ppo_spec(what.format(n=n), env, n, 64, 8, kind=kind)
    return programs().get(name)


def programs() -> dict[str, Spec]:
    """The report's programs: the presets' PPO chunks, the measured configurations (their rows
    in bench/gpu_predict.py), the LLM programs."""
    sym = "Craftax-Symbolic-v1"
    return {
        **{name: spec_of(name) for name in PPO},
        "ppo-symbolic-bench": ppo_spec("PPO as bench/ppo_sps.py times it: Craftax-Symbolic, "
                                       "1,024 envs, reset pool 16, 1 world a step", sym, 1024,
                                       16, 1),
        "fused-0.6b": fused_spec("LLM-augmented PPO as bench/fused_sps.py: Classic, 1,024 envs "
                                 "x 50 steps, Qwen3-0.6B shape (28 layers), skip 25, bf16",
                                 "qwen3-0.6b", None, 1024, 0.22),
        "fused-0.6b-128": fused_spec("the same at 128 envs", "qwen3-0.6b", None, 128, 0.2),
        "fused-4b": fused_spec("the same with the Qwen3-4B shape to layer 24, 1,024 envs",
                               "qwen3-4b", 24, 1024, 0.22),
        "decode-4b-b1": decode_spec("decode, Qwen3-4B shape, bf16, batch 1, 512-token prefix, "
                                    "32-token prompts, 8 steps a check", "qwen3-4b", 1),
        "decode-4b-b8": decode_spec("the same at batch 8", "qwen3-4b", 8),
        "decode-30b-b1": decode_spec("decode, Qwen3-30B-A3B shape, batch 1 (experts gathered)",
                                     "qwen3-30b-a3b", 1),
        "encode-30b-32x256": encode_spec("encode, Qwen3-30B-A3B shape, 32 x 256 tokens causal, "
                                         "tiled experts", "qwen3-30b-a3b", 32, 256),
        "encode-30b-32x512": encode_spec("the same at 32 x 512 tokens", "qwen3-30b-a3b", 32,
                                         512),
        "vl-4b": vl_spec("Qwen3-VL-4B shape: 1,024 Craftax-Pixels frames to pooled states, "
                         "micro-batches of 128", "qwen3-vl-4b", 1024, 128),
    }


# ------------------------------------------------------------------ rows


def keep_file(file: str) -> bool:
    """Frames worth naming: ours and Craftax's, not jax's or the standard library's."""
    return any(p in file for p in ("/fused/", "/llm_jax/", "/kernels/", "/craftax/"))


def short(where: str) -> str:
    """A source location without its site-packages or checkout folder."""
    return re.sub(r"\S*/site-packages/|" + re.escape(str(ROOT) + "/"), "", where)


def profile(counts: Counter) -> list[list]:
    """[kind, bytes, flops, math, launches] per distinct kernel cost, most launches first."""
    merged: Counter = Counter()
    for k, c in counts.items():
        merged[(k.kind, k.bytes, k.flops, k.math)] += c
    return [[*key, round(c, 4)] for key, c in merged.most_common() if c]


def program_row(name: str, spec: Spec, target: str, device, command_buffers: bool,
                hlo_dir: str | None = None) -> dict:
    t0 = time.perf_counter()
    compiled, details = spec.compile(device, None)
    compile_s = time.perf_counter() - t0
    text = compiled.as_text()
    if hlo_dir:
        Path(hlo_dir).mkdir(parents=True, exist_ok=True)
        (Path(hlo_dir) / f"{name}.{target}.hlo.txt").write_text(text)
    row = {"name": name, "what": spec.what, "target": target, "compile_s": round(compile_s, 1),
           **accounting(spec, text), **gpu_target.memory(compiled, target), **details}
    if command_buffers:
        row["command_buffers"] = command_buffer_rows(spec, device)
    return row


def accounting(spec: Spec, text: str) -> dict:
    """A compiled program's kernel accounting (its text): the run's kernels, the named loops'
    with where their copies come from, and the profile of what the measurement times."""
    prog = hlo_cost.parse(text)
    named = spec.loop_names(hlo_cost.loops(prog, spec.weights))
    inexact: list = []  # loops of unknown trip count: counted once
    run = hlo_cost.launches(prog, prog.entry, spec.weights, inexact)
    loops = {}
    for label, r in named.items():
        copies = hlo_cost.copy_sources(prog, r["body"], keep_file, spec.weights)
        loops[label] = {k: r[k] for k in ("loop", "trip_count", "kernels", "kernels_min",
                                          "kernels_max", "exact", "by_kind", "bytes", "flops")}
        loops[label]["copies_from"] = [[short(w), c] for w, c in copies.most_common(12)]
    if spec.measured_loop:
        measured = hlo_cost.launches(prog, named[spec.measured_loop]["body"], spec.weights)
        units = 1.0
    else:
        measured, units = run, spec.per_run
    return {"unit": spec.unit, "per_run": spec.per_run,
            "run": dict(hlo_cost.summary(run), loops_counted_once=len(inexact)),
            "loops": loops, "profile_units": units, "profile": profile(measured)}


def command_buffer_rows(spec: Spec, device) -> dict:
    """The program's thunks as XLA:GPU would run them, compiled again under each CUDA graphs
    setting (llm_jax/graphs.py: XLA's default, loops in the graphs, loops unrolled into them)."""
    from llm_jax.graphs import GRAPHS, compiler_options

    out = {}
    for label, opts in ((g, compiler_options(g)) for g in GRAPHS):
        with tempfile.TemporaryDirectory() as d:
            spec.compile(device, dict(opts, xla_dump_to=d))
            out[label] = gpu_target.thunk_summary(d)
    return out


def commit() -> str:
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="gpu_target.py report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="h200", choices=tuple(gpu_target.TARGETS))
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="these programs (default: all; ppo-*@N: at N envs): "
                         + ", ".join(programs()))
    ap.add_argument("--command-buffers", action="store_true",
                    help="also compile each under every CUDA graphs setting (4x the time)")
    ap.add_argument("--out", help="JSON rows (programs not compiled this run are kept)")
    ap.add_argument("--hlo-dir", help="also write each compiled program's text here")
    ap.add_argument("--reuse", action="store_true",
                    help="account again from --hlo-dir's texts, memory and compile time kept "
                         "from --out's rows, nothing compiled")
    ap.add_argument("--commit", default=None,
                    help="the commit of the code compiled (default: this checkout's HEAD)")
    a = ap.parse_args(argv)
    specs = {n: spec_of(n) for n in a.only} if a.only else programs()
    unknown = [n for n, s in specs.items() if s is None]
    if unknown:
        raise SystemExit(f"error: --only {' '.join(unknown)}: not a program; one of "
                         f"{', '.join(programs())} (a PPO one at N envs: NAME@N)")
    device = None if a.reuse else gpu_target.use(a.target)
    old = {}
    if a.out and Path(a.out).is_file():
        old = {r["name"]: r for r in json.loads(Path(a.out).read_text())}
    for name in a.only or list(specs):
        saved = Path(a.hlo_dir or ".") / f"{name}.{a.target}.hlo.txt"
        if a.reuse:
            if not saved.is_file() or name not in old:
                print(f"{name}: skipped: no {saved}, or no row of it in --out, to reuse")
                continue
            row = dict(old[name], **accounting(specs[name], saved.read_text()))
        else:
            try:
                row = program_row(name, specs[name], a.target, device, a.command_buffers,
                                  a.hlo_dir)
            except Exception as e:  # one program's failure leaves the others' rows
                row = {"name": name, "what": specs[name].what, "target": a.target,
                       "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
            row["commit"] = a.commit or commit()
        old[name] = row
        print(table_line(row), flush=True)
        if a.out:  # a row a line
            Path(a.out).write_text("[\n" + ",\n".join(json.dumps(r) for r in old.values())
                                   + "\n]\n")


def table_line(row: dict) -> str:
    if "error" in row:
        return f"{row['name']}: error {row['error']}"
    parts = [f"{row['name']}: peak {row.get('peak_gb', 0):.2f} GB, {row['compile_s']:.0f} s"]
    for label, r in row["loops"].items():
        kinds = ", ".join(f"{v:,.0f} {k}" for k, v in r["by_kind"].items())
        parts.append(f"{label}: {r['kernels']:,.0f} kernels ({kinds}; lightest branches "
                     f"{r['kernels_min']:,.0f}), {r['bytes'] / 1e6:,.1f} MB, "
                     f"{r['flops'] / 1e9:,.2f} GFLOP")
    run = row["run"]
    parts.append(f"run: {run['kernels']:,.0f} kernels, {run['bytes'] / 1e9:,.2f} GB, "
                 f"{run['flops'] / 1e12:,.3f} TFLOP per {row['per_run']:,.0f} {row['unit']}")
    return "\n  ".join(parts)


if __name__ == "__main__":
    main()
