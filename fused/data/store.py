"""Trajectory datasets on disk: zarr v3 groups, one per shard, indexed by a manifest.

    D/card.json                  what the data is: format, env, policy, seed, commit, counts,
                                 label sets, and "observation": each observation column's row
                                 {"shape", "dtype", "layout"} (frames: [H, W, 3] uint8)
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

Format versions (the card's "format"): v2 stores a frame column as pictures [N, H, W, 3] and
records the observation columns' layouts in the card; v1 (before) stored frames flat
[N, H * W * 3] and recorded none. A v1 dataset keeps its v1 card (a set added, a generation or
recording continued: the shards written then hold pictures) and reads as v2: `Dataset.read`
reshapes each shard's frames to the layouts its env gives.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import zarr
from zarr.codecs import ZstdCodec

from fused.data.redo import redo_command
from fused.envspec import spec
from fused.errors import ConfigError
from fused.rl.obs_codec import ObsCodec
from fused.runs.files import atomic_write_json
from fused.runs.invocation import command

CHUNK_ROWS = 1024  # rows per compressed chunk (the unit of random access)
RECORD = "record.json"

FORMAT = "craftax-fused/trajectories/v2"
FORMAT_V1 = "craftax-fused/trajectories/v1"  # frames flat, no "observation" in the card


SET_NOUN = {"labels": "label set", "returns": "returns set"}


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
    g = zarr.open_group(str(folder), mode="w", zarr_format=3)
    for name, a in columns.items():
        a = np.ascontiguousarray(a)
        kind = a.dtype.name
        if kind == "bfloat16":  # zarr v3 has no bfloat16: its bits, named in the attributes
            a = a.view(np.uint16)
        chunk_rows = min(CHUNK_ROWS, max(a.shape[0], 1))
        # The shard (one file) must hold whole chunks: rows rounded up to a chunk multiple
        # (zarr pads the last chunk; the array's shape keeps the true row count).
        shard_rows = -(-max(a.shape[0], 1) // chunk_rows) * chunk_rows
        inner = tuple(max(d, 1) for d in a.shape[1:])  # an empty column (an env without
        # achievements has 0 bytes of them per row) still has chunks of positive size
        arr = g.create_array(name, shape=a.shape, dtype=a.dtype,
                             chunks=(chunk_rows,) + inner,
                             shards=(shard_rows,) + inner, compressors=ZstdCodec(level=3),
                             attributes={"dtype": kind})
        if a.size:
            arr[...] = a
    g.attrs.update(attrs or {})


# zarr notes the record file beside a group's arrays when it lists them: expected. (A filter for
# the process, not `warnings.catch_warnings` around each read: that swaps the filters of every
# thread, and the streamed loader reads in threads of its own, so a read could see them restored.)
warnings.filterwarnings("ignore", f"Object at {RECORD} is not recognized")


def open_group(folder: Path):
    return zarr.open_group(str(folder), mode="r")


def read_group(folder: Path, names=None, rows: slice | np.ndarray | None = None) -> dict:
    """Columns of a zarr group (all or `names`), optionally only some rows."""
    return _read(open_group(folder), names, rows)


def _read(g, names, rows) -> dict:
    out = {}
    have = sorted(g.array_keys())
    for name in names or have:
        if name not in have:  # e.g. frames asked of a dataset whose observations are vectors
            raise DatasetError(f"{str(g.store_path).removeprefix('file://')}: no array {name!r} "
                               f"(it holds {', '.join(have)}); "
                               "it was written for another env or format: regenerate it")
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


def to_layout(columns: dict[str, np.ndarray], layouts: dict[str, dict]) -> dict:
    """`columns` with each one `layouts` describes given its row shape: the same bytes reshaped
    (a v1 dataset's flat frames [N, H * W * C] become [N, H, W, C]); DatasetError where a
    column's rows hold another number of values than its layout."""
    out = dict(columns)
    for name, a in columns.items():
        if name not in layouts:
            continue
        want = tuple(layouts[name]["shape"])
        if a.shape[1:] == want:
            continue
        if int(np.prod(a.shape[1:])) != int(np.prod(want)):
            raise DatasetError(f"column {name!r} holds rows of shape {list(a.shape[1:])}, not "
                               f"the {list(want)} its layout says: written for another env or "
                               "format; regenerate it")
        out[name] = a.reshape(a.shape[:1] + want)
    return out


def attrs(folder: Path) -> dict:
    return dict(open_group(folder).attrs)


def commit_group(final: Path, columns: dict[str, np.ndarray], attrs: dict | None = None) -> dict:
    """Write `columns` as the group `final` through a temporary folder and one rename; returns
    its manifest entry {"name", "rows", "digest"}. An existing `final` is replaced, unless it
    holds these very bytes (then it is left as it is)."""
    rows = int(next(iter(columns.values())).shape[0]) if columns else 0
    tmp = final.with_name(f".tmp-{final.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write_group(tmp, columns, attrs)
        entry = {"name": final.name, "rows": rows, "digest": digest(tmp)}
        if committed(final, verify=False) == entry and digest(final) == entry["digest"]:
            return entry  # the same bytes are there already (a rerun): leave them untouched
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
    try:
        entry = json.loads(rec.read_text())
    except ValueError:
        entry = None
    if entry is None or verify and digest(folder) != entry["digest"]:
        warnings.warn(f"{folder} does not match its recorded digest: damaged, redoing it",
                      stacklevel=2)
        shutil.rmtree(folder)
        return None
    return entry


class Dataset:
    """A dataset folder: card, manifest, shard and label-set paths, column reads."""

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser()
        self._manifest: dict | None = None
        self._observation: dict | None = None
        self._verified: set = set()

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
                               f"`{command('label.py')} generate --out DIR ...`")
        card = json.loads(self.card_path.read_text())
        if card.get("format") not in (FORMAT, FORMAT_V1):
            raise DatasetError(f"{self.root}/card.json has format {card.get('format')!r}, not "
                               f"{FORMAT!r}: not a craftax-fused trajectory dataset")
        return card

    def write_card(self, card: dict) -> None:
        """Writes `card`; a new one (no "format") as the current format, with its env's
        observation layouts. A card read from the dataset keeps its format (a v1 dataset's
        shards stay as they were written)."""
        card = {"format": FORMAT, **card}
        if card["format"] == FORMAT and "observation" not in card:
            card["observation"] = observation_layouts(card["env"])
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.card_path, card)
        self._observation = None

    def observation(self) -> dict:
        """Each observation column's row layout {column: {"shape", "dtype", "layout"}}: the
        card's, or for a v1 card (which records none) its env's."""
        if self._observation is None:
            card = self.card()
            self._observation = card.get("observation") or observation_layouts(card["env"])
        return self._observation

    def manifest(self) -> dict:
        if not self.manifest_path.is_file():
            raise DatasetError(f"{self.root} has no manifest.json (generation did not finish, "
                               f"or it was removed): {self.redo_hint('shards')} (it finishes "
                               "or rebuilds it)")
        try:
            m = json.loads(self.manifest_path.read_text())
            if not isinstance(m, dict) or not all(
                    {"name", "rows", "digest"} <= set(s) for s in m["shards"]):
                raise ValueError("no list of shards with name, rows and digest")
        except (ValueError, KeyError, TypeError) as e:
            raise DatasetError(f"{self.manifest_path} is unreadable ({str(e).splitlines()[0]}"
                               f"): {self.redo_hint('shards')} (it rebuilds the manifest from "
                               "the shards' records and keeps the label and returns sets)"
                               ) from None
        m.setdefault("labels", {})
        m.setdefault("returns", {})
        return m

    def write_manifest(self, manifest: dict) -> None:
        atomic_write_json(self.manifest_path, manifest)
        self._manifest = None

    def shard_names(self) -> list[str]:
        return [s["name"] for s in self.manifest()["shards"]]

    # --- integrity ------------------------------------------------------------------------------
    def redo_hint(self, kind: str, set_name: str | None = None) -> str:
        """The command that rewrites a part of this dataset (it redoes only what is missing,
        damaged or stale and keeps everything else)."""
        try:
            card = json.loads(self.card_path.read_text())
        except (OSError, ValueError):
            card = {}
        return f"rerun `{redo_command(self.root, card, kind, set_name)}`"

    def manifest_cached(self) -> dict:
        if self._manifest is None:
            self._manifest = self.manifest()
        return self._manifest

    def folder(self, kind: str, name: str, set_name: str | None = None) -> Path:
        if kind == "shards":
            return self.shard_dir(name)
        return self.label_dir(set_name, name) if kind == "labels" else \
            self.returns_dir(set_name, name)

    def problem(self, kind: str, name: str, set_name: str | None = None) -> str | None:
        """What is wrong with shard `name` of `kind` ('shards', or a 'labels' / 'returns' set)
        against the manifest, or None: not listed, stale, missing, damaged (sha256), a row
        count other than the manifest's or (a derived set) than its trajectory shard's."""
        m = self.manifest_cached()
        if kind != "shards":
            entry = m[kind].get(set_name)
            if entry is None:
                return "belongs to no complete set (the set is not finished)"
            if name in entry.get("stale", []):
                return "is stale (its trajectory shard was regenerated with other bytes)"
        entries = m["shards"] if kind == "shards" else m[kind][set_name]["shards"]
        listed = [e for e in entries if e["name"] == name]
        if not listed:
            return "is not in the manifest"
        folder = self.folder(kind, name, set_name)
        problem = check_folder(folder, listed[0])
        if problem or kind == "shards":
            return problem
        trajectory = [e["rows"] for e in m["shards"] if e["name"] == name]
        if not trajectory:
            return "has no trajectory shard"
        column = "label_row" if kind == "labels" else "rtg"
        n = json.loads((folder / column / "zarr.json").read_text())["shape"][0]
        return None if n == trajectory[0] else \
            f"has {n} rows, its trajectory shard {trajectory[0]}"

    def verify(self, kind: str, name: str, set_name: str | None = None) -> None:
        """`problem` as a DatasetError naming the shard and the command that redoes it; once
        per Dataset object (a verified shard is not hashed again)."""
        key = (kind, name, set_name)
        if key in self._verified:
            return
        problem = self.problem(kind, name, set_name)
        if problem:  # another writer may have changed the manifest since: read it again
            self._manifest = None
            problem = self.problem(kind, name, set_name)
        if problem:
            what = "shard" if kind == "shards" else f"{SET_NOUN[kind]} {set_name!r} shard"
            raise DatasetError(f"{self.root}: {what} {name} {problem}: "
                               f"{self.redo_hint(kind, set_name)}")
        self._verified.add(key)

    # --- reads (each shard verified against the manifest first) ----------------------------------
    def read(self, name: str, columns=None, rows=None) -> dict:
        """Columns of shard `name`, the observation columns in their layout (`observation`)."""
        self.verify("shards", name)
        return to_layout(read_group(self.shard_dir(name), columns, rows), self.observation())

    def read_labels(self, label: str, name: str) -> dict:
        self.verify("labels", name, label)
        return read_group(self.label_dir(label, name))

    def read_returns(self, label: str, name: str) -> dict:
        self.verify("returns", name, label)
        return read_group(self.returns_dir(label, name))


def observation_layouts(env: str) -> dict:
    """The observation columns' layouts of a dataset of `env` (`fused.rl.obs_codec`)."""
    return ObsCodec(spec(env)).layouts


def check_folder(folder: Path, entry: dict) -> str | None:
    """What is wrong with a committed folder against its manifest entry, or None: missing, no
    record, damaged files (digest), or a row count that differs from the manifest's."""
    if not folder.is_dir():
        return "is missing"
    if not (folder / RECORD).is_file():
        return f"has no {RECORD} (an incomplete copy?)"
    if digest(folder) != entry["digest"]:
        return "is damaged (its files do not match the manifest's sha256)"
    try:  # row counts from the arrays' metadata (zarr.json), as zarr reads them
        shapes = {p.parent.name: json.loads(p.read_text())["shape"]
                  for p in folder.glob("*/zarr.json")}
        # label sets: `hidden` has the set's rows (label_row the trajectory shard's)
        lengths = {shapes[k][0] for k in (["hidden"] if "hidden" in shapes else shapes)}
    except (OSError, ValueError, KeyError, IndexError) as e:
        return f"has unreadable array metadata ({type(e).__name__})"
    if len(lengths) > 1:
        return f"has arrays of different lengths {sorted(lengths)}"
    held = lengths.pop() if lengths else 0
    if entry["rows"] != held:
        return f"holds {held} rows but the manifest says {entry['rows']}"
    return None
