"""Trajectory datasets on disk: zarr v3 groups, one per shard, indexed by a manifest.

    D/card.json                  what the data is: env, policy, seed, commit, counts, label sets
    D/manifest.json              {"shards": [{"name", "rows", "digest"}], "labels": {NAME: {...,
                                 "shards": [...]}}, "returns": {NAME: {..., "shards": [...]}}}
    D/shards/<name>/             zarr group: one array per column, rows along axis 0
    D/labels/<NAME>/<name>/      hidden states of shard <name>: hidden [M, H], label_row [rows]
    D/returns/<NAME>/<name>/     returns-to-go of shard <name>
    D/work/                      resume state and temporaries (not part of the data)

Why zarr v3: chunked, compressed (zstd) n-d arrays with random access by row range, numpy in and
out, no server; each shard is its own group, so independent writers never share a file, and its
bytes are deterministic (no timestamps), so a shard's sha256 names its content. A shard is
written under a temporary name, its digest recorded inside it (`record.json`, outside the
digest), and committed by one rename: a shard folder that exists is complete, and one whose
files no longer match its record is damaged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np

from fused.config import ConfigError
from fused.runs.files import atomic_write_json

CHUNK_ROWS = 1024  # rows per compressed chunk (the unit of random access)
RECORD = "record.json"

FORMAT = "craftax-fused/trajectories/v1"


class DatasetError(ConfigError):
    """A dataset that is missing, foreign, inconsistent or damaged; the message says which."""


def digest(folder: Path) -> str:
    """sha256 over a shard folder's files (sorted relative path, NUL, bytes), record excluded."""
    h = hashlib.sha256()
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != RECORD)
    for p in files:
        h.update(p.relative_to(folder).as_posix().encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()


def write_group(folder: Path, columns: dict[str, np.ndarray], attrs: dict | None = None) -> None:
    """One zarr v3 group with an array per column (same length along axis 0), zstd-compressed,
    each array in one file (zarr's sharding codec) of CHUNK_ROWS-row chunks."""
    import zarr
    from zarr.codecs import ZstdCodec

    g = zarr.open_group(str(folder), mode="w", zarr_format=3)
    for name, a in columns.items():
        a = np.ascontiguousarray(a)
        kind = a.dtype.name
        if kind == "bfloat16":  # zarr v3 has no bfloat16: its bits, named in the attributes
            a = a.view(np.uint16)
        rows = max(a.shape[0], 1)
        chunk = (min(CHUNK_ROWS, rows),) + a.shape[1:]
        arr = g.create_array(name, shape=a.shape, dtype=a.dtype, chunks=chunk,
                             shards=(rows,) + a.shape[1:], compressors=ZstdCodec(level=3),
                             attributes={"dtype": kind})
        if a.size:
            arr[...] = a
    g.attrs.update(attrs or {})


@contextlib.contextmanager
def _record_is_expected():
    """zarr notes the record file beside a group's arrays when it lists them: expected."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", f"Object at {RECORD} is not recognized")
        yield


def open_group(folder: Path):
    import zarr

    with _record_is_expected():
        return zarr.open_group(str(folder), mode="r")


def read_group(folder: Path, names=None, rows: slice | np.ndarray | None = None) -> dict:
    """Columns of a zarr group (all or `names`), optionally only some rows."""
    with _record_is_expected():
        return _read(open_group(folder), names, rows)


def _read(g, names, rows) -> dict:
    out = {}
    for name in names or sorted(g.array_keys()):
        a = g[name]
        if rows is None:
            x = a[...]
        elif isinstance(rows, slice):
            x = a[rows]
        else:
            x = a.get_orthogonal_selection((np.asarray(rows),) + (slice(None),) * (a.ndim - 1))
        if a.attrs.get("dtype") == "bfloat16":
            x = x.view(ml_dtypes.bfloat16)
        out[name] = x
    return out


def attrs(folder: Path) -> dict:
    return dict(open_group(folder).attrs)


def array_names(folder: Path) -> set[str]:
    with _record_is_expected():
        return set(open_group(folder).array_keys())


def commit_group(final: Path, columns: dict[str, np.ndarray], attrs: dict | None = None) -> dict:
    """Write `columns` as the group `final` through a temporary folder and one rename; returns
    its manifest entry {"name", "rows", "digest"}. An existing `final` is replaced."""
    rows = int(next(iter(columns.values())).shape[0]) if columns else 0
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write_group(tmp, columns, attrs)
        entry = {"name": final.name, "rows": rows, "digest": digest(tmp)}
        (tmp / RECORD).write_text(json.dumps(entry))
        _fsync_tree(tmp)
        if final.exists():  # a regenerated shard (resume after a kill) or --overwrite
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return entry


def _fsync_tree(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def committed(folder: Path, verify: bool = True) -> dict | None:
    """The manifest entry of a committed shard folder, or None if it is absent. With `verify`,
    a folder whose files do not match its record is reported (one warning line), removed, and
    treated as absent, so the caller redoes it."""
    rec = folder / RECORD
    if not rec.is_file():
        if folder.exists():  # cannot happen through commit_group; a copy gone wrong
            warnings.warn(f"{folder} has no {RECORD}: incomplete, redoing it", stacklevel=2)
            shutil.rmtree(folder)
        return None
    entry = json.loads(rec.read_text())
    if verify and digest(folder) != entry["digest"]:
        warnings.warn(f"{folder} does not match its recorded digest: damaged, redoing it",
                      stacklevel=2)
        shutil.rmtree(folder)
        return None
    return entry


class Dataset:
    """A dataset folder: card, manifest, shard and label-set paths, column reads."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser()

    # --- layout ---------------------------------------------------------------------------------
    @property
    def card_path(self) -> Path:
        return self.root / "card.json"

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def shard_dir(self, name: str) -> Path:
        return self.root / "shards" / name

    def label_dir(self, label: str, name: str | None = None) -> Path:
        d = self.root / "labels" / label
        return d if name is None else d / name

    def returns_dir(self, label: str, name: str | None = None) -> Path:
        d = self.root / "returns" / label
        return d if name is None else d / name

    @property
    def work(self) -> Path:
        return self.root / "work"

    # --- card and manifest ----------------------------------------------------------------------
    def card(self) -> dict:
        if not self.card_path.is_file():
            raise DatasetError(f"{self.root} is not a dataset (no card.json); create one with "
                               "`python label.py generate --out DIR ...`")
        card = json.loads(self.card_path.read_text())
        if card.get("format") != FORMAT:
            raise DatasetError(f"{self.root}/card.json has format {card.get('format')!r}, not "
                               f"{FORMAT!r}: not a craftax-fused trajectory dataset")
        return card

    def write_card(self, card: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.card_path, dict(card, format=FORMAT))

    def manifest(self) -> dict:
        if not self.manifest_path.is_file():
            raise DatasetError(f"{self.root} has no manifest.json: generation did not finish; "
                               "rerun the same `label.py generate` command to complete it")
        return json.loads(self.manifest_path.read_text())

    def write_manifest(self, manifest: dict) -> None:
        atomic_write_json(self.manifest_path, manifest)

    def shard_names(self) -> list[str]:
        return [s["name"] for s in self.manifest()["shards"]]

    # --- reads ----------------------------------------------------------------------------------
    def read(self, name: str, columns=None, rows=None) -> dict:
        return read_group(self.shard_dir(name), columns, rows)

    def read_labels(self, label: str, name: str) -> dict:
        return read_group(self.label_dir(label, name))

    def read_returns(self, label: str, name: str) -> dict:
        return read_group(self.returns_dir(label, name))

