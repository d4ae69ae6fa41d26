"""Episodes played by an evaluation (`play.py llm --record D`) written as a label.py dataset:
the same shards, manifest and card as `label.py generate` writes, so `label.py label|returns`
and `offline.py bc|awr` take it unchanged.

Evaluation plays one episode per env without resets; its blocks of records ([T, N]) come with
`live` [T, N], true while the env's episode was running. Episode i is env i's rows while live
(one episode id each, in env order); an episode cut by the step cap ends in a row that is
neither terminated nor truncated, which `label.py returns` treats as cut by the end of the data.
The dataset is written into a temporary folder beside the target and renamed into place when
whole, so an interrupted recording leaves nothing at the target (rerun the command). An
interrupted play writes the episodes it finished as a dataset marked partial (card `partial`,
`run`), which the same play's `--resume` replaces, whole, when it ends.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from fused.data.episodes import Rows, concat, take
from fused.data.generate import host_rows, repo_commit
from fused.data.store import Dataset, commit_group
from fused.errors import ConfigError


def check_new_dataset(out: str, partial_of: str | None = None) -> Dataset:
    """The folder a recording goes to: new or empty (a recording is never merged into data),
    or the partial recording of the play `partial_of` (a run folder) that is resumed."""
    ds = Dataset(out)
    if ds.root.exists() and any(ds.root.iterdir()):
        made_by = _partial_of(ds)
        if partial_of is not None and made_by and Path(made_by).resolve() == Path(
                partial_of).resolve():
            return ds
        raise ConfigError(f"--record {ds.root} exists and is not empty; a recording writes a new "
                          "dataset: choose another folder or remove it")
    return ds


def _partial_of(ds: Dataset) -> str | None:
    """The run whose interrupted play wrote `ds` (a partial recording), else None."""
    try:
        card = ds.card()
    except Exception:  # not a dataset at all
        return None
    return card.get("run") if card.get("partial") else None


def episodes_of(blocks: list, live: list) -> list[Rows]:
    """Per env, its rows while live. blocks: per block the `Record`s [T, N, ...] (host numpy),
    live: per block [T, N] bool."""
    rows = concat([host_rows(rec, sum(len(x) for x in live[:i]), 0)
                   for i, rec in enumerate(blocks)])
    alive = np.concatenate(live)  # [T, N]
    out = []
    for e in range(alive.shape[1]):
        ep = take({k: v[:, e] for k, v in rows.items()}, alive[:, e])
        out.append(dict(ep, episode_id=np.full(len(ep["action"]), e, np.int64)))
    return out


def write_played(target: Path, env_name: str, episodes: list[Rows], source: dict,
                 shard_rows: int) -> dict:
    """Commit `episodes` as shards of `shard_rows` rows (an episode may cross a boundary), the
    manifest and the card (`source`: who played and the command that plays again), in a
    temporary folder renamed to `target` when whole (replacing an empty folder or the same
    run's partial recording). Returns the card's counts."""
    target = Path(target)
    tmp = target.with_name(f".{target.name}.partial-{os.getpid()}")
    for old in target.parent.glob(f".{target.name}.partial-*"):  # of interrupted recordings
        shutil.rmtree(old, ignore_errors=True)
    ds = Dataset(tmp)
    rows = concat(episodes) if episodes else {}
    n = len(rows.get("action", ()))
    entries = []
    for i, start in enumerate(range(0, n, shard_rows)):
        part = take(rows, slice(start, min(n, start + shard_rows)))
        entries.append(commit_group(ds.shard_dir(f"s000-{i:06d}"), part))
    counts = {"rows": n, "shards": len(entries), "episodes_kept": len(episodes),
              "episodes_incomplete": int(sum(not (e["terminated"][-1] | e["truncated"][-1])
                                             for e in episodes if len(e["action"])))}
    ds.write_card({"env": env_name, **source, "commit": repo_commit(), "labels": {},
                   "returns": {}, "counts": counts})
    ds.write_manifest({"shards": entries, "labels": {}, "returns": {}})
    if target.exists() and any(target.iterdir()):  # this play's partial recording (checked)
        old = target.with_name(f".{target.name}.replaced-{os.getpid()}")
        os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old)
    else:
        if target.exists():  # empty (checked before playing)
            target.rmdir()
        os.rename(tmp, target)
    return counts
