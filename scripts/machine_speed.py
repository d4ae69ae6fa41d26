"""How fast this machine runs work like the test suite's, as seconds of a fixed reference job.

The suite's time is mostly tracing and compiling JAX programs (docs/development.md;
docs/BENCHMARKS.md's "Test suite"), and 2-core VMs of one kind ran nearly the same suite more
than twice as long on one day as on another. `.ci/run` times this job before and after the suite
and scales the suite's time to the machine its budget is stated for (`judge`), so the budget
means the same on a slow VM as on a fast one.

The job uses only jax and craftax (the pinned dependencies, not this project's code, so a change
to the project does not change the yardstick): in each of `--procs` processes at once (as the
suite's workers), it traces and compiles a scanned Craftax-Classic reset and step and a small
MLP's gradient step at the suite's XLA flags, with no compilation cache, then runs them. It
prints one JSON line, {"seconds": wall seconds, "procs": N}, or with --seconds the seconds alone.
Craftax's texture caches must exist first (`.ci/run` builds them before), or both processes build
them at once.

    python scripts/machine_speed.py [--procs 2] [--seconds]
    python scripts/machine_speed.py judge --suite S [--speed A B] [--limit 1200] [--fail-over 1]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

# This job's seconds (2 processes) on the machine the suite's budget is stated for: CI's 2 cores
# in its run of f733a5b (docs/BENCHMARKS.md, "Test suite": 1,304 s). Not timed there: estimated
# through one VM, where the whole suite at 7d35376 took 2,909 s, 2.23x that run, and this job
# 49.7 s before it and 53.1 s after (f733a5b's tests but test_fast_step's parity made smaller:
# about 20 s less there, so 23.0 s is if anything a little strict).
REFERENCE_SECONDS = 23.0
# The suite's compile flags (tests/conftest.py's FAST_COMPILE).
FLAGS = ("--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false "
         "--xla_cpu_parallel_codegen_split_count=1 --xla_disable_hlo_passes=hlo-verifier")


def job() -> None:
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    import jax.numpy as jnp
    from craftax.craftax_env import make_craftax_env_from_name

    env = make_craftax_env_from_name("Craftax-Classic-Symbolic-v1", auto_reset=True)
    params = env.default_params

    for num_envs in (4, 5):  # two shapes: two programs to trace and compile
        def rollout(key, num_envs=num_envs):
            keys = jax.random.split(key, num_envs)
            obs, state = jax.vmap(env.reset, (0, None))(keys, params)

            def step(carry, key):
                state, total = carry
                k_act, k_step = jax.random.split(key)
                actions = jax.random.randint(k_act, (num_envs,), 0, env.action_space(params).n)
                obs, state, reward, done, _ = jax.vmap(env.step, (0, 0, 0, None))(
                    jax.random.split(k_step, num_envs), state, actions, params)
                return (state, total + reward.sum() + obs.sum()), None

            (state, total), _ = jax.lax.scan(step, (state, 0.0), jax.random.split(key, 64))
            return total

        jax.block_until_ready(jax.jit(rollout)(jax.random.key(num_envs)))

    def loss(ws, x):
        h = x
        for w in ws:
            h = jnp.tanh(h @ w)
        return (h ** 2).mean()

    @jax.jit
    def update(ws, x):
        grads = jax.grad(loss)(ws, x)
        return [w - 0.01 * g for w, g in zip(ws, grads)]

    sizes = [1345, 512, 512, 512, 43]
    ws = [jax.random.normal(jax.random.key(i), (a, b)) * 0.05
          for i, (a, b) in enumerate(zip(sizes, sizes[1:]))]
    x = jax.random.normal(jax.random.key(9), (256, sizes[0]))
    for _ in range(20):
        ws = update(ws, x)
    jax.block_until_ready(ws)


def judge(suite: float, speeds: list[float], limit: float, fail_over: float) -> int:
    """Prints the suite's time here and on the budget's machine (scaled by the reference job's
    seconds there over its mean here; unscaled where the job gave no time) against `limit`; a
    warning over it, and 1 (CI fails) over `limit * fail_over`."""
    if speeds:
        scaled = round(suite * REFERENCE_SECONDS / (sum(speeds) / len(speeds)))
        print(f"suite: {suite:.0f} s here; the reference job took "
              f"{', '.join(f'{s:.1f}' for s in speeds)} s ({REFERENCE_SECONDS:.1f} s on the "
              f"budget's machine), so {scaled} s there (budget {limit:.0f} s)")
    else:
        scaled = round(suite)
        print(f"suite: {suite:.0f} s here (budget {limit:.0f} s); warning: the reference job gave "
              "no time, so this machine's seconds are judged as the budget's machine's")
    over = f"{scaled - limit:.0f} s ({scaled / limit - 1:.1%}) over its {limit:.0f} s budget"
    if scaled > limit * fail_over:
        print(f"error: the suite would take {scaled} s on the budget's machine, {over}"
              + (f" (CI fails past {fail_over - 1:.0%})" if fail_over > 1 else "")
              + "; see --durations above", file=sys.stderr)
        return 1
    if scaled > limit:
        print(f"warning: the suite would take {scaled} s on the budget's machine, {over}; "
              "see --durations above")
    return 0


def main() -> None:
    if sys.argv[1:2] == ["judge"]:
        parser = argparse.ArgumentParser(prog="machine_speed.py judge")
        parser.add_argument("--suite", type=float, required=True, help="the suite's seconds")
        parser.add_argument("--speed", type=float, nargs="*", default=[],
                            help="this job's seconds, timed beside the suite (none: not scaled)")
        parser.add_argument("--limit", type=float, default=1200, help="the budget (seconds)")
        parser.add_argument("--fail-over", type=float, default=1.0,
                            help="CI fails past this multiple of the budget")
        args = parser.parse_args(sys.argv[2:])
        if args.suite < 0:
            sys.exit(f"error: --suite {args.suite:g}: seconds can not be negative")
        if args.speed and min(args.speed) <= 0:
            sys.exit(f"error: --speed {args.speed}: seconds must be positive")
        if args.limit <= 0:
            sys.exit(f"error: --limit {args.limit:g}: seconds must be positive")
        if args.fail_over < 1:
            sys.exit(f"error: --fail-over {args.fail_over}: at least 1 (the budget itself)")
        sys.exit(judge(args.suite, args.speed, args.limit, args.fail_over))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=2,
                        help="processes at once (the suite's workers)")
    parser.add_argument("--seconds", action="store_true", help="print the seconds alone")
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        job()
        return
    if args.procs < 1:
        sys.exit("error: --procs must be at least 1")
    env = dict(os.environ, XLA_FLAGS=FLAGS, JAX_PLATFORMS="cpu")
    start = time.perf_counter()
    # Ctrl-C is the parent's (it stops the jobs). Each job starts with SIGINT ignored, which
    # Python keeps from its first instruction on (a handler set in the job would come after its
    # imports, where a Ctrl-C printed a fatal error). While the jobs start, SIGINT is blocked
    # here: a Ctrl-C then (inside Popen, past its try) would leave a started job unknown to the
    # `finally` below; it stays pending and arrives, as KeyboardInterrupt, once they all exist.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})

    def start_job():  # (in the job, between fork and exec: ignored, then the mask as it was)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    procs = []
    try:
        for _ in range(args.procs):
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--job"], env=env,
                stdout=subprocess.DEVNULL,  # (one line on stdout: this one's)
                preexec_fn=start_job))
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # (a pending Ctrl-C is raised here)
        codes = [p.wait() for p in procs]
    except KeyboardInterrupt:
        print("interrupted: the reference job stopped, nothing timed", file=sys.stderr)
        sys.exit(130)
    finally:  # (no job left running)
        for p in procs:
            if p.poll() is None:
                p.kill()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    seconds = time.perf_counter() - start
    if any(codes):
        sys.exit(f"error: the reference job failed (exit codes {codes})")
    print(round(seconds, 1) if args.seconds else
          json.dumps({"seconds": round(seconds, 1), "procs": args.procs}))


if __name__ == "__main__":
    main()
