"""The prepared GPU check: every GPU figure of the project, as a table of steps (STEPS: a name,
the part it belongs to, the command at full size on a GPU and at tiny shapes on a CPU, a time
box for each) read by one runner.

    bash scripts/gpu_check.sh OUT [--part N] [--budget S]  # a GPU machine (wheels in .whl/)
    bash scripts/gpu_check.sh --cpu-smoke OUT              # every step at tiny shapes, on a CPU

The parts, in order of what matters most:
  1. decode of the Qwen3-4B shape at batch 1 and 8 against the bandwidth bound (with a
     profiler trace of a timed burst), fused LLM-PPO at the 0.6B shape and 1,024 envs (with a
     trace of one chunk), the Pallas kernel against its reference, fused 4B (layer 24) at 128
     envs;
  2. Qwen3-30B-A3B encode (32 x 256 after a 1,024-token prefix, MFU, its experts against the
     dense oracle) and its batch-1 decode against the bound, fused 4B (layer 24) at 1,024 envs;
  3. our PPO beside the public Craftax PPO (Craftax-Symbolic, 1,024 envs; the public code from
     `.peers/craftax_baselines`, prepared by `scripts/gpu_prepare.sh`, never committed), ours
     under each CUDA graphs setting (llm_jax/graphs.py: speed, and the same state bit for bit),
     decode of the 4B at batch 64;
  4. the same pair on frames (Craftax-Pixels, the public pixel PPO's sizes; then at 32
     minibatches);
  5. the Qwen3-VL-4B shape's states of 1,024 Craftax-Pixels frames (random weights, bf16):
     frames/s and MFU.
Every part runs unless `--part N` picks one or `--only STEP ...` picks steps by name. Each step
runs in its own process under its time box, so a slow one cannot starve the rest. What a machine
allows is given as flags, never assumed: `--budget S` bounds the whole run (a step is given what
is left if less than its box, and skipped, with a row naming it, when under `--min-step-s` are),
`--max-trace-mb M` drops a trace larger than M after reading it. Its JSON rows are appended to
OUT/rows.jsonl as it prints them (a step cut by its box keeps what it printed), with one `step`
row each: status (ok, failed, timeout, skipped), seconds, return code. Its output goes to
OUT/check.log. The traces land as OUT/trace_decode.json.gz and OUT/trace_fused.json.gz and
`bench/trace_report.py`'s reading of each as OUT/report.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / ".peers" / "craftax_baselines"
# bytes/s of the memory the decode bound is computed against, by device kind
BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12}


class Run(NamedTuple):
    """One way to run a step: argv after `python` (`{out}` is replaced by the output folder,
    `{bandwidth}` by the decode bound's bytes/s) and the seconds it may take."""
    argv: tuple[str, ...]
    box_s: int


class Step(NamedTuple):
    """A row of the check's table."""
    name: str
    part: int  # the group `--part` picks (see the module's docstring)
    gpu: Run  # at full size on a GPU
    smoke: Run | None  # at tiny shapes on a CPU; None: not in the smoke run
    needs: Path | None = None  # skipped (with a row saying so) where this path is absent
    needs_module: str | None = None  # ... or where this module cannot be imported


# argv shared by several steps
DECODE = ("bench/decode_sps.py", "--prefix-len", "512", "--prompt-len", "32", "--new-tokens",
          "64", "--bandwidth", "{bandwidth}", "--repeats", "3", "--steps-per-check", "8")
# 32 tokens, 3 rounds: the decode figure is the n-token call less the 1-token call, and at
# 8 tokens, 1 round a loaded 2-core CI machine's noise made it negative
DECODE_TINY = ("bench/decode_sps.py", "--prefix-len", "16", "--prompt-len", "8", "--new-tokens",
               "32", "--repeats", "3", "--copy-gb", "0.01")
FUSED = ("bench/fused_sps.py", "--dtype", "bfloat16", "--skip-n", "25", "--no-plain",
         "--render-states", "64", "--updates", "1", "--repeats", "3", "--min-seconds", "5")
# (two encoding lengths, as the suite's LLM runs: the default's nine each compile on a CPU)
FUSED_TINY = ("bench/fused_sps.py", "--model", "qwen3-tiny", "--num-envs", "8", "--num-steps",
              "8", "--skip-n", "4", "--updates", "1", "--repeats", "1", "--min-seconds", "0",
              "--no-plain", "--render-states", "16", "--encode-lengths", "512")
PPO = ("bench/ppo_sps.py", "--skip-env", "--no-reference", "--ppo-updates", "2")
PPO_TINY = ("--repeats", "1", "--update-epochs", "1", "--num-minibatches", "2", "--width", "32")
PEER_TINY = ("--update-epochs", "1", "--num-minibatches", "2", "--updates", "1", "2",
             "--repeats", "1")
TRACE_DECODE, TRACE_FUSED = "{out}/trace_decode.json.gz", "{out}/trace_fused.json.gz"
PUBLIC = {"needs": PEER / "ppo.py", "needs_module": "distrax"}

STEPS = (
    Step("decode_4b", 1,
         Run(DECODE + ("--shapes", "qwen3-4b", "--batches", "1", "8", "--trace", TRACE_DECODE,
                       "--trace-tokens", "64"), 200),
         Run(DECODE_TINY + ("--shapes", "qwen3-tiny", "--batches", "1", "2", "--steps-per-check",
                            "1", "4", "--trace", TRACE_DECODE, "--trace-tokens", "6",
                            "--bound-shape", "qwen3-tiny"), 90)),
    Step("fused_0.6b_1024", 1,
         Run(FUSED + ("--model", "qwen3-0.6b", "--num-envs", "1024", "--trace", TRACE_FUSED),
             180),
         Run(FUSED_TINY + ("--trace", TRACE_FUSED), 120)),
    Step("kernel", 1,
         Run(("bench/prefix_kernel.py", "--rows", "32", "--suffixes", "256", "--blocks", "32x64",
              "--forms", "reference", "cudnn", "--repeats", "5"), 30),
         Run(("bench/prefix_kernel.py", "--interpret", "--rows", "2", "--suffixes", "8",
              "--prefix", "16", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
              "--blocks", "8x8", "--forms", "reference", "--repeats", "1"), 60)),
    Step("fused_4b_l24_128", 1,
         Run(FUSED + ("--model", "qwen3-4b", "--layer", "24", "--num-envs", "128"), 150), None),
    Step("moe_30b_encode", 2,  # (its pallas form on a CPU: tests/test_moe.py)
         Run(("bench/moe_encode.py", "--shapes", "qwen3-30b-a3b", "--batches", "32", "--lengths",
              "256", "--suffix-lengths", "256", "--prefix-len", "1024", "--forms", "tiled",
              "ragged", "pallas"), 240),
         Run(("bench/moe_encode.py", "--shapes", "qwen3-tiny-moe", "--batches", "2", "--lengths",
              "16", "--suffix-lengths", "8", "--prefix-len", "16", "--repeats", "1", "--forms",
              "tiled", "ragged"), 60)),
    Step("moe_30b_decode", 2,
         Run(DECODE + ("--shapes", "qwen3-30b-a3b", "--batches", "1", "--bound-shape",
                       "qwen3-30b-a3b"), 150),
         Run(DECODE_TINY + ("--shapes", "qwen3-tiny-moe", "--batches", "1", "--bound-shape",
                            "qwen3-tiny-moe"), 60)),
    Step("fused_4b_l24_1024", 2,
         Run(FUSED + ("--model", "qwen3-4b", "--layer", "24", "--num-envs", "1024"), 200), None),
    Step("ppo_ours_1024", 3,
         Run(PPO + ("--ppo-env-counts", "1024"), 160),
         Run(PPO + PPO_TINY + ("--env", "Craftax-Classic-Symbolic-v1", "--ppo-env-counts", "8",
                               "--num-steps", "8"), 120)),
    # (../shared/peers/public_ppo.py's run, through bench/peer_ppo.py: its jax aliases)
    Step("ppo_public_1024", 3,
         Run(("bench/peer_ppo.py", "Craftax-Symbolic-v1", "1024"), 200),
         Run(("bench/peer_ppo.py", "Craftax-Symbolic-v1", "8", "--num-steps", "8", "--width",
              "64") + PEER_TINY, 200), **PUBLIC),
    # our PPO with its loops in CUDA graphs (the commands' setting), launched as XLA does by
    # default, and unrolled into one graph: steps/s, the state after the same chunks equal to
    # the first setting's, and the first setting's run again (is the program deterministic?)
    Step("ppo_graphs_1024", 3,
         Run(PPO + ("--ppo-env-counts", "1024", "--graphs", "loops", "default", "unrolled"), 420),
         Run(PPO + PPO_TINY + ("--env", "Craftax-Classic-Symbolic-v1", "--ppo-env-counts", "8",
                               "--num-steps", "8", "--graphs", "loops", "default"), 120)),
    Step("decode_4b_b64", 3, Run(DECODE + ("--shapes", "qwen3-4b", "--batches", "64"), 150),
         None),
    # frames: the public pixel PPO's sizes (CNN 512, 64 steps, 4 x 8) on Craftax-Pixels
    Step("ppo_pixels_ours_1024", 4,
         Run(PPO + ("--env", "Craftax-Pixels-v1", "--ppo-env-counts", "1024", "--variants",
                    "cnn"), 230),
         Run(PPO + PPO_TINY + ("--env", "Craftax-Classic-Pixels-v1", "--ppo-env-counts", "4",
                               "--num-steps", "4", "--variants", "cnn"), 120)),
    Step("ppo_pixels_public_1024", 4,
         Run(("bench/peer_ppo.py", "Craftax-Pixels-v1", "1024", "--updates", "2", "4"), 290),
         Run(("bench/peer_ppo.py", "Craftax-Classic-Pixels-v1", "4", "--num-steps", "4",
              "--width", "32") + PEER_TINY, 120), **PUBLIC),
    # the same pair at 32 minibatches, for a card where the public program does not fit at its
    # own 8 (XLA:GPU's memory counts: docs/BENCHMARKS.md, "PPO on frames on CPU")
    Step("ppo_pixels_ours_1024_mb32", 4,
         Run(PPO + ("--env", "Craftax-Pixels-v1", "--ppo-env-counts", "1024", "--variants",
                    "cnn", "--num-minibatches", "32"), 200), None),
    Step("ppo_pixels_public_1024_mb32", 4,
         Run(("bench/peer_ppo.py", "Craftax-Pixels-v1", "1024", "--updates", "2", "4",
              "--num-minibatches", "32"), 250), None, **PUBLIC),
    Step("vl_4b_1024", 5,
         Run(("bench/vl_encode.py", "--shape", "qwen3-vl-4b", "--frames", "1024", "--microbatch",
              "128", "--repeats", "3"), 300),
         Run(("bench/vl_encode.py", "--shape", "tiny", "--frames", "8", "--microbatch", "4",
              "--repeats", "1", "--dtype", "float32"), 90)),
)
PARTS = tuple(sorted({s.part for s in STEPS}))


def chosen(smoke: bool, part: int | None, only: list[str] | None) -> list[tuple[Step, Run]]:
    """The steps a run takes, in the table's order, each with its GPU or smoke form: those of
    `only` by name, else those of `part`, else all (a step with no form here is left out)."""
    out = []
    for step in STEPS:
        run = step.smoke if smoke else step.gpu
        if run is None or (only and step.name not in only) or (
                not only and part is not None and step.part != part):
            continue
        out.append((step, run))
    return out


def missing(step: Step) -> str | None:
    """Why `step` cannot run on this machine, or None."""
    if step.needs is not None and not step.needs.exists():
        return f"{step.needs} absent (scripts/gpu_prepare.sh puts it there)"
    if step.needs_module and importlib.util.find_spec(step.needs_module) is None:
        return (f"no module {step.needs_module} (scripts/gpu_prepare.sh carries its wheel for "
                "the GPU machine)")
    return None


def run_step(name: str, argv: list[str], box: int, rows, log, env) -> dict:
    """One step in its own process group under its box; its JSON lines appended to `rows` as
    they come. Returns its `step` row."""
    t0 = time.time()
    log.write(f"\n=== {name}: python {' '.join(argv)} (box {box}s)\n")
    log.flush()
    proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    status = "ok"
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    while True:
        left = box - (time.time() - t0)
        if left <= 0:
            os.killpg(proc.pid, signal.SIGKILL)
            status = "timeout"
            break
        if not sel.select(timeout=min(left, 1.0)):
            if proc.poll() is not None:
                break
            continue
        line = proc.stdout.readline()
        if not line:
            break
        log.write(line)
        log.flush()
        if line.startswith("{"):
            try:
                row = json.loads(line)
            except ValueError:
                continue
            rows.write(json.dumps(dict(row, step=name)) + "\n")
            rows.flush()
    rc = proc.wait()
    if status == "ok" and rc != 0:
        status = "failed"
    return {"name": "step", "step": name, "status": status, "rc": rc,
            "seconds": round(time.time() - t0, 1), "box_s": box}


def device_bandwidth() -> tuple[float, str]:
    """The decode bound's bandwidth for this GPU's kind (H200 by default), and the kind."""
    try:
        kind = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        kind = ""
    for k, bw in BANDWIDTH.items():
        if k in kind:
            return bw, kind
    return BANDWIDTH["H200"], kind or "unknown"


def reports(out: Path, rows_path: Path, max_trace_bytes: float | None) -> dict:
    """`bench/trace_report.py` of each trace written, with the step counts and bytes the
    benchmarks recorded beside it; a trace over `max_trace_bytes` is deleted once read."""
    sys.path.insert(0, str(ROOT / "bench"))
    from trace_report import load_events, report

    rows = [json.loads(x) for x in rows_path.read_text().splitlines() if x.strip()]
    out_reports = {}
    for name, path in (("decode", out / "trace_decode.json.gz"),
                       ("fused", out / "trace_fused.json.gz")):
        if not path.is_file():
            continue
        if max_trace_bytes is not None and path.stat().st_size > max_trace_bytes:
            out_reports[name] = {"dropped": f"{path.stat().st_size:,} bytes, over "
                                            f"--max-trace-mb {max_trace_bytes / 2**20:g}"}
            kept = report(load_events(path))
            path.unlink()
            out_reports[name].update(kept)
            continue
        if name == "decode":
            meta = next((r for r in rows if r.get("name") == "trace"), {})
            out_reports[name] = report(load_events(path), meta.get("steps", 1),
                                       meta.get("bytes_per_step"), meta.get("bandwidth"))
        else:
            meta = next((r for r in rows if r.get("trace") == str(path)), {})
            out_reports[name] = report(load_events(path), meta.get("trace_steps", 1))
    return out_reports


def step_env(smoke: bool) -> dict:
    """The environment each step's process gets."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="disabled",
               PEER=str(PEER), PYTHONPATH=os.pathsep.join(
                   [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                  if p]))
    if smoke:
        env["JAX_PLATFORMS"] = "cpu"
    else:  # the 30B MoE's weights need more of the GPU than JAX's default 75%
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    return env


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on a CPU")
    ap.add_argument("--part", type=int, choices=PARTS, default=None,
                    help="the part to run (default: every part)")
    ap.add_argument("--only", nargs="*", help="step names to run instead of a part")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole run, reports aside (default: none, every step "
                         "its own box)")
    ap.add_argument("--min-step-s", type=float, default=20,
                    help="a step left fewer seconds than this by --budget is skipped")
    ap.add_argument("--max-trace-mb", type=float, default=None,
                    help="a trace larger than this is read, then deleted (default: all kept)")
    a = ap.parse_args(argv)
    names = [st.name for st in STEPS]
    if a.only and set(a.only) - set(names):
        ap.error(f"no step {', '.join(sorted(set(a.only) - set(names)))}; the steps: "
                 f"{', '.join(names)}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    bandwidth, kind = (BANDWIDTH["H200"], "cpu smoke") if a.cpu_smoke else device_bandwidth()
    env = step_env(a.cpu_smoke)
    rows_path = a.out / "rows.jsonl"
    t0 = time.time()
    results = []
    with open(rows_path, "a") as rows, open(a.out / "check.log", "a") as log:
        rows.write(json.dumps({"name": "check", "mode": "cpu-smoke" if a.cpu_smoke else "gpu",
                               "device": kind, "bandwidth": bandwidth,
                               "python": platform.python_version(), "commit": commit(),
                               "date": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
        rows.flush()
        for step, run in chosen(a.cpu_smoke, a.part, a.only):
            box = run.box_s if a.budget is None else min(
                run.box_s, int(a.budget - (time.time() - t0)))
            why = missing(step)
            if why is None and box < a.min_step_s:
                why = (f"the check's {a.budget:.0f} s budget is spent; run it with --only "
                       f"{step.name}")
            if why is not None:
                result = {"name": "step", "step": step.name, "status": "skipped", "why": why}
            else:
                argv_ = [x.format(out=a.out, bandwidth=bandwidth) for x in run.argv]
                result = run_step(step.name, argv_, box, rows, log, env)
            rows.write(json.dumps(result) + "\n")
            rows.flush()
            results.append(result)
            print(f"{step.name}: {result['status']} ({result.get('seconds', 0)} s)"
                  + (f": {result['why']}" if "why" in result else "")
                  + (f" (its output: {a.out / 'check.log'})" if result["status"] == "failed"
                     else ""), flush=True)
        max_bytes = None if a.max_trace_mb is None else a.max_trace_mb * 2**20
        summary = reports(a.out, rows_path, max_bytes)
        (a.out / "report.json").write_text(json.dumps(summary, indent=1) + "\n")
        rows.write(json.dumps({"name": "check_done", "seconds": round(time.time() - t0, 1)})
                   + "\n")
    failed = [r["step"] for r in results if r["status"] == "failed"]
    later = [p for p in PARTS if a.part is not None and p > a.part]
    print(f"done in {time.time() - t0:.0f} s -> {a.out}"
          + (f"; failed: {', '.join(failed)}" if failed else "")
          + (f"; the next part: --part {later[0]}" if later and not a.only else ""))
    return 1 if failed else 0


def commit() -> str | None:
    """The checkout's commit: $CHECK_COMMIT (a device machine's copy has no .git), else git."""
    if os.environ.get("CHECK_COMMIT"):
        return os.environ["CHECK_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


if __name__ == "__main__":
    sys.exit(main())
