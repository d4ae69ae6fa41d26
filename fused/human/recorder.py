"""Human play recorded as a label.py dataset, step by step, losing at most the step being taken.

    D/card.json, D/manifest.json, D/shards/h-<first row:09d>/  the dataset (label.py's format;
                                        one stream, "h", whose episodes cross shards)
    D/work/human/lock                   held (flock) by the one process recording into D
    D/work/human/steps/<t:09d>.npz      each step's row, written whole (rename) before the
                                        page hears of it: the journal of rows not yet in a shard
    D/work/human/game.npz               the game after the last journaled step (its env state,
                                        seed, episode id, return), written whole after that row

A step writes its row, then the game; a kill (or a failed write) between the two leaves a row
past the saved game's count, which no commit takes and reopening drops (the step the game
never took). Rows are committed into a shard
(`commit`: the shard, then the manifest, then the card, then the journal files removed) when an
episode ends, when `shard_rows` are waiting, and when the server stops; reopening commits what a
kill left waiting and continues the game where it stood. Every episode's seed is in the card
(`human.episodes`), with which its actions play it again exactly (`fused.human.game.replay`).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

import jax
import numpy as np

from fused.data.episodes import concat
from fused.data.generate import repo_commit
from fused.data.store import Dataset, DatasetError, commit_group, to_layout
from fused.errors import ConfigError
from fused.human.game import Game
from fused.runs.files import atomic_path

SHARD_PREFIX = "h-"  # one stream (the name before "-"): label.py follows episodes across it


def check_out(root: str | Path, env: str, max_episode_steps: int | None = None) -> dict | None:
    """The card of the human-play dataset at `root` recording `env` (None: a new or empty folder,
    or one holding only work/, a first run stopped before its card); ConfigError, one line, for
    anything else. Reads only the card: called before anything compiles or loads textures."""
    ds = Dataset(root)
    if not ds.card_path.exists():
        if ds.root.exists() and any(p.name != "work" for p in ds.root.iterdir()):
            raise ConfigError(f"--out {ds.root} exists and is not a dataset: record into "
                              "a new or empty folder")
        return None
    card = ds.card()  # DatasetError if foreign
    if card.get("policy") != "human":
        raise ConfigError(f"--out {ds.root} is a dataset of policy {card.get('policy')!r}, not "
                          "human play: record into another folder")
    if card["env"] != env:
        raise ConfigError(f"--out {ds.root} holds {card['env']} play; record {env} into "
                          f"another folder (or play --env.name {card['env']})")
    human = card.get("human", {})
    kept = human.get("max_episode_steps")  # (absent: recorded before it was kept; the flag)
    if "max_episode_steps" in human and max_episode_steps is not None and (
            max_episode_steps != kept):
        raise ConfigError(f"--out {ds.root} was recorded with --env.max-episode-steps "
                          f"{kept or 'unset (the env default)'}, not {max_episode_steps}: drop "
                          "the flag to go on, or record into another folder")
    return card


class Recorder:
    """The dataset at `root` opened for recording `game` (created if new; reopened: the same
    env, the journal committed, the game restored). `close()` commits and releases it."""

    def __init__(self, root: str | Path, game: Game, seed: int, command: str,
                 shard_rows: int = 1024):
        self.ds = Dataset(root)
        self.game, self.command, self.shard_rows = game, command, shard_rows
        self.work = self.ds.root / "work" / "human"
        self.steps_dir = self.work / "steps"
        self._lock_file = None
        self._done_rows: int | None = None
        self._saved_t = 0  # rows the saved game (game.npz) has taken
        self.resumed = False
        fresh = check_out(self.ds.root, game.name, game.max_episode_steps) is None
        self._lock()
        if fresh:
            self.ds.write_card({"env": game.name, "policy": "human", "command": command,
                                "commit": repo_commit(), "labels": {}, "returns": {},
                                "counts": {"rows": 0, "shards": 0},
                                "human": {"episodes": {},
                                          "max_episode_steps": game.max_episode_steps}})
            self.ds.write_manifest({"shards": [], "labels": {}, "returns": {}})
        self._recover(seed)

    # --- opening -----------------------------------------------------------------------------

    def _lock(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        f = open(self.work / "lock", "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            who = f.read().strip() or "another process"
            f.close()
            raise ConfigError(f"--out {self.ds.root} is being recorded by {who}; one recorder "
                              "per dataset: close that one first or record into another "
                              "folder") from None
        f.seek(0)
        f.truncate()
        f.write(f"play.py human (pid {os.getpid()})\n")
        f.flush()
        self._lock_file = f

    def committed_rows(self) -> int:
        """Rows in the manifest's shards (read once; `commit` keeps it)."""
        if self._done_rows is None:
            self._done_rows = sum(s["rows"] for s in self.ds.manifest()["shards"])
        return self._done_rows

    def _recover(self, seed: int) -> None:
        """The journal made consistent with the manifest and the game; its rows committed; the
        game restored (or a new one at `seed`)."""
        self.steps_dir.mkdir(parents=True, exist_ok=True)
        meta = self._load_game()
        done_rows = self.committed_rows()
        if meta:
            self.t = meta["t"]
        else:  # no game saved (removed, say): the journal's unbroken rows are kept
            self.t = done_rows
            while (self.steps_dir / f"{self.t:09d}.npz").is_file():
                self.t += 1
        self._saved_t = self.t
        for p in self.steps_dir.glob("*.npz"):
            t = int(p.stem) if p.stem.isdigit() else -1
            if t < done_rows or t >= self.t:  # committed already, or never taken by the game
                p.unlink()
        for p in self.steps_dir.glob("*.tmp*"):  # a row cut mid-write
            p.unlink()
        if meta and meta["t"] < done_rows:
            raise DatasetError(f"{self.work / 'game.npz'} is older than the data ({meta['t']} "
                               f"rows, the manifest has {done_rows}): remove it to start a new "
                               "game")
        self._recount()
        self.commit()
        if meta and not meta["over"]:
            self.episode_id = meta["episode_id"]
            self.resumed = True
        else:
            self.episode_id = self._next_episode_id()
            self.game.new(meta["next_seed"] if meta else seed)
            self._begin_episode()

    def _recount(self) -> None:
        """The card's counts from the shards, where a kill between the manifest and the card
        left them behind (`commit` keeps them as it goes)."""
        card = self.ds.card()
        if card.get("counts", {}).get("rows") == self.committed_rows():
            return
        names = [s["name"] for s in self.ds.manifest()["shards"]]
        ids = [self.ds.read(n, ["episode_id"])["episode_id"] for n in names]
        ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        card["counts"] = {"rows": self.committed_rows(), "shards": len(names),
                          "episodes": int(len(np.unique(ids))),
                          "last_episode": int(ids[-1]) if len(ids) else -1}
        self.ds.write_card(card)

    def _load_game(self) -> dict | None:
        path = self.work / "game.npz"
        if not path.is_file():
            return None
        like = self.game.like()
        try:
            with np.load(path) as z:
                meta = json.loads(bytes(z["meta"]).decode())
                leaves = [z[f"arr_{i}"] for i in range(len(z.files) - 2)]
                obs = z["obs"]
            state = jax.tree.unflatten(jax.tree.structure(like), leaves)
        except Exception as e:  # damaged: numpy / zipfile raise many kinds
            raise DatasetError(f"{path} does not read back ({type(e).__name__}); remove it to "
                               "start a new game (the recorded rows stay)") from None
        self.game.set(state, obs, meta["seed"], meta["episode_return"], meta["over"])
        return meta

    def _next_episode_id(self) -> int:
        eps = self.ds.card().get("human", {}).get("episodes", {})
        return max((int(k) for k in eps), default=-1) + 1

    def _begin_episode(self) -> None:
        card = self.ds.card()
        card.setdefault("human", {}).setdefault("episodes", {})[str(self.episode_id)] = \
            self.game.seed
        self.ds.write_card(card)
        self._save_game()

    # --- playing -----------------------------------------------------------------------------

    def step(self, action: int) -> dict:
        """Plays `action`, journals its row and the game; commits a shard when an episode ends
        or `shard_rows` wait. Returns the row."""
        row = self.game.act(action)
        row.update(t=np.array([self.t], np.int32), env=np.zeros(1, np.int32),
                   episode_id=np.array([self.episode_id], np.int64))
        with atomic_path(self.steps_dir / f"{self.t:09d}.npz") as tmp:
            np.savez(tmp, **row)
        self.t += 1
        self._save_game()
        if self.game.over or self.t - self.committed_rows() >= self.shard_rows:
            self.commit()
        return row

    def new_game(self, seed: int) -> None:
        """Abandons the running episode (its rows stay, cut) and starts one at `seed`."""
        self.commit()
        self.episode_id = self._next_episode_id()
        self.game.new(seed)
        self._begin_episode()

    def next_episode(self) -> None:
        """After an episode ended: the next one, at the next seed."""
        self.new_game(self.game.seed + 1)

    def _save_game(self) -> None:
        leaves = [np.asarray(x) for x in jax.device_get(jax.tree.leaves(self.game.state))]
        meta = {"t": self.t, "episode_id": self.episode_id, "seed": self.game.seed,
                "episode_return": self.game.episode_return, "over": self.game.over,
                "next_seed": self.game.seed + 1, "saved": time.time()}
        with atomic_path(self.work / "game.npz") as tmp:
            np.savez_compressed(tmp, *leaves, obs=np.asarray(self.game.obs),
                                meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))
        self._saved_t = self.t  # rows below it are the saved game's: the ones a commit takes

    # --- committing --------------------------------------------------------------------------

    def commit(self) -> int:
        """The journal's rows as one shard (then the manifest, the card, the journal emptied).
        Returns the rows committed. Only rows the saved game took (below its count) are taken;
        the manifest is read anew, so a commit stopped after it was written is not repeated."""
        manifest = self.ds.manifest()
        first = self._done_rows = sum(s["rows"] for s in manifest["shards"])
        files = []
        for p in sorted(self.steps_dir.glob("*.npz")):
            t = int(p.stem) if p.stem.isdigit() else -1
            if t < first:  # committed by a commit stopped before removing its journal
                p.unlink()
            elif t < self._saved_t:
                files.append(p)
        if not files:
            return 0
        rows = []
        for p in files:
            with np.load(p) as z:  # (a journal of a v1 recorder holds flat frames)
                rows.append(to_layout({k: z[k] for k in z.files}, self.game.codec.layouts))
        cols = concat(rows)
        if int(cols["t"][0]) != first or len(files) != int(cols["t"][-1]) - first + 1:
            raise DatasetError(f"{self.steps_dir}: journal rows {int(cols['t'][0])}.."
                               f"{int(cols['t'][-1])} do not follow the {first} rows "
                               "committed; move the folder aside and record anew")
        entry = commit_group(self.ds.shard_dir(f"{SHARD_PREFIX}{first:09d}"), cols)
        manifest["shards"].append(entry)
        self.ds.write_manifest(manifest)
        self._done_rows = first + len(files)
        card = self.ds.card()
        # episodes with rows: ids only grow, and a shard may continue the last one
        old = card.get("counts", {})
        ids = np.unique(cols["episode_id"])
        episodes = old.get("episodes", 0) + int((ids != old.get("last_episode", -1)).sum())
        card["counts"] = {"rows": self._done_rows, "shards": len(manifest["shards"]),
                          "episodes": episodes, "last_episode": int(cols["episode_id"][-1])}
        self.ds.write_card(card)
        for p in files:
            p.unlink()
        return len(files)

    def close(self) -> None:
        """Commits what waits and releases the dataset."""
        if self._lock_file is None:
            return
        try:
            self.commit()
        finally:
            self._lock_file.close()
            self._lock_file = None
