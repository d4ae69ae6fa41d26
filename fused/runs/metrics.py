"""Host-side run outputs: metrics JSONL and the learning-curve PNG.

Library code returns metric pytrees; this turns one chunk's worth into rows and writes them.
Every file is written so that a crash never leaves it half-written (append + fsync for the JSONL,
write-then-rename for the rest).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from fused.runs.files import atomic_path, atomic_write


def chunk_rows(metrics: dict, steps_per_update: int, achievement_names, first_update: int,
               last_update: int) -> list[dict]:
    """Rows for updates first_update+1..last_update from a chunk's stacked host metrics."""
    rows = []
    ep = metrics["episodes"]
    for i in range(last_update - first_update):
        u = first_update + i + 1
        n = int(ep["episodes"][i])
        row = {"update": u, "env_steps": u * steps_per_update, "episodes": n,
               "reset_reuse": int(ep["reset_reuse"][i])}
        if n:
            row["return"] = float(ep["return_sum"][i]) / n
            row["length"] = float(ep["length_sum"][i]) / n
            for name, s in zip(achievement_names, ep["achievement_sum"][i]):
                row[f"achievements/{name}"] = float(s) / n
        row.update({k: float(v[i]) for k, v in metrics["ppo"].items()})
        rows.append(row)
    return rows


class RunLog:
    def __init__(self, run_dir: Path, plot: bool = True):
        self.run_dir = run_dir
        self.path = run_dir / "metrics.jsonl"
        self.plot_enabled = plot

    def truncate_after(self, update: int) -> None:
        """Drop rows past `update` (written by a run killed after its last checkpoint)."""
        if not self.path.exists():
            return
        rows = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line)["update"] <= update]
        atomic_write(self.path, "".join(r + "\n" for r in rows))

    def write(self, rows: list[dict]) -> None:
        with open(self.path, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(x) for x in self.path.read_text().splitlines() if x.strip()]

    def plot(self) -> Path | None:
        """Return (smoothed over logged updates) and top achievement rates vs env steps."""
        if not self.plot_enabled:
            return None
        import matplotlib  # (a slow import: plotting only)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [r for r in self.read() if "return" in r]
        if not rows:
            return self._plot_losses(plt)
        steps = np.array([r["env_steps"] for r in rows])
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        ret = np.array([r["return"] for r in rows])
        k = max(1, len(ret) // 50)
        smooth = np.convolve(ret, np.ones(k) / k, mode="valid")
        ax1.plot(steps, ret, alpha=0.3, color="C0")
        ax1.plot(steps[k - 1:], smooth, color="C0")
        ax1.set(xlabel="env steps", ylabel="episode return", title="Return")
        names = [key for key in rows[-1] if key.startswith("achievements/")]
        top = sorted(names, key=lambda n: -np.mean([r.get(n, 0) for r in rows[-10:]]))[:8]
        for n in top:
            rate = np.convolve([100 * r.get(n, 0) for r in rows], np.ones(k) / k, mode="valid")
            ax2.plot(steps[k - 1:], rate, label=n.split("/", 1)[1])
        ax2.set(xlabel="env steps", ylabel="% of episodes (smoothed)", title="Achievement unlock rate")
        if top:
            ax2.legend(fontsize=7)
        return save_figure(fig, self.run_dir / "curve.png")

    def _plot_losses(self, plt) -> Path | None:
        """Runs without episodes (offline training): the loss terms vs update."""
        rows = [r for r in self.read() if "loss/actor" in r]
        if not rows:
            return None
        update = np.array([r["update"] for r in rows])
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        for ax, key in zip(axes, ("loss/actor", "loss/value")):
            ax.plot(update, [r[key] for r in rows])
            ax.set(xlabel="update", ylabel=key, title=key)
        return save_figure(fig, self.run_dir / "curve.png")


def save_figure(fig, path: Path, dpi: int = 90) -> Path:
    """Lay out, write atomically (a reader never sees half a PNG) and close a figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi)
    plt.close(fig)
    return path
