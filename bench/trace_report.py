"""What a `jax.profiler` trace says about the device's time, on any machine (no GPU needed):
`python bench/trace_report.py TRACE [--steps N] [--bytes-per-step B --bandwidth BW]`.

TRACE is a trace file (`*.trace.json.gz` / `perfetto_trace.json.gz`, Chrome trace-event JSON)
or a folder `jax.profiler.start_trace(dir, create_perfetto_trace=True)` wrote (its newest such
file). Device work is each event on a device's lanes: a GPU's streams (processes named
`/device:GPU:N`: their `Stream ...` lanes, the kernels, where the trace has them, else its
`XLA Ops` lane; never `XLA Modules`, whose events span whole programs), or on a CPU-only trace
XLA's own threads (`tf_XLA...`, its op events, not the runtime's bookkeeping). The report
(printed, and one JSON object with `--json OUT`):
- the top ops by total time (count, total, mean, share of device time);
- kernels per step (`--steps`: the decode steps or env steps the traced burst ran);
- busy time, the span from the first device event to the last, and idle gaps between one
  event's end and the next one's start on the same lane (total and the largest, with the ops
  on either side): launch overhead and host round trips show up here;
- with `--bytes-per-step` and `--bandwidth`, the bound on a step's time (bytes / bandwidth)
  against the measured one (span / steps): the fraction of the bandwidth bound reached;
- device time by named scope (`--scopes`, default llm, env, update: the `jax.named_scope`s of
  the LLM calls, the env steps and the PPO update), read from the JAX op names each event's
  args carry (GPU traces do; CPU traces carry none, and all is `other`): where an env step's
  time goes outside the LLM calls.

Work without a GPU starts from the last trace a GPU run wrote (`scripts/gpu_check.sh` keeps one
of a decode burst and one of a fused chunk).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

# Events on XLA's CPU threads that are the runtime's, not an op's.
BOOKKEEPING = ("ThreadpoolListener", "ThunkExecutor", "end: ", "$", "PjRt", "Pjit", "Execute",
               "Await")


def find_trace(path: Path) -> Path:
    """The trace file itself, or the newest trace JSON under a profiler folder."""
    if path.is_file():
        return path
    found = sorted([*path.rglob("*.trace.json.gz"), *path.rglob("perfetto_trace.json.gz")],
                   key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"error: no *.trace.json.gz under {path}; write traces with "
                         "jax.profiler.start_trace(dir, create_perfetto_trace=True)")
    return found[-1]


def load_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def device_lanes(events: list[dict]) -> dict[tuple, list[dict]]:
    """{(pid, tid): complete events sorted by start} of the device's lanes (module docstring)."""
    procs, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e.get("tid"))] = e["args"]["name"]
    gpu = {p for p, n in procs.items() if n.startswith("/device:GPU")}
    on_gpu = {k: n for k, n in threads.items() if k[0] in gpu}
    kind = ("Stream" if any(n.startswith("Stream") for n in on_gpu.values())
            else "XLA Ops")
    lanes: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        key = (e["pid"], e.get("tid"))
        if gpu:
            ok = on_gpu.get(key, "").startswith(kind)
        else:
            ok = threads.get(key, "").startswith("tf_XLA") and not e["name"].startswith(
                BOOKKEEPING)
        if ok:
            lanes[key].append(e)
    return {k: sorted(v, key=lambda e: e["ts"]) for k, v in lanes.items()}


def op_name(e: dict) -> str:
    """An event's op: the HLO op XLA names in its args where it does, else the event's name."""
    args = e.get("args") or {}
    return args.get("hlo_op") or args.get("long_name") or e["name"]


SCOPES = ("llm", "env", "update")


def scope_of(e: dict, scopes: tuple[str, ...]) -> str:
    """The outermost of `scopes` in the JAX op name an event's args carry, else "other"."""
    text = "/".join(str(v) for v in (e.get("args") or {}).values() if isinstance(v, str))
    for part in text.split("/"):
        if part in scopes:
            return part
    return "other"


def report(events: list[dict], steps: int = 1, bytes_per_step: float | None = None,
           bandwidth: float | None = None, top: int = 15,
           scopes: tuple[str, ...] = SCOPES) -> dict:
    """The figures of the module docstring (times in microseconds, as the trace gives them)."""
    lanes = device_lanes(events)
    flat = [e for lane in lanes.values() for e in lane]
    if not flat:
        return {"device_events": 0, "note": "no device events in this trace"}
    busy = sum(e["dur"] for e in flat)
    start = min(e["ts"] for e in flat)
    end = max(e["ts"] + e["dur"] for e in flat)
    per_op: dict[str, list[float]] = defaultdict(list)
    for e in flat:
        per_op[op_name(e)].append(e["dur"])
    ops = sorted(per_op.items(), key=lambda kv: -sum(kv[1]))
    gaps = []
    for lane in lanes.values():
        for a, b in zip(lane, lane[1:]):
            gap = b["ts"] - (a["ts"] + a["dur"])
            if gap > 0:
                gaps.append((gap, op_name(a), op_name(b)))
    gaps.sort(key=lambda g: -g[0])
    out = {
        "device_events": len(flat), "lanes": len(lanes), "steps": steps,
        "kernels_per_step": len(flat) / steps, "busy_us": busy, "span_us": end - start,
        "busy_fraction_of_span": busy / ((end - start) * len(lanes)) if end > start else 1.0,
        "idle_gaps_us": sum(g[0] for g in gaps), "idle_gaps": len(gaps),
        "largest_gaps": [{"us": g, "after": a, "before": b} for g, a, b in gaps[:top]],
        "step_us": (end - start) / steps,
        "top_ops": [{"op": name, "count": len(d), "total_us": sum(d),
                     "mean_us": sum(d) / len(d), "share_of_busy": sum(d) / busy}
                    for name, d in ops[:top]],
    }
    by_scope: dict[str, float] = defaultdict(float)
    for e in flat:
        by_scope[scope_of(e, scopes)] += e["dur"]
    out["by_scope"] = {k: {"us": v, "share_of_busy": v / busy, "us_per_step": v / steps}
                       for k, v in sorted(by_scope.items(), key=lambda kv: -kv[1])}
    if bytes_per_step and bandwidth:
        bound_us = bytes_per_step / bandwidth * 1e6
        out.update(bytes_per_step=bytes_per_step, bandwidth=bandwidth, bound_step_us=bound_us,
                   fraction_of_bandwidth_bound=bound_us / out["step_us"],
                   achieved_bytes_per_s=bytes_per_step / (out["step_us"] * 1e-6))
    return out


def print_report(r: dict, source: str) -> None:
    print(f"trace {source}")
    if not r.get("device_events"):
        print("  no device events")
        return
    print(f"  {r['device_events']:,} device events on {r['lanes']} lane(s), "
          f"{r['kernels_per_step']:.1f} per step over {r['steps']} step(s)")
    print(f"  span {r['span_us'] / 1e3:.3f} ms, busy {r['busy_us'] / 1e3:.3f} ms summed over "
          f"the lanes ({r['busy_fraction_of_span']:.1%} of the span x lanes), idle gaps "
          f"{r['idle_gaps_us'] / 1e3:.3f} ms in {r['idle_gaps']:,}; "
          f"{r['step_us'] / 1e3:.3f} ms a step")
    if "fraction_of_bandwidth_bound" in r:
        print(f"  bandwidth bound {r['bound_step_us'] / 1e3:.3f} ms a step: "
              f"{r['fraction_of_bandwidth_bound']:.1%} reached "
              f"({r['achieved_bytes_per_s'] / 1e12:.2f} TB/s)")
    print("  by scope: " + ", ".join(f"{k} {v['us'] / 1e3:.3f} ms ({v['share_of_busy']:.1%})"
                                      for k, v in r["by_scope"].items()))
    print("  top ops:  total ms   count   mean us  share  op")
    for o in r["top_ops"]:
        print(f"          {o['total_us'] / 1e3:9.3f} {o['count']:7d} {o['mean_us']:9.1f} "
              f"{o['share_of_busy']:6.1%}  {o['op'][:90]}")
    if r["largest_gaps"]:
        print("  largest gaps:  us  between")
        for g in r["largest_gaps"][:8]:
            print(f"          {g['us']:8.1f}  {g['after'][:40]} -> {g['before'][:40]}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path, help="a trace file or a profiler folder")
    ap.add_argument("--steps", type=int, default=1, help="steps the traced burst ran")
    ap.add_argument("--bytes-per-step", type=float, default=None,
                    help="bytes a step must move (bench/decode_sps.py's bound rows)")
    ap.add_argument("--bandwidth", type=float, default=None, help="bytes/s of the device")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--scopes", nargs="*", default=list(SCOPES),
                    help="named scopes to group device time by")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = ap.parse_args(argv)
    if a.steps < 1:
        raise SystemExit(f"error: --steps {a.steps} must be at least 1")
    if not a.trace.exists():
        raise SystemExit(f"error: {a.trace} does not exist")
    path = find_trace(a.trace)
    r = report(load_events(path), a.steps, a.bytes_per_step, a.bandwidth, a.top,
               tuple(a.scopes))
    r["trace"] = str(path)
    print_report(r, str(path))
    if a.json:
        a.json.write_text(json.dumps(r, indent=1) + "\n")
    return r


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
