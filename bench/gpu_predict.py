"""A GPU program's time predicted from its kernels (bench/gpu_report.py's profiles), calibrated
on the runs we measured on an H200: each kernel takes the longest of a fitted floor (a launch),
its bytes over the card's bandwidth times an efficiency, and its matmul FLOPs over the card's
peak for their input type times an efficiency; a program's time is the sum over its launches
(one stream, nothing overlapped). The efficiencies are fitted too, or the card's own rates
measured beside the rows (VARIANTS): the variant whose left-out rows are predicted best is used.

    python bench/gpu_predict.py --kernels docs/gpu/kernels_h200.json --out docs/gpu/predictor.json

prints every measured row beside its prediction by the fit on all rows and by the fit on the
others (leave one out: the error a new program can expect), the fitted figures, the H100 rows as
a second card's check (never fitted), and writes the fit for `train.py --plan`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_target  # noqa: E402

MEAS = "../shared/measurements/h200-2026-11-26/"
# What we measured, with where it is recorded and the code it ran (jax 0.11.2, CUDA 13 on the
# card; the programs here are compiled from today's code with jax 0.10.2: see BENCHMARKS).
MEASURED = [
    dict(program="ppo-symbolic-bench", target="h200", rate=140_535, commit="ad245fb",
         source=MEAS + "ours_ppo.json"),
    dict(program="fused-0.6b", target="h200", rate=16_964, commit="ad245fb",
         source=MEAS + "fused_1024_pallas.json"),
    dict(program="decode-4b-b1", target="h200", rate=286.4, commit="d99de6d",
         source="docs/gpu/decode_sps_h200_qwen3-4b_20261126.log"),
    dict(program="decode-4b-b8", target="h200", rate=270.3, commit="d99de6d",
         source="docs/gpu/decode_sps_h200_qwen3-4b_20261126.log"),
    dict(program="vl-4b", target="h200", rate=450.2, commit="45800dd",
         source="docs/gpu/gpu_check_h200_20261127_rows.jsonl"),
    dict(program="encode-30b-32x256", target="h200", rate=11_885, commit="d99de6d",
         source="docs/gpu/gpu_check_h200_20261126_rows.jsonl"),
]
CHECKS = [  # another card, never fitted
    dict(program="encode-30b-32x512", target="h100", rate=11_285, commit="not recorded",
         source="docs/gpu/moe_encode_h100_qwen3-30b-a3b_tiled.json"),
    dict(program="fused-0.6b-128", target="h100", rate=10_427, commit="a367b57",
         source="docs/gpu/fused_sps_h100_qwen3-0.6b_128envs_pallas.json"),
]


@dataclasses.dataclass(frozen=True)
class Fit:
    floor_s: float  # the shortest a kernel takes: its launch
    bandwidth_eff: float  # the share of the card's data-sheet bandwidth a kernel gets
    flops_eff: float  # the share of the card's data-sheet matmul peak


def _arrays(profile: list[list], target: str):
    """(launches, seconds at the data-sheet bandwidth, seconds at the data-sheet peak)."""
    bw = gpu_target.TARGETS[target][2]
    peaks = gpu_target.PEAK_FLOPS[target]
    p = [(c, b / bw, (f / peaks.get(m or "f32", peaks["f32"])) if f else 0.0)
         for _, b, f, m, c in profile]
    return tuple(np.array(x, float) for x in zip(*p)) if p else (np.zeros(0),) * 3


def kernel_seconds(arrays, fit: Fit) -> np.ndarray:
    _, mem, math_ = arrays
    return np.maximum(fit.floor_s, np.maximum(mem / fit.bandwidth_eff, math_ / fit.flops_eff))


def seconds(profile: list[list], target: str, fit: Fit) -> float:
    """Predicted seconds of what `profile` counts (a run, or one iteration of a loop)."""
    a = _arrays(profile, target)
    return float((a[0] * kernel_seconds(a, fit)).sum())


def bound_by(profile: list[list], target: str, fit: Fit) -> dict:
    """The predicted time split by what sets each kernel's: launches, bytes or FLOPs."""
    a = _arrays(profile, target)
    t = kernel_seconds(a, fit)
    which = np.where(t == fit.floor_s, 0, np.where(a[1] / fit.bandwidth_eff >= t, 1, 2))
    total = float((a[0] * t).sum()) or 1.0
    return {k: round(float((a[0] * t * (which == i)).sum()) / total, 3)
            for i, k in enumerate(("launches", "bytes", "flops"))}


def rate(row: dict, target: str, fit: Fit) -> float:
    """Predicted units per second of a report row (env steps, decode steps, tokens, frames)."""
    return row["profile_units"] / seconds(row["profile"], target, fit)


# The cards' own figures measured in the H200 sessions (same sources as the rows): a bf16
# matmul's rate (635.6, 658.7, 635.5 TFLOP/s: median over the data sheet's 989.4) and a 4 GiB
# device copy's bytes read plus written a second (2.99, 3.09, 3.60 TB/s: median over 4.8).
MEASURED_EFF = {"flops_eff": 635.6 / 989.4, "bandwidth_eff": 3.094 / 4.8}
VARIANTS = {  # what a fit leaves free; the rest as measured on the card
    "fitted: floor, bandwidth, peak": (),
    "fitted: floor, bandwidth; peak as measured": ("flops_eff",),
    "fitted: floor; peak and bandwidth as measured": ("flops_eff", "bandwidth_eff"),
}


def fit_rows(pairs: list[tuple[dict, dict]], fixed: tuple[str, ...] = ()) -> Fit:
    """The fit minimising the mean squared log error of the predicted rates over
    (measurement, report row) pairs, the `fixed` efficiencies at MEASURED_EFF's: Nelder-Mead in
    log space from a grid of starts."""
    from scipy.optimize import minimize

    arrays = [(_arrays(r["profile"], m["target"]), r["profile_units"], m["rate"])
              for m, r in pairs]
    names = [f.name for f in dataclasses.fields(Fit)]
    free = [n for n in names if n not in fixed]

    def make(x):
        values = dict(MEASURED_EFF, **dict(zip(free, np.exp(x))))
        return Fit(**{n: float(values[n]) for n in names})

    def loss(x):
        f = make(x)
        return sum(math.log(u / float((a[0] * kernel_seconds(a, f)).sum()) / rate_) ** 2
                   for a, u, rate_ in arrays) / len(arrays)

    best = None
    for floor in (1e-6, 3e-6, 1e-5):
        for eff in (0.3, 0.7):
            x0 = np.log([floor if n == "floor_s" else eff for n in free])
            r = minimize(loss, x0, method="Nelder-Mead",
                         options={"xatol": 1e-4, "fatol": 1e-8, "maxiter": 4000})
            best = r if best is None or r.fun < best.fun else best
    return make(best.x)


def pairs_of(measured: list[dict], rows: dict[str, dict]) -> list[tuple[dict, dict]]:
    return [(m, rows[m["program"]]) for m in measured
            if m["program"] in rows and "profile" in rows[m["program"]]]


def leave_one_out(pairs, fixed: tuple[str, ...] = ()) -> list[dict]:
    """Each row predicted by the fit on all rows and by the fit on the others."""
    full = fit_rows(pairs, fixed)
    out = []
    for k, (m, r) in enumerate(pairs):
        rest = fit_rows(pairs[:k] + pairs[k + 1:], fixed)
        p_all, p_loo = rate(r, m["target"], full), rate(r, m["target"], rest)
        out.append({"program": m["program"], "target": m["target"], "unit": r["unit"],
                    "measured": m["rate"], "predicted": p_all, "predicted_left_out": p_loo,
                    "error_left_out": p_loo / m["rate"] - 1, "bound": bound_by(
                        r["profile"], m["target"], full), "source": m["source"],
                    "commit": m["commit"]})
    return out


def median_error(table: list[dict]) -> float:
    return float(np.median([abs(t["error_left_out"]) for t in table]))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", default=str(ROOT / "docs/gpu/kernels_h200.json"),
                    help="bench/gpu_report.py's rows (python bench/gpu_target.py report --out)")
    ap.add_argument("--out", help="write the fit and the rows here (train.py --plan reads it)")
    ap.add_argument("--predict", nargs="*", metavar="NAME",
                    help="then print these rows' (none named: every row's) predicted rates on "
                         "each card, from their compile for --kernels' card")
    a = ap.parse_args(argv)
    path = Path(a.kernels)
    if not path.is_file():
        raise SystemExit(f"error: --kernels {path}: no such file; write it with `python "
                         "bench/gpu_target.py report --target h200 --out FILE`")
    rows = {r["name"]: r for r in json.loads(path.read_text())}
    pairs = pairs_of(MEASURED, rows)
    missing = [m["program"] for m in MEASURED if m["program"] not in rows
               or "profile" not in rows[m["program"]]]
    if len(pairs) < 4:
        raise SystemExit(f"error: {path} holds {len(pairs)} of the measured programs (needs 4 "
                         f"or more; missing: {', '.join(missing)}): report them first")
    tables = {name: leave_one_out(pairs, fixed) for name, fixed in VARIANTS.items()}
    for name, t in tables.items():
        print(f"{name}: left-out error median {median_error(t):.0%}, worst "
              f"{max(abs(r['error_left_out']) for r in t):.0%}")
    variant = min(tables, key=lambda n: median_error(tables[n]))  # (the choice is a fit too)
    table, fit = tables[variant], fit_rows(pairs, VARIANTS[variant])
    checks = [{"program": m["program"], "target": m["target"], "measured": m["rate"],
               "predicted": rate(r, m["target"], fit), "source": m["source"],
               "commit": m["commit"]} for m, r in pairs_of(CHECKS, rows)]
    for c in checks:
        c["error"] = c["predicted"] / c["measured"] - 1
    print(f"{variant} (the least median left-out error), on {len(pairs)} H200 rows: floor "
          f"{fit.floor_s * 1e6:.2f} us a kernel, "
          f"{fit.bandwidth_eff:.2f} of the bandwidth, {fit.flops_eff:.2f} of the matmul peak"
          + (f" (not in {path}: {', '.join(missing)})" if missing else ""))
    print(f"{'program':22} {'card':5} {'measured':>10} {'fit':>10} {'left out':>10} {'error':>7}"
          "  time set by launches / bytes / FLOPs")
    for t in table:
        b = t["bound"]
        print(f"{t['program']:22} {t['target']:5} {t['measured']:>10,.1f} {t['predicted']:>10,.1f}"
              f" {t['predicted_left_out']:>10,.1f} {t['error_left_out']:>+7.0%}  "
              f"{b['launches']:.0%} / {b['bytes']:.0%} / {b['flops']:.0%}")
    for c in checks:
        print(f"{c['program']:22} {c['target']:5} {c['measured']:>10,.1f} {c['predicted']:>10,.1f}"
              f" {'(check)':>10} {c['error']:>+7.0%}")
    errors = [abs(t["error_left_out"]) for t in table]
    summary = {"fitted_rows": len(table), "variant": variant,
               "median_abs_error_left_out": float(np.median(errors)),
               "max_abs_error_left_out": float(max(errors)),
               "variants": {n: median_error(t) for n, t in tables.items()}}
    print(f"left-out error: median {summary['median_abs_error_left_out']:.0%}, worst "
          f"{summary['max_abs_error_left_out']:.0%}")
    if a.out:
        Path(a.out).write_text(json.dumps({"fit": dataclasses.asdict(fit), **summary,
                                           "kernels": str(a.kernels), "rows": table,
                                           "checks": checks}, indent=1))
    if a.predict is not None:
        names = a.predict or [n for n, r in rows.items() if "profile" in r]
        for line in predictions([rows[n] for n in names if n in rows], fit):
            print(line)


def predictions(rows: list[dict], fit: Fit) -> list[str]:
    """Each row's predicted rate on every card we describe, what sets its time, and whether
    its peak memory fits the 75% JAX takes by default (all predicted, not measured)."""
    out = [f"{'program':26} {'card':5} {'predicted':>12} {'unit':12} {'peak GB':>8} fits  "
           "time set by launches / bytes / FLOPs"]
    for r in rows:
        for target, (_, memory, _) in gpu_target.TARGETS.items():
            b = bound_by(r["profile"], target, fit)
            peak = r.get("peak_gb", float("nan"))
            fits = "yes" if peak * 1e9 <= 0.75 * memory else "NO"
            out.append(f"{r['name']:26} {target:5} {rate(r, target, fit):>12,.0f} "
                       f"{r['unit'] + '/s':12} {peak:>8.1f} {fits:4} {b['launches']:.0%} / "
                       f"{b['bytes']:.0%} / {b['flops']:.0%}")
    return out


if __name__ == "__main__":
    main()
