"""A dataset's rows as training arrays for `offline.py`: observations kept compact (the map bits
packed, decoded per minibatch on the device), actions, returns-to-go, which rows may be sampled,
and, with a label set, each row's index into one table of hidden states. For a recurrent policy
(`sequences`), also each row's validity and whether the carry must restart there (an episode
starts, or the rows before it are not the ones before it in the data).

Everything is read through the dataset's own zarr reader (`fused.data.store`), shard by shard in
manifest order, and checked against the manifest (a label or returns set must cover every
shard). The hidden-state normaliser is computed here from the rows trained on (each row's state
counted once per row that uses it) and saved with the policy, so evaluation normalises exactly as
training did.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from fused.data.returns import no_return_fix
from fused.data.store import Dataset, DatasetError
from fused.envspec import spec
from fused.rl.obs_codec import ObsCodec
from fused.runs.invocation import command


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
            make = "label" if kind == "label" else "returns"
            raise DatasetError(f"{kind} set {name!r} is not in {root} (there: "
                               f"{', '.join(available) or 'none'}); create it with "
                               f"`{command('label.py')} {make} --data {root} ...`")
        return name
    if len(available) != 1:
        raise DatasetError(f"{root} has {len(available)} {kind} sets ({', '.join(available) or 'none'}"
                           f"); name one with --{kind}s" if available else
                           f"{root} has no returns set; run `{command('label.py')} returns "
                           f"--data {root}` first")
    return next(iter(available))


class TrainingSet(NamedTuple):
    """A dataset checked for training: its shards (manifest order) and the sets to read."""

    ds: Dataset
    env: str
    names: list[str]
    rows: list[int]  # per shard
    obs_cols: list[str]
    returns: str
    labels: str | None


def open_training_set(root: str, returns: str | None = None,
                      labels: str | None = None) -> TrainingSet:
    ds = Dataset(root)
    card, manifest = ds.card(), ds.manifest()
    names = [s["name"] for s in manifest["shards"]]
    try:
        ret_name = pick_set("return", manifest.get("returns", {}), returns, ds.root)
        if labels is not None:
            pick_set("label", manifest.get("labels", {}), labels, ds.root)
    except DatasetError:
        for name in names:  # damage first: its repair comes before making any set
            ds.verify("shards", name)
        raise
    for kind, sets in (("returns", {ret_name: manifest["returns"][ret_name]}),
                       ("labels", {labels: manifest["labels"][labels]} if labels else {})):
        for set_name, entry in sets.items():
            if [s["name"] for s in entry["shards"]] != names:
                raise DatasetError(f"{kind} set {set_name!r} of {ds.root} does not cover its "
                                   "shards; rerun the label.py command that writes it")
    return TrainingSet(ds, card["env"], names, [s["rows"] for s in manifest["shards"]],
                       ObsCodec(spec(card["env"])).columns, ret_name, labels)


def read_window(ts: TrainingSet, shards: list[int], pad_rows: int | None = None,
                sequences: bool = False) -> dict:
    """The rows of `shards` as training arrays: {"rows": columns, "valid_index", "num_valid",
    "hidden_table"}; with `pad_rows`, every array is padded to that many rows (padding is never
    sampled), so windows of any shards share one compiled chunk. `sequences` adds the row
    columns "valid" and "episode_start" (a new episode begins, or a shard that does not follow
    the previous one in the data: windows skip shards)."""
    parts: dict[str, list] = {k: [] for k in ts.obs_cols + ["action", "rtg", "valid"]}
    starts: list[np.ndarray] = []
    before = None  # (shard index, its last row's episode id) of the shard read before
    hidden, hidden_index, offset = [], [], 0
    for i in shards:
        name = ts.names[i]
        cols = ts.ds.read(name, ts.obs_cols + ["action"] + (["episode_id"] if sequences else []))
        if sequences:
            ep = cols["episode_id"]
            first = np.r_[True, ep[1:] != ep[:-1]]
            if len(ep) and before == (i - 1, ep[0]):
                first[0] = False  # the episode goes on from the shard before
            before = (i, ep[-1]) if len(ep) else None
            starts.append(first)
        ret = ts.ds.read_returns(ts.returns, name)
        for k in ts.obs_cols:
            parts[k].append(cols[k])
        parts["action"].append(cols["action"].astype(np.int32))
        parts["rtg"].append(ret["rtg"].astype(np.float32))
        parts["valid"].append(ret["valid"])
        if ts.labels:
            lab = ts.ds.read_labels(ts.labels, name)
            hidden.append(lab["hidden"])
            hidden_index.append(lab["label_row"].astype(np.int64) + offset)
            offset += len(lab["hidden"])
    rows = {k: np.concatenate(v) for k, v in parts.items()}
    valid = rows.pop("valid")
    if sequences:
        rows["valid"] = valid.astype(bool)
        rows["episode_start"] = np.concatenate(starts)
    index = np.flatnonzero(valid).astype(np.int32)
    out = {"rows": rows, "valid_index": index, "num_valid": np.int32(len(index))}
    if ts.labels:
        out["hidden_table"] = np.concatenate(hidden)
        rows["hidden_index"] = np.concatenate(hidden_index).astype(np.int32)
    if pad_rows is not None:
        pad = lambda a: np.concatenate([a, np.zeros((pad_rows - len(a),) + a.shape[1:],  # noqa
                                                    a.dtype)])
        out["rows"] = {k: pad(v) for k, v in rows.items()}
        out["valid_index"] = pad(index)
        if ts.labels:
            out["hidden_table"] = pad(out["hidden_table"])
    return out


def hidden_moments(ts: TrainingSet) -> tuple[np.ndarray, np.ndarray, int]:
    """Mean and variance of the hidden state over the rows with a valid return (each row's state
    counted once per row that uses it), shard by shard; and the count."""
    total, acc, acc2 = 0, None, None
    for name in ts.names:
        lab = ts.ds.read_labels(ts.labels, name)
        valid = ts.ds.read_returns(ts.returns, name)["valid"]
        counts = np.bincount(lab["label_row"][valid], minlength=len(lab["hidden"]))
        h = lab["hidden"].astype(np.float64)
        acc = counts @ h if acc is None else acc + counts @ h
        acc2 = counts @ h ** 2 if acc2 is None else acc2 + counts @ h ** 2
        total += int(counts.sum())
    mean = acc / total
    return mean, np.maximum(acc2 / total - mean ** 2, 0.0), total


class WindowStream:
    """Data larger than the device: each chunk trains on a window of whole shards (at most
    `window_rows` rows) drawn by a seeded permutation for that chunk index, read with the
    dataset's zarr reader one window ahead in a background thread. The window of chunk c
    depends on (seed, c) only, so a resumed run sees the windows an uninterrupted one does."""

    def __init__(self, ts: TrainingSet, window_rows: int, seed: int, sequences: bool = False):
        if window_rows < max(ts.rows):
            raise DatasetError(f"device_rows={window_rows} is below the largest shard's "
                               f"{max(ts.rows)} rows; raise it (a window holds whole shards)")
        self.ts, self.window_rows, self.seed, self.sequences = ts, window_rows, seed, sequences
        self.pool = ThreadPoolExecutor(1)
        self.pending: dict[int, object] = {}

    def shards(self, chunk: int) -> list[int]:
        order = np.random.default_rng([self.seed, chunk]).permutation(len(self.ts.names))
        picked, rows = [], 0
        for i in order:
            if rows + self.ts.rows[i] <= self.window_rows:
                picked.append(int(i))
                rows += self.ts.rows[i]
        return sorted(picked)

    def _read(self, chunk: int) -> dict:
        return read_window(self.ts, self.shards(chunk), self.window_rows, self.sequences)

    def window(self, chunk: int) -> dict:
        """Chunk `chunk`'s window (host arrays); starts reading the next one."""
        fut = self.pending.pop(chunk, None)
        data = fut.result() if fut is not None else self._read(chunk)
        self.pending = {chunk + 1: self.pool.submit(self._read, chunk + 1)}
        return data


def no_return_error(ds: Dataset, names: list[str]) -> DatasetError:
    """The error for data without one valid return-to-go, naming the fix that applies:
    bootstrapping needs the behaviour critic's values, which random and LLM play lack."""
    critic = any(np.isfinite(ds.read(n, ["value"])["value"]).any() for n in names)
    return DatasetError(f"{ds.root}: no row has a valid return-to-go (every episode cut by the "
                        f"end of the data?); {no_return_fix(critic, ds.card().get('policy'))}")


def load_training_data(root: str, returns: str | None = None, labels: str | None = None,
                       sequences: bool = False) -> tuple[TrainingData, str, str | None]:
    """The whole dataset in memory: (data, returns set used, label set used)."""
    ts = open_training_set(root, returns, labels)
    arrays = read_window(ts, list(range(len(ts.names))), sequences=sequences)
    if not arrays["num_valid"]:
        raise no_return_error(ts.ds, ts.names)
    mean = var = None
    size = 0
    if labels:
        mean, var, _ = hidden_moments(ts)
        size = arrays["hidden_table"].shape[1]
    return (TrainingData(arrays, ts.env, sum(ts.rows), int(arrays["num_valid"]), size, mean,
                         var), ts.returns, labels)
