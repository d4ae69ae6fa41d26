"""`offline.py study`: the research question for one dataset and model, answered alike for every
variant. Trains plain and LLM-augmented AWR (and BC) on the same data with several seeds each,
evaluates every policy on the same episode seeds (whole episodes), and the behaviour policy
too when the dataset names a run folder, then writes `study.json` and `study.md`: per variant
the mean return over seeds with a 95% confidence interval (over the pooled episodes), per-seed
means, and the ratio to the behaviour policy; and `study.png`, the same means and intervals as
bars, grouped by algorithm, one colour per label set.

Every run is its own run folder under the study folder; a study started again skips the runs
that finished and the evaluations already written, so it resumes after a kill.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Literal

import numpy as np

from fused.errors import ConfigError
from fused.rl.config import PolicyConfig
from fused.commands.offline_eval import EvalConfig, evaluate
from fused.commands.offline_train import PRESETS, build, train, validate
from fused.rl.evaluate import ci_text, mean_ci95
from fused.runs.files import atomic_write, atomic_write_json, require_writable
from fused.runs.metrics import save_figure
from fused.runs.run_dir import RunDir


@dataclasses.dataclass(frozen=True)
class StudyPolicy:
    """The network of every variant: the preset's, with what is given here changed."""

    kind: Literal["auto", "mlp", "cnn", "gru"] = "auto"
    """As train.py's --policy.kind (`auto`: the CNN on frames, the MLP on vectors); `gru`: the
    recurrent policy, with the preset's --seq-len / --burn-in."""
    layer_width: int | None = None
    """Override the preset's hidden width."""
    num_layers: int | None = None
    """Override the preset's hidden layers."""

    def over(self, preset: PolicyConfig) -> PolicyConfig:
        given = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return dataclasses.replace(preset, **given)


@dataclasses.dataclass(frozen=True)
class StudyConfig:
    data: str
    """Dataset folder (with a returns set)."""
    labels: tuple[str, ...] = ()
    """Label sets, each an augmented variant beside the plain one (prompt-only and imagination
    sets side by side: `--labels l24 im24`); none compares the algorithms without an LLM."""
    returns: str | None = None
    """Returns set; default the dataset's only one."""
    out: str = "runs/study"
    """Study folder (one run folder per variant and seed, study.json, study.md)."""
    preset: str = "cpu"
    """offline.py preset the runs train with (cpu, smoke, gpu)."""
    num_updates: int | None = None
    """Override the preset's updates."""
    lr: float | None = None
    """Override the preset's learning rate."""
    beta: float | None = None
    """Override the AWR temperature."""
    policy: StudyPolicy = StudyPolicy()
    """Network of every variant (`--policy.kind gru`: the recurrent policy)."""
    algos: tuple[str, ...] = ("awr", "bc")
    """Algorithms, each trained plain and with each of --labels."""
    seeds: int = 3
    """Training seeds per variant."""
    episodes: int = 128
    """Evaluation episodes per policy (the same episode seeds for every policy)."""
    eval_seed: int = 1000
    """Seed of the evaluation episodes."""
    max_steps: int | None = None
    """Evaluation step cap (episodes still running are censored); None plays them out."""
    behaviour: bool = True
    """Also evaluate the dataset's behaviour policy when it is a run folder that still exists."""


def variants(c: StudyConfig) -> list[tuple[str, str | None]]:
    return [(a, lab) for a in c.algos for lab in (None, *c.labels)]


def run_study(c: StudyConfig, console) -> dict:
    if c.preset not in PRESETS:
        raise ConfigError(f"preset={c.preset!r}; choose one of {', '.join(PRESETS)}")
    if c.seeds <= 0 or c.episodes <= 1:
        raise ConfigError("seeds must be positive and episodes at least 2")
    bad = [a for a in c.algos if a not in ("awr", "bc")]
    if bad:
        raise ConfigError(f"algos={bad}: choose among awr, bc")
    if len(set(c.labels)) < len(c.labels) or "plain" in c.labels:
        raise ConfigError(f"labels={list(c.labels)}: name each label set once ('plain' is the "
                          "variant without one)")
    root = Path(c.out).expanduser()
    require_writable(root, "--out")
    base = PRESETS[c.preset][1]
    overrides = {k: getattr(c, k) for k in ("num_updates", "lr", "beta")
                 if getattr(c, k) is not None}
    base = dataclasses.replace(base, policy=c.policy.over(base.policy), **overrides)
    ev = EvalConfig(run="", episodes=c.episodes, seed=c.eval_seed, max_steps=c.max_steps)
    results: dict = {"config": dataclasses.asdict(c), "variants": {}}
    for algo, labels in variants(c):
        name = f"{algo}-{labels or 'plain'}" + ("-gru" if c.policy.kind == "gru" else "")
        per_seed = []
        for seed in range(c.seeds):
            cfg = dataclasses.replace(base, data=c.data, labels=labels, returns=c.returns,
                                      algo=algo, seed=seed, out_dir=str(root),
                                      run_name=f"{name}-s{seed}")
            validate(cfg)
            run_path = root / cfg.run_name
            if not _finished(run_path, cfg.num_updates):
                console.print(f"[bold]study[/] training {name} seed {seed}")
                run = (RunDir.reopen(run_path) if (run_path / "config.json").is_file()
                       else RunDir.create(str(root), cfg.run_name))
                train(build(dataclasses.replace(cfg, resume=str(run_path) if run.resuming
                                                else None)), run, console)
            per_seed.append(_evaluated(run_path, ev, console))
        results["variants"][name] = dict(summarise(per_seed), algo=algo,
                                         labels=labels or "plain")
    behaviour = _behaviour(c, ev, root, console)
    if behaviour is not None:
        results["behaviour"] = behaviour
        for v in results["variants"].values():  # no ratio to a behaviour return of 0
            v["vs_behaviour"] = (v["return_mean"] / behaviour["return_mean"]
                                 if behaviour["return_mean"] else None)
    atomic_write_json(root / "study.json", results)
    atomic_write(root / "study.md", table(results))
    save_figure(study_figure(results)[0], root / "study.png", dpi=100)
    console.print(table(results))
    return results


def _finished(run_path: Path, num_updates: int) -> bool:
    ckpts = run_path / "checkpoints"
    return ckpts.is_dir() and (ckpts / str(num_updates)).is_dir()


def _evaluated(run_path: Path, ev: EvalConfig, console) -> dict:
    path = run_path / "eval.json"
    if path.is_file():
        saved = json.loads(path.read_text())
        if saved.get("seed") == ev.seed and saved.get("episodes") == ev.episodes:
            return saved
    return evaluate(dataclasses.replace(ev, run=str(run_path)), console)


def _behaviour(c: StudyConfig, ev: EvalConfig, root: Path, console) -> dict | None:
    from fused.data.store import Dataset

    policy = Dataset(c.data).card().get("policy")
    if not c.behaviour or policy in (None, "random") or not Path(policy).is_dir():
        return None
    out = root / "behaviour_eval.json"
    if out.is_file():
        saved = json.loads(out.read_text())
        if saved.get("seed") == ev.seed and saved.get("episodes") == ev.episodes:
            return summarise([saved])
    return summarise([evaluate(dataclasses.replace(ev, run=policy, out=str(out)), console)])


def summarise(evals: list[dict]) -> dict:
    """Mean return over all episodes of all seeds with its 95% CI, and per-seed means."""
    pooled = np.concatenate([e["returns"] for e in evals])
    m, lo, hi = mean_ci95(pooled)
    names = evals[0]["achievements"]
    return {"return_mean": m, "return_ci95": [lo, hi],
            "seed_means": [e["return_mean"] for e in evals],
            "length_mean": float(np.mean([e["length_mean"] for e in evals])),
            "episodes": int(len(pooled)), "censored": int(sum(e["censored"] for e in evals)),
            "runs": [e["run"] for e in evals],
            "achievements": {k: float(np.mean([e["achievements"][k] for e in evals]))
                             for k in names}}


def table(results: dict) -> str:
    rows = ["| variant | mean return | 95% CI | per seed | vs behaviour | episodes |",
            "|---|---|---|---|---|---|"]
    items = list(results["variants"].items())
    if "behaviour" in results:
        items = [("behaviour policy", results["behaviour"])] + items
    for name, v in items:
        lo, hi = v["return_ci95"]
        seeds = ", ".join(f"{x:.2f}" for x in v["seed_means"])
        ratio = f"{v['vs_behaviour']:.2f}x" if v.get("vs_behaviour") is not None else "-"
        rows.append(f"| {name} | {v['return_mean']:.2f} | {ci_text(lo, hi)} | {seeds} | {ratio} "
                    f"| {v['episodes']} |")
    return "\n".join(rows) + "\n"


def study_figure(results: dict):
    """(figure, {row name: its `BarContainer`}) of `table`'s rows: each bar the mean return, its
    error bar the 95% interval; the behaviour policy first (grey), then per algorithm a group of
    bars, one colour per label set ('plain' the first)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = results["variants"]
    sets = list(dict.fromkeys(v.get("labels", "plain") for v in variants.values()))
    algos = list(dict.fromkeys(v.get("algo", name) for name, v in variants.items()))
    colours = {s: f"C{i}" for i, s in enumerate(sets)}
    width = 0.8 / len(sets)
    places = []  # (row name, x, colour, legend label)
    if "behaviour" in results:
        places.append(("behaviour policy", -1.0, "0.6", None))
    for i, algo in enumerate(algos):
        for name, v in variants.items():
            if v.get("algo", name) == algo:
                j = sets.index(v.get("labels", "plain"))
                places.append((name, i + (j - (len(sets) - 1) / 2) * width,
                               colours[sets[j]], sets[j]))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 + 0.5 * len(places)), 3.8))
    bars, labelled = {}, set()
    for name, x, colour, label in places:
        v = results["behaviour"] if name == "behaviour policy" else variants[name]
        m, (lo, hi) = v["return_mean"], v["return_ci95"]
        err = [[m - lo], [hi - m]] if lo is not None and hi is not None else None
        bars[name] = ax.bar(x, m, width, color=colour, yerr=err, capsize=3,
                            label=None if label in labelled else label)
        labelled.add(label)
        ax.annotate(f"{m:.2f}", (x, m), xytext=(0, 2), textcoords="offset points",
                    ha="center", va="bottom" if m >= 0 else "top", fontsize=7)
    ticks = ([-1.0] if "behaviour" in results else []) + list(range(len(algos)))
    ax.set_xticks(ticks, (["behaviour"] if "behaviour" in results else []) + algos)
    ax.axhline(0, color="0.3", linewidth=0.6)
    ax.set_ylabel("mean return (95% CI)")
    first = next(iter(variants.values()), {})
    ax.set_title(f"{len(variants)} variants, {first.get('episodes', 0)} episodes each",
                 fontsize=9)
    ax.legend(fontsize=7, title="label set", title_fontsize=7)
    return fig, bars
