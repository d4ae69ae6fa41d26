"""A dataset's rows as training arrays for `offline.py`: observations kept compact (the map bits
packed, decoded per minibatch on the device), actions, returns-to-go, which rows may be sampled,
and, with a label set, each row's index into one table of hidden states.

Everything is read through the dataset's own zarr reader (`fused.data.store`), shard by shard in
manifest order, and checked against the manifest (a label or returns set must cover every
shard). The hidden-state normaliser is computed here from the rows trained on (each row's state
counted once per row that uses it) and saved with the policy, so evaluation normalises exactly as
training did.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fused.data.store import Dataset, DatasetError, array_names


class TrainingData(NamedTuple):
    arrays: dict  # {"rows": column -> [rows, ...], "valid_index": [V], "hidden_table": [M, H]}
    env: str
    rows: int  # rows in the dataset
    valid: int  # rows that may be sampled
    hidden_size: int  # 0 without labels
    hidden_mean: np.ndarray | None  # [H] float64, over the valid rows
    hidden_var: np.ndarray | None


def pick_set(kind: str, available: dict, name: str | None, root) -> str:
    if name is not None:
        if name not in available:
            raise DatasetError(f"{kind} set {name!r} is not in {root} (there: "
                               f"{', '.join(available) or 'none'}); create it with "
                               f"`python label.py {'label' if kind == 'label' else 'returns'} "
                               f"--data {root} ...`")
        return name
    if len(available) != 1:
        raise DatasetError(f"{root} has {len(available)} {kind} sets ({', '.join(available) or 'none'}"
                           f"); name one with --{kind}s" if available else
                           f"{root} has no returns set; run `python label.py returns --data {root}`"
                           " first")
    return next(iter(available))


def load_training_data(root: str, returns: str | None = None,
                       labels: str | None = None) -> tuple[TrainingData, str, str | None]:
    """(data, returns set used, label set used)."""
    ds = Dataset(root)
    card, manifest = ds.card(), ds.manifest()
    ret_name = pick_set("return", manifest.get("returns", {}), returns, ds.root)
    if labels is not None:
        pick_set("label", manifest.get("labels", {}), labels, ds.root)
    names = [s["name"] for s in manifest["shards"]]
    for kind, sets in (("returns", {ret_name: manifest["returns"][ret_name]}),
                       ("labels", {labels: manifest["labels"][labels]} if labels else {})):
        for set_name, entry in sets.items():
            if [s["name"] for s in entry["shards"]] != names:
                raise DatasetError(f"{kind} set {set_name!r} of {ds.root} does not cover its "
                                   "shards; rerun the label.py command that writes it")
    obs_cols = ["obs_bits", "obs_aux"] if "obs_bits" in array_names(ds.shard_dir(names[0])) \
        else ["obs"]
    parts: dict[str, list] = {k: [] for k in obs_cols + ["action", "rtg", "valid"]}
    hidden, hidden_index, offset = [], [], 0
    for name in names:
        cols = ds.read(name, obs_cols + ["action"])
        ret = ds.read_returns(ret_name, name)
        for k in obs_cols:
            parts[k].append(cols[k])
        parts["action"].append(cols["action"].astype(np.int32))
        parts["rtg"].append(ret["rtg"].astype(np.float32))
        parts["valid"].append(ret["valid"])
        if labels:
            lab = ds.read_labels(labels, name)
            hidden.append(lab["hidden"])
            hidden_index.append(lab["label_row"].astype(np.int64) + offset)
            offset += len(lab["hidden"])
    rows = {k: np.concatenate(v) for k, v in parts.items()}
    valid = rows.pop("valid")
    arrays = {"rows": rows, "valid_index": np.flatnonzero(valid).astype(np.int32)}
    if not len(arrays["valid_index"]):
        raise DatasetError(f"{ds.root}: no row has a valid return-to-go (every episode cut by "
                           "the end of the data?); generate more steps or use "
                           "`label.py returns --incomplete bootstrap`")
    mean = var = None
    size = 0
    if labels:
        table = np.concatenate(hidden)
        index = np.concatenate(hidden_index)
        arrays["hidden_table"] = table
        rows["hidden_index"] = index.astype(np.int32)
        mean, var = weighted_moments(table, np.bincount(index[valid], minlength=len(table)))
        size = table.shape[1]
    return (TrainingData(arrays, card["env"], len(valid), int(valid.sum()), size, mean, var),
            ret_name, labels)


def weighted_moments(table: np.ndarray, counts: np.ndarray, block: int = 65536):
    """Mean and variance over the rows of `table` [M, H] counted `counts` [M] times each
    (float64, in blocks so that a large table is never copied whole)."""
    total = counts.sum()
    acc = np.zeros(table.shape[1])
    for s in range(0, len(table), block):
        acc += counts[s:s + block] @ table[s:s + block].astype(np.float64)
    mean = acc / total
    acc[:] = 0
    for s in range(0, len(table), block):
        acc += counts[s:s + block] @ (table[s:s + block].astype(np.float64) - mean) ** 2
    return mean, acc / total
