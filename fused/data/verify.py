"""`label.py verify`: every shard of a dataset (trajectories, each label set, each returns set)
checked against its manifest entry: present, sha256 equal, row counts equal (a derived set's
shard against its trajectory shard). Reads everything, writes nothing."""

from __future__ import annotations

from typing import NamedTuple

from fused.data.store import Dataset


class Finding(NamedTuple):
    kind: str  # "shards", "labels" or "returns"
    set_name: str | None
    shard: str
    rows: int
    problem: str | None  # None: ok


def verify_dataset(ds: Dataset) -> tuple[list[Finding], list[str]]:
    """Per shard findings, and the commands that redo what is bad (one per set, in order)."""
    manifest = ds.manifest()
    names = [e["name"] for e in manifest["shards"]]
    findings = [Finding("shards", None, e["name"], e["rows"], ds.problem("shards", e["name"]))
                for e in manifest["shards"]]
    card = ds.card()
    for kind in ("labels", "returns"):
        for set_name, entry in manifest[kind].items():
            rows = {e["name"]: e["rows"] for e in entry["shards"]}
            for name in dict.fromkeys(names + list(rows)):  # the data's shards, then extras
                findings.append(Finding(kind, set_name, name, rows.get(name, 0),
                                        ds.problem(kind, name, set_name)))
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
