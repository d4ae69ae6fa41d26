"""The command that rewrites a part of a dataset, rebuilt from what its card recorded: the flags
that differ from the defaults, so an error about a missing, damaged or stale shard can name the
exact command that redoes it (every label.py command redoes only what is bad)."""

from __future__ import annotations

import shlex
from pathlib import Path

from fused.runs.config_io import flatten, to_dict
from fused.runs.invocation import command


def flags(values: dict, defaults: dict, prefix: str = "") -> list[str]:
    """`--a.b-c value` for each flattened field whose value differs from the default."""
    out = []
    base = flatten(defaults)
    for key, value in flatten(values).items():
        if key in base and base[key] == value:
            continue
        path, _, leaf = (prefix + key).rpartition(".")
        leaf = leaf.replace("_", "-")
        flag = f"--{path + '.' if path else ''}{leaf}"
        if isinstance(value, bool):  # tyro: --x / --no-x (--a.x / --a.no-x)
            out.append(flag if value else f"--{path + '.' if path else ''}no-{leaf}")
        elif isinstance(value, (list, tuple)):
            out.extend([flag, *(str(v) for v in value)])
        else:
            out.extend([flag, str(value)])
    return out


def redo_command(root: Path, card: dict, kind: str, set_name: str | None = None) -> str:
    """`python label.py generate|label|returns ...` for `kind` 'shards', 'labels', 'returns'."""
    from fused.data.config import GENERATE_PRESETS, LabelConfig

    if kind == "shards" and "command" in card:  # not generated: the command that played it
        return card["command"]
    if kind == "shards" or (kind == "labels" and set_name == "behaviour"):
        args = ["generate", "--out", str(root)]
        recorded = card.get("generate")
        if recorded is not None:
            args += flags(recorded, to_dict(GENERATE_PRESETS["cpu"][1]))
        else:
            args += ["..."]  # a card without the generate config: flags unknown
    elif kind == "labels":
        entry = card.get("labels", {}).get(set_name) or {}
        args = ["label", "--data", str(root), "--name", str(set_name)]
        if "llm" in entry:
            llm = {k: v for k, v in entry["llm"].items() if k != "imagine"}  # label.py's own
            args += flags(llm, to_dict(LabelConfig(data="").llm), "llm.")
        if entry.get("imagine"):  # (its `sampling`: the values the flags resolved to)
            imagine = {k: v for k, v in entry["imagine"].items() if k != "sampling"}
            args += flags(imagine, to_dict(LabelConfig(data="").imagine), "imagine.")
        if entry.get("dtype", "bfloat16") != "bfloat16":
            args += ["--dtype", entry["dtype"]]
    else:
        entry = card.get("returns", {}).get(set_name) or {}
        args = ["returns", "--data", str(root), "--gamma", str(entry.get("gamma", "G")),
                "--name", str(set_name)]
        if entry.get("incomplete", "exclude") != "exclude":
            args += ["--incomplete", entry["incomplete"]]
    return f"{command('label.py')} " + shlex.join(args)
