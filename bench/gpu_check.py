"""The prepared GPU check: every GPU figure of the project, in five parts, each step time-boxed.

    bash scripts/gpu_check.sh OUT [--part N]   # a lent GPU machine (wheels carried in .whl/)
    bash scripts/gpu_check.sh --cpu-smoke OUT  # every step at tiny shapes, on a CPU

A bare machine compiles everything anew (a Qwen3-4B decode function takes ~18 s to compile on
an H200, a fused LLM-PPO chunk over a minute), and a session has 15 minutes of device time
with a machine's start counted: one part fits one call (`--budget`, 500 s by default, plus the
wheels' install), so a session runs one part, the one whose figures in docs/BENCHMARKS.md are
oldest. The parts, in order of what matters most:
  1. decode of the Qwen3-4B shape at batch 1 and 8 against the bandwidth bound (with a
     profiler trace of a timed burst), fused LLM-PPO at the 0.6B shape and 1,024 envs (with a
     trace of one chunk), the Pallas kernel against its reference, fused 4B (layer 24) at 128
     envs;
  2. Qwen3-30B-A3B encode (32 x 256 after a 1,024-token prefix, MFU, its experts against the
     dense oracle) and its batch-1 decode against the bound, fused 4B (layer 24) at 1,024 envs;
  3. our PPO beside the public Craftax PPO (Craftax-Symbolic, 1,024 envs; the public code from
     `.peers/craftax_baselines`, prepared by `scripts/gpu_prepare.sh`, never committed), decode
     of the 4B at batch 64;
  4. the same pair on frames (Craftax-Pixels, the public pixel PPO's sizes; then at 32
     minibatches, where the budget is left or with --only);
  5. the Qwen3-VL-4B shape's states of 1,024 Craftax-Pixels frames (random weights, bf16):
     frames/s and MFU.
`--only STEP ...` picks steps by name instead. Each step runs in its own process under a time
box, so a slow one cannot starve the rest, and the part within `--budget` seconds (a step is
given what is left if less than its box, and skipped when under 20 s are). Its JSON rows are
appended to OUT/rows.jsonl as it prints them (a step cut by its box keeps what it printed),
with one `step` row each: status (ok, failed, timeout, skipped), seconds, return code. Its
output goes to OUT/check.log. The traces land as OUT/trace_decode.json.gz and
OUT/trace_fused.json.gz (dropped if over 16 MB: the device tool returns no larger file) and
`bench/trace_report.py`'s reading of each as OUT/report.json: at most 5 files.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT / ".peers" / "craftax_baselines"
MAX_FILE = 16 * 2**20
# bytes/s of the memory the decode bound is computed against, by device kind
BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12}


class Step(NamedTuple):
    name: str
    gpu: list[str] | None  # argv after `python`; None: not a GPU step
    smoke: list[str] | None  # the same at tiny shapes on a CPU; None: not in the smoke run
    box_s: tuple[int, int]  # time box on a GPU, in the smoke run
    part: int = 1  # the call it belongs to on a GPU (see the module's docstring)
    needs: Path | None = None  # skipped (with a row saying so) where this path is absent
    needs_module: str | None = None  # ... or where this module cannot be imported


def steps(out: Path, bandwidth: float) -> list[Step]:
    d, f = str(out / "trace_decode.json.gz"), str(out / "trace_fused.json.gz")
    bw = str(bandwidth)
    decode = ["bench/decode_sps.py", "--prefix-len", "512", "--prompt-len", "32",
              "--new-tokens", "64", "--bandwidth", bw, "--repeats", "3",
              "--steps-per-check", "8"]
    # 32 tokens, 3 rounds: the decode figure is the n-token call less the 1-token call, and at
    # 8 tokens, 1 round (~10 ms apart) a loaded 2-core CI machine's noise made it negative
    small = ["bench/decode_sps.py", "--prefix-len", "16", "--prompt-len", "8", "--new-tokens",
             "32", "--repeats", "3", "--copy-gb", "0.01"]
    fused = ["bench/fused_sps.py", "--dtype", "bfloat16", "--skip-n", "25", "--no-plain",
             "--render-states", "64", "--updates", "1", "--repeats", "3", "--min-seconds", "5"]
    tiny_fused = ["bench/fused_sps.py", "--model", "qwen3-tiny", "--num-envs", "8",
                  "--num-steps", "8",
                  "--skip-n", "4", "--updates", "1", "--repeats", "1", "--min-seconds", "0",
                  "--no-plain", "--render-states", "16"]
    ppo = ["bench/ppo_sps.py", "--skip-env", "--no-reference", "--ppo-updates", "2"]
    return [
        # on an H200 (2026-11-26) b1 + b8: ~18 s a compile, four compiles, 8 GB of weights
        Step("decode_4b", decode + ["--shapes", "qwen3-4b", "--batches", "1", "8",
                                    "--trace", d, "--trace-tokens", "64"],
             small + ["--shapes", "qwen3-tiny", "--batches", "1", "2", "--steps-per-check", "1",
                      "4", "--trace", d, "--trace-tokens", "6", "--bound-shape", "qwen3-tiny"],
             (200, 90), 1),
        Step("fused_0.6b_1024", fused + ["--model", "qwen3-0.6b", "--num-envs", "1024",
                                         "--trace", f],
             tiny_fused + ["--trace", f], (180, 120), 1),
        Step("kernel", ["bench/prefix_kernel.py", "--rows", "32", "--suffixes", "256",
                        "--blocks", "32x64", "--forms", "reference", "cudnn", "--repeats", "5"],
             ["bench/prefix_kernel.py", "--interpret", "--rows", "2", "--suffixes", "8",
              "--prefix", "16", "--heads", "4", "--kv-heads", "2", "--head-dim", "16",
              "--blocks", "8x8", "--forms", "reference", "--repeats", "1"], (30, 60), 1),
        Step("fused_4b_l24_128", fused + ["--model", "qwen3-4b", "--layer", "24",
                                          "--num-envs", "128"], None, (150, 0), 1),
        Step("moe_30b_encode", ["bench/moe_encode.py", "--shapes", "qwen3-30b-a3b", "--batches",
                                "32", "--lengths", "256", "--suffix-lengths", "256",
                                "--prefix-len", "1024", "--forms", "tiled", "ragged", "pallas"],
             ["bench/moe_encode.py", "--shapes", "qwen3-tiny-moe", "--batches", "2",
              "--lengths", "16", "--suffix-lengths", "8", "--prefix-len", "16", "--repeats", "1",
              "--forms", "tiled", "ragged"], (240, 60), 2),  # (pallas: tests/test_moe.py)
        Step("moe_30b_decode", decode + ["--shapes", "qwen3-30b-a3b", "--batches", "1",
                                         "--bound-shape", "qwen3-30b-a3b"],
             small + ["--shapes", "qwen3-tiny-moe", "--batches", "1", "--bound-shape",
                      "qwen3-tiny-moe"], (150, 60), 2),
        Step("fused_4b_l24_1024", fused + ["--model", "qwen3-4b", "--layer", "24",
                                           "--num-envs", "1024"], None, (200, 0), 2),
        Step("ppo_ours_1024", ppo + ["--ppo-env-counts", "1024"],
             ppo + ["--env", "Craftax-Classic-Symbolic-v1", "--ppo-env-counts", "8",
                    "--repeats", "1", "--num-steps", "8", "--update-epochs", "1",
                    "--num-minibatches", "2", "--width", "32"], (160, 120), 3),
        # (../shared/peers/public_ppo.py's run, through bench/peer_ppo.py: its jax aliases)
        Step("ppo_public_1024", ["bench/peer_ppo.py", "Craftax-Symbolic-v1", "1024"],
             ["bench/peer_ppo.py", "Craftax-Symbolic-v1", "8", "--num-steps", "8",
              "--update-epochs", "1", "--num-minibatches", "2", "--width", "64", "--updates",
              "1", "2", "--repeats", "1"], (200, 200), 3, needs=PEER / "ppo.py",
             needs_module="distrax"),
        Step("decode_4b_b64", decode + ["--shapes", "qwen3-4b", "--batches", "64"], None,
             (150, 0), 3),
        # frames: the public pixel PPO's sizes (CNN 512, 64 steps, 4 x 8) on Craftax-Pixels
        Step("ppo_pixels_ours_1024", ppo + ["--env", "Craftax-Pixels-v1", "--ppo-env-counts",
                                            "1024", "--variants", "cnn"],
             ppo + ["--env", "Craftax-Classic-Pixels-v1", "--ppo-env-counts", "4", "--repeats",
                    "1", "--num-steps", "4", "--update-epochs", "1", "--num-minibatches", "2",
                    "--width", "32", "--variants", "cnn"], (230, 120), 4),
        Step("ppo_pixels_public_1024", ["bench/peer_ppo.py", "Craftax-Pixels-v1", "1024",
                                           "--updates", "2", "4"],
             ["bench/peer_ppo.py", "Craftax-Classic-Pixels-v1", "4", "--num-steps", "4",
              "--update-epochs", "1", "--num-minibatches", "2", "--width", "32", "--updates",
              "1", "2", "--repeats", "1"], (290, 120), 4, needs=PEER / "ppo.py",
             needs_module="distrax"),
        # the same pair at 32 minibatches of 2,048 frames, for where the public program does not
        # fit at its own: XLA:GPU's count (bench/gpu_target.py) 79.1 GB at 8 minibatches, over
        # an H100's 0.92 x 84.9 GB, within an H200's; 37.0 at 32 (ours 47.3 / 21.8); run when
        # the part's budget is left, else with --only
        Step("ppo_pixels_ours_1024_mb32", ppo + ["--env", "Craftax-Pixels-v1",
                                                 "--ppo-env-counts", "1024", "--variants", "cnn",
                                                 "--num-minibatches", "32"], None, (200, 0), 4),
        Step("ppo_pixels_public_1024_mb32", ["bench/peer_ppo.py", "Craftax-Pixels-v1", "1024",
                                                "--updates", "2", "4", "--num-minibatches", "32"],
             None, (250, 0), 4, needs=PEER / "ppo.py", needs_module="distrax"),
        # on an H200 (2026-11-27): 41 s with its compile; ~1.1 TFLOP a frame
        Step("vl_4b_1024", ["bench/vl_encode.py", "--shape", "qwen3-vl-4b", "--frames", "1024",
                            "--microbatch", "128", "--repeats", "3"],
             ["bench/vl_encode.py", "--shape", "tiny", "--frames", "8", "--microbatch", "4",
              "--repeats", "1", "--dtype", "float32"], (300, 90), 5),
    ]


def run_step(step: Step, argv: list[str], box: int, rows, log, env) -> dict:
    """One step in its own process group under its box; its JSON lines appended to `rows` as
    they come. Returns its `step` row."""
    import importlib.util

    if step.needs is not None and not step.needs.exists():
        return {"name": "step", "step": step.name, "status": "skipped",
                "why": f"{step.needs} absent (scripts/gpu_prepare.sh puts it there)"}
    if step.needs_module and importlib.util.find_spec(step.needs_module) is None:
        return {"name": "step", "step": step.name, "status": "skipped",
                "why": f"no module {step.needs_module} (scripts/gpu_prepare.sh carries its "
                       "wheel for the GPU machine)"}
    t0 = time.time()
    log.write(f"\n=== {step.name}: python {' '.join(argv)} (box {box}s)\n")
    log.flush()
    proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    status = "ok"
    import selectors

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
            rows.write(json.dumps(dict(row, step=step.name)) + "\n")
            rows.flush()
    rc = proc.wait()
    if status == "ok" and rc != 0:
        status = "failed"
    return {"name": "step", "step": step.name, "status": status, "rc": rc,
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


def reports(out: Path, rows_path: Path) -> dict:
    """`bench/trace_report.py` of each trace written, with the step counts and bytes the
    benchmarks recorded beside it."""
    sys.path.insert(0, str(ROOT / "bench"))
    from trace_report import load_events, report

    rows = [json.loads(x) for x in rows_path.read_text().splitlines() if x.strip()]
    out_reports = {}
    for name, path in (("decode", out / "trace_decode.json.gz"),
                       ("fused", out / "trace_fused.json.gz")):
        if not path.is_file():
            continue
        if path.stat().st_size > MAX_FILE:
            out_reports[name] = {"dropped": f"{path.stat().st_size:,} bytes, over 16 MB"}
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on a CPU")
    ap.add_argument("--part", type=int, choices=(1, 2, 3, 4, 5), default=None,
                    help="the part to run (default 1 on a GPU; every step in the smoke run)")
    ap.add_argument("--only", nargs="*", help="step names to run instead of a part")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the part (default 500 on a GPU, 600 smoke)")
    a = ap.parse_args(argv)
    names = {st.name for st in steps(a.out, 0.0)}
    if a.only and set(a.only) - names:
        ap.error(f"no step {', '.join(sorted(set(a.only) - names))}; the steps: "
                 f"{', '.join(st.name for st in steps(a.out, 0.0))}")
    part = a.part or (None if a.cpu_smoke else 1)
    a.out.mkdir(parents=True, exist_ok=True)
    bandwidth, kind = (BANDWIDTH["H200"], "cpu smoke") if a.cpu_smoke else device_bandwidth()
    env = dict(os.environ, PYTHONUNBUFFERED="1", WANDB_MODE="disabled",
               PEER=str(PEER), PYTHONPATH=os.pathsep.join(
                   [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                  if p]))
    if a.cpu_smoke:
        env["JAX_PLATFORMS"] = "cpu"
    else:  # the 30B MoE's 61 GB of weights need more of the GPU than JAX's default 75%
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    rows_path = a.out / "rows.jsonl"
    t0 = time.time()
    with open(rows_path, "a") as rows, open(a.out / "check.log", "a") as log:
        import platform

        rows.write(json.dumps({"name": "check", "mode": "cpu-smoke" if a.cpu_smoke else "gpu",
                               "device": kind, "bandwidth": bandwidth,
                               "python": platform.python_version(), "commit": commit(),
                               "date": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")
        rows.flush()
        budget = a.budget or (600 if a.cpu_smoke else 500)  # (wheels and reports outside it)
        results = []
        for step in steps(a.out, bandwidth):
            argv_ = step.smoke if a.cpu_smoke else step.gpu
            if argv_ is None or (a.only and step.name not in a.only) or (
                    not a.only and part is not None and step.part != part):
                continue
            box = min(step.box_s[1] if a.cpu_smoke else step.box_s[0],
                      int(budget - (time.time() - t0)))
            if box < 20:
                result = {"name": "step", "step": step.name, "status": "skipped",
                          "why": f"the check's {budget:.0f} s budget is spent; run it with "
                                 f"--only {step.name}"}
            else:
                result = run_step(step, argv_, box, rows, log, env)
            rows.write(json.dumps(result) + "\n")
            rows.flush()
            results.append(result)
            print(f"{step.name}: {result['status']} ({result.get('seconds', 0)} s)"
                  + (f": {result['why']}" if "why" in result else "")
                  + (f" (its output: {a.out / 'check.log'})" if result["status"] == "failed"
                     else ""), flush=True)
        summary = reports(a.out, rows_path)
        (a.out / "report.json").write_text(json.dumps(summary, indent=1) + "\n")
        rows.write(json.dumps({"name": "check_done", "seconds": round(time.time() - t0, 1)})
                   + "\n")
    failed = [r["step"] for r in results if r["status"] == "failed"]
    print(f"done in {time.time() - t0:.0f} s -> {a.out}"
          + (f"; failed: {', '.join(failed)}" if failed else "")
          + (f"; the next part: --part {part + 1}" if part and part < 5 and not a.only else ""))
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
