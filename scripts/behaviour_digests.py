"""Digests of what the commands compute, to show a refactor changed no behaviour.

Runs small jobs from a scratch folder (train.py smoke / cpu for a few updates / GRU / RND / the
tiny LLM, label.py generate from a random and a trained policy plus returns and a label set,
offline.py awr and bc smoke) and prints one JSON object: per job the sha256 of its logged
metrics (timing fields removed) or of the dataset's manifest digests. Run it before and after a
change and compare the two objects:

    python scripts/behaviour_digests.py --out before.json
    python scripts/behaviour_digests.py --out after.json && diff before.json after.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMING = ("_per_s", "seconds", "time", "sps", "compile")

JOBS = [
    ("train_smoke", ["train.py", "smoke", "--run-name", "smoke"]),
    ("train_cpu", ["train.py", "cpu", "--run-name", "cpu", "--total-timesteps", "6144",
                   "--updates-per-chunk", "3", "--checkpoint-every-updates", "3"]),
    ("train_gru", ["train.py", "smoke", "--run-name", "gru", "--policy.kind", "gru"]),
    ("train_rnd", ["train.py", "smoke", "--run-name", "rnd", "--explore.kind", "rnd"]),
    ("train_e3b", ["train.py", "smoke", "--run-name", "e3b", "--explore.kind", "e3b"]),
    ("train_llm", ["train.py", "smoke", "--run-name", "llm", "--llm.backend", "jax"]),
    ("generate_random", ["label.py", "generate", "smoke", "--out", "data/rand", "--policy",
                         "random"]),
    ("generate_ppo", ["label.py", "generate", "smoke", "--out", "data/ppo", "--policy",
                      "runs/smoke", "--epsilon", "0.05"]),
    ("generate_gru", ["label.py", "generate", "smoke", "--out", "data/gru", "--policy",
                      "runs/gru"]),
    ("returns", ["label.py", "returns", "--data", "data/ppo", "--gamma", "0.99"]),
    ("returns_bootstrap", ["label.py", "returns", "--data", "data/ppo", "--gamma", "0.99",
                           "--incomplete", "bootstrap", "--name", "boot"]),
    ("label", ["label.py", "label", "--data", "data/ppo", "--name", "tiny",
               "--llm.backend", "jax"]),
    ("awr_smoke", ["offline.py", "awr", "smoke", "--data", "data/ppo", "--returns", "boot",
                   "--run-name", "awr"]),
    ("bc_smoke", ["offline.py", "bc", "smoke", "--data", "data/ppo", "--returns", "boot",
                  "--run-name", "bc"]),
]


def metrics_digest(path: Path) -> str:
    h = hashlib.sha256()
    for line in path.read_text().splitlines():
        row = {k: v for k, v in json.loads(line).items()
               if not any(t in k for t in TIMING)}
        h.update(json.dumps(row, sort_keys=True).encode())
    return h.hexdigest()


def data_digest(folder: Path) -> str:
    manifest = json.loads((folder / "manifest.json").read_text())
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", nargs="*", help="job names to run (default: all)")
    args = ap.parse_args()
    env = dict(os.environ, WANDB_MODE="disabled")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd in JOBS:
            if args.only and name not in args.only:
                continue
            argv = [sys.executable, str(ROOT / cmd[0]), *cmd[1:]]
            if cmd[0] == "train.py" or cmd[0] == "offline.py":
                argv += ["--out-dir", "runs"]
            p = subprocess.run(argv, cwd=tmp, env=env, capture_output=True, text=True)
            if p.returncode:
                results[name] = f"failed ({p.returncode}): {p.stderr.strip()[-300:]}"
            elif cmd[0] == "label.py":
                data = Path(tmp) / cmd[cmd.index("--out" if "--out" in cmd else "--data") + 1]
                results[name] = data_digest(data)
            else:
                results[name] = metrics_digest(Path(tmp) / "runs" / cmd[cmd.index("--run-name")
                                                                        + 1] / "metrics.jsonl")
            print(f"{name}: {results[name]}", flush=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
