"""A preset's learning curve over several seeds: `python bench/learning_curve.py --preset cpu
--seeds 0 1 2 --out F.json`. Each seed runs the pure `Trainer.train` jitted once (compiled once,
reused). Seeds run one after another: `jax.vmap` over seeds of the Classic `cpu` preset
deadlocks inside XLA's CPU runtime with jax 0.10.2 (the `smoke` preset vmaps fine).

Writes per-seed rows (seed, update, env_steps, episodes, return) as JSON, a PNG beside it, and
prints first-decile vs last-decile mean return per seed.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Literal

import numpy as np
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclasses.dataclass(frozen=True)
class Args:
    preset: str = "cpu"
    """Preset from train.py to run."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds, trained one after another with the same compiled program."""
    out: str = "docs/cpu_preset_curve.json"
    """JSON rows; the PNG goes beside it."""
    impl: Literal["craftax", "fast"] | None = None
    """The env's step (`--env.impl`); default the preset's. The same seeds with `craftax` and
    `fast` give the same curve where the fast step equals Craftax's."""


def main(args: Args):
    import jax

    from fused.commands.train import PRESETS, validate
    from fused.commands.train import build
    from fused.commands.process import setup_compilation_cache
    from fused.runs.files import atomic_path, atomic_write_json

    setup_compilation_cache()
    cfg = PRESETS[args.preset][1]
    if args.impl is not None:
        cfg = dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, impl=args.impl))
    validate(cfg)
    train = jax.jit(build(cfg).trainer.train)
    t = time.time()
    per_seed = []
    for s in args.seeds:
        _, metrics = jax.block_until_ready(train(jax.random.PRNGKey(s), None))
        per_seed.append(jax.device_get(metrics["episodes"]))
        print(f"seed {s} done at {time.time() - t:.0f}s", flush=True)
    wall = time.time() - t
    ep = {k: np.stack([m[k] for m in per_seed]) for k in per_seed[0]}
    rows = []
    for i, seed in enumerate(args.seeds):
        for u in range(cfg.num_updates):
            n = int(ep["episodes"][i, u])
            rows.append({"seed": seed, "update": u + 1, "env_steps": (u + 1) * cfg.steps_per_update,
                         "episodes": n,
                         "return": float(ep["return_sum"][i, u]) / n if n else None})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, {"preset": args.preset, "impl": cfg.env.impl,
                            "wall_s_incl_compile": wall,
                            "seeds": list(args.seeds), "rows": rows}, indent=None)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    dec = max(1, cfg.num_updates // 10)
    for seed in args.seeds:
        r = [x for x in rows if x["seed"] == seed and x["return"] is not None]
        if not r:
            print(f"seed {seed}: no episode finished")
            continue
        steps = np.array([x["env_steps"] for x in r])
        ret = np.array([x["return"] for x in r])
        k = max(1, len(ret) // 40)
        ax.plot(steps[k - 1:], np.convolve(ret, np.ones(k) / k, "valid"), label=f"seed {seed}")
        first, last = np.mean(ret[:dec]), np.mean(ret[-dec:])
        print(f"seed {seed}: mean return first 10% {first:.2f} -> last 10% {last:.2f}")
    ax.set(xlabel="env steps", ylabel="episode return",
           title=f"{cfg.env.name}, preset {args.preset} ({len(args.seeds)} seeds)")
    ax.legend()
    fig.tight_layout()
    with atomic_path(out.with_suffix(".png")) as tmp:
        fig.savefig(tmp, dpi=90)
    print(f"{len(args.seeds)} seeds x {cfg.num_updates * cfg.steps_per_update:,} steps in "
          f"{wall:.0f}s (incl. compile) -> {out}, {out.with_suffix('.png')}")


if __name__ == "__main__":
    main(tyro.cli(Args))
