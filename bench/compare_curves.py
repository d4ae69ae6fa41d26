"""Learning curves of several presets at equal env steps, from `bench/learning_curve.py`'s JSON:
`python bench/compare_curves.py A.json B.json ... --out F.json` writes one row per preset (mean
return over the last 10% of updates per seed, their mean and a 95% interval across seeds, and
the ratio to the first preset) and a PNG beside F of the seed-averaged curves.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclasses.dataclass(frozen=True)
class Args:
    curves: tuple[str, ...]
    """learning_curve.py JSON files; the first is the baseline of the ratios."""
    out: str
    """JSON rows; the PNG goes beside it."""
    last: float = 0.1
    """Share of the last updates averaged per seed."""


def per_seed(rows: list[dict], last: float) -> tuple[dict, np.ndarray, np.ndarray]:
    """{seed: mean return over its last updates}, env steps [U], seed-mean curve [U]."""
    seeds = sorted({r["seed"] for r in rows})
    updates = max(r["update"] for r in rows)
    ret = np.full((len(seeds), updates), np.nan)
    steps = np.zeros(updates)
    for r in rows:
        if r["return"] is not None:
            ret[seeds.index(r["seed"]), r["update"] - 1] = r["return"]
        steps[r["update"] - 1] = r["env_steps"]
    k = max(1, int(updates * last))
    seen = ~np.isnan(ret).all(0)  # updates where some seed finished an episode
    mean = np.full(updates, np.nan)
    mean[seen] = np.nanmean(ret[:, seen], axis=0)
    return {s: float(np.nanmean(ret[i, -k:])) for i, s in enumerate(seeds)}, steps, mean


def main(a: Args):
    from fused.rl.evaluate import mean_ci95
    from fused.runs.files import atomic_path, atomic_write_json

    out, curves = [], []
    for path in a.curves:
        d = json.loads(Path(path).read_text())
        finals, steps, mean = per_seed(d["rows"], a.last)
        m, lo, hi = mean_ci95(np.array(list(finals.values())))
        out.append({"preset": d["preset"], "seeds": finals, "last_return_mean": m,
                    "last_return_ci95": [lo, hi], "env_steps": int(steps[-1]),
                    "wall_s_incl_compile": d["wall_s_incl_compile"]})
        out[-1]["vs_first"] = m / out[0]["last_return_mean"]
        curves.append((d["preset"], steps, mean))
        print(f"{d['preset']}: last {a.last:.0%} mean return {m:.2f} [{lo:.2f}, {hi:.2f}] "
              f"(seeds {', '.join(f'{v:.2f}' for v in finals.values())}), "
              f"{out[-1]['vs_first']:.2f}x {out[0]['preset']}", flush=True)
    atomic_write_json(a.out, out)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, steps, mean in curves:
        k = max(1, len(mean) // 40)
        ok = ~np.isnan(mean)
        ax.plot(steps[ok][k - 1:], np.convolve(mean[ok], np.ones(k) / k, "valid"), label=name)
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean episode return (seed mean)")
    ax.legend()
    fig.tight_layout()
    with atomic_path(Path(a.out).with_suffix(".png")) as tmp:
        fig.savefig(tmp, format="png")


if __name__ == "__main__":
    main(tyro.cli(Args))
