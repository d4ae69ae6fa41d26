"""What verifying a dataset on read costs: the manifest check of every trajectory shard
(sha256 of its files, row counts from its metadata) against reading its columns, timed in
alternating rounds in one process. One JSON row.

    python label.py generate --out /tmp/vc --seed 0          # the cpu preset: 65,536 rows
    python bench/verify_cost.py --data /tmp/vc [--rounds 5] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fused.data.store import Dataset, check_folder, read_group  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    ds = Dataset(a.data)
    shards = ds.manifest()["shards"]
    read, check = [], []
    for _ in range(a.rounds):
        t = time.perf_counter()
        for s in shards:
            read_group(ds.shard_dir(s["name"]))
        read.append(time.perf_counter() - t)
        t = time.perf_counter()
        for s in shards:
            assert check_folder(ds.shard_dir(s["name"]), s) is None, s["name"]
        check.append(time.perf_counter() - t)
    size = sum(p.stat().st_size for p in (ds.root / "shards").rglob("*") if p.is_file())
    row = {"bench": "verify_cost", "rows": sum(s["rows"] for s in shards),
           "shards": len(shards), "bytes": size, "read_s": statistics.median(read),
           "check_s": statistics.median(check),
           "check_over_read": statistics.median(check) / statistics.median(read),
           "machine": platform.processor() or platform.machine(),
           "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(row))
    if a.out:
        Path(a.out).write_text(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
