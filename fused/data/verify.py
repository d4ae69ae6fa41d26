"""`label.py verify`: every shard of a dataset (trajectories, each label set, each returns set)
checked against its manifest entry: present, sha256 equal, row counts equal (a derived set's
shard against its trajectory shard). Reads everything, writes nothing."""

from __future__ import annotations

from typing import NamedTuple

from fused.data.store import Dataset, check_folder


class Finding(NamedTuple):
    kind: str  # "shards", "labels" or "returns"
    set_name: str | None
    shard: str
    rows: int
    problem: str | None  # None: ok


def verify_dataset(ds: Dataset) -> tuple[list[Finding], list[str]]:
    """Per shard findings, and the commands that redo what is bad (one per set, in order)."""
    manifest = ds.manifest()
    findings = []
    rows = {}
    for e in manifest["shards"]:
        problem = check_folder(ds.shard_dir(e["name"]), e)
        findings.append(Finding("shards", None, e["name"], e["rows"], problem))
        rows[e["name"]] = e["rows"]
    names = list(rows)
    card = ds.card()
    for kind in ("labels", "returns"):
        for set_name, entry in manifest[kind].items():
            listed = [e["name"] for e in entry["shards"]]
            for name in names:
                if name not in listed:
                    findings.append(Finding(kind, set_name, name, 0, "is not in the set"))
            for e in entry["shards"]:
                problem = check_folder(ds.folder(kind, e["name"], set_name), e)
                if problem is None and e["name"] in entry.get("stale", []):
                    problem = "is stale (its trajectory shard was regenerated)"
                if problem is None:
                    problem = ("has no trajectory shard" if e["name"] not in rows else
                               ds.derived_rows_problem(kind, e["name"], set_name))
                findings.append(Finding(kind, set_name, e["name"], e["rows"], problem))
        for set_name in card.get(kind, {}):
            if set_name not in manifest[kind]:
                findings.append(Finding(kind, set_name, "-", 0, "is not complete"))
    commands = []
    bad_kinds = {(f.kind, f.set_name) for f in findings if f.problem}
    for kind, set_name in sorted(bad_kinds, key=lambda k: (k[0] != "shards", str(k))):
        hint = ds.redo_hint(kind, set_name)
        if hint not in commands:
            commands.append(hint)
    return findings, commands
