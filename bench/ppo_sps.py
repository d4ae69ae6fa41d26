"""Env-only ceiling vs our PPO, steps/s, in one process: `python bench/ppo_sps.py --out F.json`.

Rows: name, env, num_envs, steps_per_s (median of repeats, timed with block_until_ready),
compile_s (trace + compile of that function, reported apart). Env-only runs a vmapped step with
random actions in a 64-step scan: `env_no_reset` never resets (the ceiling), `env_optimistic`
and `env_auto` use the wrapper's reset modes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fused.commands.process import setup_compilation_cache  # noqa: E402
from fused.runs.files import atomic_write_json  # noqa: E402
from llm_jax.graphs import Graphs  # noqa: E402

import gpu_target  # noqa: E402

device = None  # --target's compile-only device


@dataclasses.dataclass(frozen=True)
class Args:
    env: str = "Craftax-Symbolic-v1"
    """Environment to measure."""
    env_counts: tuple[int, ...] = (64, 256)
    """Env counts for the env-only rows."""
    ppo_env_counts: tuple[int, ...] = (64,)
    """Env counts for the PPO rows (sizes from the flags below, by default the prior config)."""
    reset_pool: int = 16
    """Optimistic reset pool per device."""
    worlds_per_step: int = 1
    """Optimistic reset: worlds generated on steps where an episode ended."""
    repeats: int = 3
    """Timed repeats (median reported)."""
    warmup_scans: int = 8
    """Env-only: untimed 64-step scans first, so episodes are under way and ending."""
    ppo_updates: int = 2
    """Updates per timed PPO chunk."""
    num_steps: int = 64
    """PPO rows: steps per update per env."""
    update_epochs: int = 4
    """PPO rows: epochs per update."""
    num_minibatches: int = 8
    """PPO rows: minibatches per epoch."""
    width: int = 512
    """PPO rows: the network's layer width."""
    impls: tuple[str, ...] = ("craftax",)
    """PPO rows: the env step each is timed with (`--env.impl`: craftax, fast); rows after the
    first impl at an env count and variant carry their ratio to it (`vs_<impl>`)."""
    variants: tuple[str, ...] = ("mlp",)
    """Variants timed at each PPO env count: a policy kind (mlp, gru, cnn on pixel envs),
    optionally with an exploration bonus (`gru`, `mlp+rnd`, `mlp+icm`, `gru+e3b`), and for a CNN
    the convolutions' form last (`cnn@lax`: lax.conv, `cnn+rnd@im2col`: shifted copies and a
    matmul, what XLA:CPU runs by default). Rows after the first carry their ratio to it
    (`vs_<first>`), all from this one run."""
    graphs: tuple[Graphs, ...] = ("loops",)
    """PPO rows: the CUDA graphs settings each is timed with (`--cuda-graphs`: loops, unrolled,
    default; llm_jax/graphs.py; on a CPU the same program each). Rows after the first setting
    carry their ratio to it (`vs_graphs_<first>`) and whether their state after the same chunks
    (warm-up and repeats, from the same start) equals its bit for bit (`equal_to_<first>`); the
    first setting's row says whether it, run once more from that start, equals itself
    (`repeatable`: where it does not, the program is not deterministic on that device and
    `equal_to_<first>` tells nothing)."""
    reference: bool = True
    """Also time the prior system's PPO structure (bench/reference_ppo.py) for a same-run ratio."""
    skip_env: bool = False
    """Only measure PPO."""
    compile_only: bool = False
    """PPO rows: compile the chunk and report its memory (XLA's buffer assignment: arguments,
    outputs, temporaries) without running it, e.g. a GPU's sizes on a CPU."""
    target: str | None = None
    """PPO rows: compile for this GPU (h100, h200) on this machine, XLA:GPU without a device
    (bench/gpu_target.py; implies --compile-only): its memory and its peak against the card's."""
    skip_ppo: bool = False
    """Only measure the env."""
    out: str | None = None
    """Write the rows as a JSON list here."""


def env_rows(args: Args):
    import jax

    from fused.rl.config import EnvConfig
    from fused.rl.envs import make_env
    from fused.rl.vec_env import VecEnv

    rows = []
    for n in args.env_counts:
        for mode in ("no_reset", "optimistic", "auto"):
            cfg = EnvConfig(name=args.env, num_envs=n, reset="auto" if mode == "no_reset" else mode,
                            reset_pool=args.reset_pool, worlds_per_step=args.worlds_per_step)
            env = make_env(cfg)
            venv = VecEnv(env, cfg)
            state = jax.jit(venv.reset)(jax.random.split(jax.random.PRNGKey(0), n),
                                        jax.random.PRNGKey(1))

            def body(s, k, mode=mode, env=env, venv=venv, n=n):
                ka, ks, kp = jax.random.split(k, 3)
                a = jax.random.randint(ka, (n,), 0, env.num_actions)
                keys = jax.random.split(ks, n)
                if mode == "no_reset":
                    res = jax.vmap(env.step)(keys, s.state, a)
                    return s.replace(state=res.state, obs=res.obs), (res.terminated | res.truncated).sum()
                s, out = venv.step(keys, kp, s, a)
                return s, (out.terminated | out.truncated).sum()

            run = jax.jit(lambda s, k: jax.lax.scan(body, s, jax.random.split(k, 64)))
            # Chain scans so episodes end at the random policy's natural rate (fresh episodes
            # would hardly end within one 64-step scan and the resets would go unmeasured).
            t = time.perf_counter()
            state, _ = jax.block_until_ready(run(state, jax.random.PRNGKey(2)))
            compile_s = time.perf_counter() - t
            for i in range(args.warmup_scans):
                state, _ = run(state, jax.random.PRNGKey(100 + i))
            times, ends = [], 0
            for i in range(args.repeats):
                t = time.perf_counter()
                state, done = jax.block_until_ready(run(state, jax.random.PRNGKey(200 + i)))
                times.append(time.perf_counter() - t)
                ends += int(done.sum())
            rows.append({"name": f"env_{mode}", "env": args.env, "num_envs": n,
                         "steps_per_s": 64 * n / statistics.median(times), "compile_s": compile_s,
                         "episode_ends_per_step": ends / (64 * args.repeats)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def digest(tree) -> str:
    """sha256 of a pytree's arrays' bytes, in its leaves' order (PRNG keys by their data)."""
    import hashlib

    import jax
    import numpy as np

    h = hashlib.sha256()
    for x in jax.tree.leaves(tree):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        h.update(np.ascontiguousarray(np.asarray(x)).tobytes())
    return h.hexdigest()


def ppo_rows(args: Args):
    import jax
    import numpy as np

    from fused.commands.train import TrainConfig, validate
    from fused.rl.config import EnvConfig, ExploreConfig, PolicyConfig, PPOConfig
    from fused.commands.train import build
    from fused.rl.sharding import jit_init
    from llm_jax.graphs import GRAPHS, loop_jit

    if set(args.graphs) - set(GRAPHS) or len(set(args.graphs)) < len(args.graphs):
        raise SystemExit(f"--graphs {' '.join(args.graphs)}: each one of {', '.join(GRAPHS)}, "
                         "once")
    rows = []
    for n, variant, impl, graphs in [(n, v, i, g) for n in args.ppo_env_counts
                                     for v in args.variants for i in args.impls
                                     for g in args.graphs]:
        base, _, form = variant.partition("@")
        kind, _, explore = base.partition("+")
        if form not in ("", "lax", "im2col"):
            raise SystemExit(f"variant {variant!r}: the form after @ is lax or im2col "
                             "(e.g. cnn+rnd@lax)")
        cfg = TrainConfig(env=EnvConfig(name=args.env, num_envs=n, reset_pool=args.reset_pool,
                                        worlds_per_step=args.worlds_per_step, impl=impl),
                          ppo=PPOConfig(num_steps=args.num_steps,
                                        update_epochs=args.update_epochs,
                                        num_minibatches=args.num_minibatches),
                          policy=PolicyConfig(kind, layer_width=args.width,
                                              conv=form or "auto"),
                          explore=ExploreConfig(explore or "none"),
                          total_timesteps=n * 64 * 10_000, updates_per_chunk=args.ppo_updates)
        validate(cfg)
        length = np.int32(cfg.num_updates)
        t = time.perf_counter()
        if args.target:  # shapes only, placed on the GPU's compile-only device
            with gpu_target.as_gpu():
                tr = build(cfg).trainer
                state = gpu_target.abstract(
                    jax.eval_shape(tr.init, jax.random.PRNGKey(0), None), device)
                compiled = loop_jit(tr.chunk, graphs).lower(
                    state, None, gpu_target.abstract(length, device)).compile()
        else:
            tr = build(cfg).trainer
            init = jit_init(tr)  # (as train.py makes its first state)
            state = jax.block_until_ready(init(jax.random.PRNGKey(0), None))
            init_s = time.perf_counter() - t
            print(f"# {variant} ({impl}) at {n} envs: init {init_s:.1f} s", file=sys.stderr,
                  flush=True)
            t = time.perf_counter()
            compiled = loop_jit(tr.chunk, graphs).lower(state, None, length).compile()
        compile_s = time.perf_counter() - t
        print(f"# {variant} ({impl}) at {n} envs: compile {compile_s:.1f} s", file=sys.stderr,
              flush=True)
        memory = gpu_target.memory(compiled, args.target)
        if args.compile_only or args.target:
            rows.append({"name": f"ppo_{variant}_memory", "env": args.env, "num_envs": n,
                         "variant": variant, "impl": impl, "graphs": graphs,
                         "num_steps": args.num_steps,
                         "update_epochs": args.update_epochs,
                         "num_minibatches": args.num_minibatches, "width": args.width,
                         "backend": args.target or jax.default_backend(),
                         "compile_s": compile_s, **memory})
            print(json.dumps(rows[-1]), flush=True)
            continue
        state, _ = jax.block_until_ready(compiled(state, None, length))  # warm-up
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            state, _ = jax.block_until_ready(compiled(state, None, length))
            times.append(time.perf_counter() - t)
        dt = statistics.median(times)
        rows.append({"name": "ppo" if variant == "mlp" else f"ppo_{variant}", "env": args.env,
                     "num_envs": n, "variant": variant, "impl": impl, "graphs": graphs,
                     "state_sha256": digest(state), "num_steps": args.num_steps,
                     "update_epochs": args.update_epochs,
                     "num_minibatches": args.num_minibatches, "width": args.width,
                     "steps_per_s": args.ppo_updates * cfg.steps_per_update / dt,
                     "compile_s": compile_s, "init_s": init_s, **memory})
        if len(args.graphs) > 1 and graphs == args.graphs[0]:  # the control: the same chunks
            again = init(jax.random.PRNGKey(0), None)  # from the same start
            for _ in range(1 + args.repeats):
                again, _ = compiled(again, None, length)
            rows[-1]["repeatable"] = digest(jax.block_until_ready(again)) == rows[-1][
                "state_sha256"]
        if graphs != args.graphs[0]:  # (the same program but for its launching)
            same = next(r for r in rows if r["num_envs"] == n and r.get("variant") == variant
                        and r.get("impl") == impl and r.get("graphs") == args.graphs[0])
            first = same["graphs"]
            rows[-1][f"vs_graphs_{first}"] = rows[-1]["steps_per_s"] / same["steps_per_s"]
            rows[-1][f"equal_to_{first}"] = rows[-1]["state_sha256"] == same["state_sha256"]
            print(json.dumps(rows[-1]), flush=True)
            continue
        first = next(r for r in rows if r["num_envs"] == n and r.get("variant")
                     and r.get("graphs") == graphs)
        if first["impl"] != impl:  # (the same variant with the first impl)
            same = next(r for r in rows if r["num_envs"] == n and r.get("variant") == variant
                        and r.get("graphs") == graphs)
            rows[-1][f"vs_{same['impl']}"] = rows[-1]["steps_per_s"] / same["steps_per_s"]
        elif first is not rows[-1]:
            rows[-1][f"vs_{first['variant']}"] = rows[-1]["steps_per_s"] / first["steps_per_s"]
        print(json.dumps(rows[-1]), flush=True)
        if args.reference and variant == "mlp" and impl == args.impls[0]:
            rows.append(reference_row(args, cfg, n))
            print(json.dumps(rows[-1]), flush=True)
            rows[-2]["speedup_vs_reference"] = rows[-2]["steps_per_s"] / rows[-1]["steps_per_s"]
            print(f"ppo / ppo_reference = {rows[-2]['speedup_vs_reference']:.2f}x", flush=True)
    return rows


def reference_row(args: Args, cfg, n: int) -> dict:
    """The prior PPO structure (bench/reference_ppo.py), same config, same process."""
    import jax

    from reference_ppo import make_reference_update

    init, update = make_reference_update(cfg)
    state = jax.block_until_ready(jax.jit(init)(jax.random.PRNGKey(0)))

    def chunk(s):
        return jax.lax.fori_loop(0, args.ppo_updates, lambda i, s: update(s), s)

    t = time.perf_counter()
    compiled = jax.jit(chunk).lower(state).compile()
    compile_s = time.perf_counter() - t
    state = jax.block_until_ready(compiled(state))
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        state = jax.block_until_ready(compiled(state))
        times.append(time.perf_counter() - t)
    return {"name": "ppo_reference", "env": args.env, "num_envs": n,
            "steps_per_s": args.ppo_updates * cfg.steps_per_update / statistics.median(times),
            "compile_s": compile_s}


def main(args: Args):
    global device
    if args.target:
        device = gpu_target.use(args.target)
    import jax

    setup_compilation_cache()
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cpus, jax {jax.__version__}, {jax.devices()[0].device_kind}",
          flush=True)
    rows = [] if args.skip_env or args.target else env_rows(args)  # (env rows: run here)
    rows += [] if args.skip_ppo else ppo_rows(args)
    if args.out:
        atomic_write_json(args.out, rows)
    return rows


if __name__ == "__main__":
    main(tyro.cli(Args))
