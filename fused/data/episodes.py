"""Host side of dataset generation: blocks of [T, N] step records become whole episodes, in the
order they end, cut into shards of a fixed row count (an episode may cross a shard boundary and
continues at the start of the next shard). Rows of an episode still running wait on the host.

A stream's assembler state (the rows waiting, the episode counter, the statistics) is plain
numpy, saved with the stream's resume point so a killed run continues exactly.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

Rows = dict[str, np.ndarray]  # column -> [rows, ...]


def concat(parts: list[Rows]) -> Rows:
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def take(rows: Rows, sel) -> Rows:
    return {k: v[sel] for k, v in rows.items()}


def num_rows(rows: Rows) -> int:
    return len(next(iter(rows.values())))


class EpisodeAssembler:
    """Turns step blocks of one stream into shards of whole episodes.

    `stream`, `num_streams`: episode ids are `k * num_streams + stream` for the stream's k-th
    finished episode (unique across streams, independent of how many processes ran them).
    `min_return`: keep only episodes whose undiscounted return reaches it (None keeps all);
    episodes still running when the data ends are kept (marked by their last row, which is
    neither terminated nor truncated) only without a threshold, which they cannot be judged by.
    """

    def __init__(self, num_envs: int, shard_rows: int, stream: int = 0, num_streams: int = 1,
                 min_return: float | None = None):
        self.num_envs, self.shard_rows = num_envs, shard_rows
        self.stream, self.num_streams, self.min_return = stream, num_streams, min_return
        self.pending: list[list[Rows]] = [[] for _ in range(num_envs)]
        self.ready: list[Rows] = []  # finished, kept episodes not yet in a shard
        self.ready_rows = 0
        self.next_episode = 0
        self.stats = {"episodes_finished": 0, "episodes_kept": 0, "episodes_incomplete": 0,
                      "rows_kept": 0, "rows_dropped": 0, "return_sum_kept": 0.0,
                      "return_max_finished": None}

    def add_block(self, block: Rows) -> Iterator[Rows]:
        """block: columns [T, N, ...] in time order; yields each full shard's rows."""
        done = block["terminated"] | block["truncated"]  # [T, N]
        finished = []
        for e in range(self.num_envs):
            start = 0
            for end in np.flatnonzero(done[:, e]):
                self.pending[e].append(take(block, (slice(start, end + 1), e)))
                finished.append((int(end), e, concat(self.pending[e])))
                self.pending[e] = []
                start = end + 1
            if start < done.shape[0]:
                self.pending[e].append(take(block, (slice(start, None), e)))
        for _, _, rows in sorted(finished, key=lambda f: (f[0], f[1])):
            self._finish(rows, complete=True)
        yield from self._full_shards()

    def finish(self) -> Iterator[Rows]:
        """The data ends: episodes still running are kept as incomplete (without a threshold);
        yields the remaining shards, the last one shorter."""
        for e in range(self.num_envs):
            if self.pending[e]:
                self._finish(concat(self.pending[e]), complete=False)
                self.pending[e] = []
        yield from self._full_shards()
        if self.ready_rows:
            yield self._cut(self.ready_rows)

    def _finish(self, rows: Rows, complete: bool) -> None:
        n = num_rows(rows)
        ret = float(rows["reward"].sum())
        keep = (self.min_return is None) if not complete else (
            self.min_return is None or ret >= self.min_return)
        self.stats["episodes_finished" if complete else "episodes_incomplete"] += 1
        if complete:
            best = self.stats.get("return_max_finished")
            self.stats["return_max_finished"] = ret if best is None else max(best, ret)
        if not keep:
            self.stats["rows_dropped"] += n
            return
        episode = self.next_episode * self.num_streams + self.stream
        self.next_episode += 1
        self.stats["episodes_kept"] += 1
        self.stats["rows_kept"] += n
        self.stats["return_sum_kept"] += ret
        self.ready.append(dict(rows, episode_id=np.full(n, episode, np.int64)))
        self.ready_rows += n

    def _full_shards(self) -> Iterator[Rows]:
        while self.ready_rows >= self.shard_rows:
            yield self._cut(self.shard_rows)

    def _cut(self, n: int) -> Rows:
        rows = concat(self.ready)
        shard, rest = take(rows, slice(0, n)), take(rows, slice(n, None))
        self.ready_rows -= n
        self.ready = [rest] if self.ready_rows else []
        return shard

    # --- resume -----------------------------------------------------------------------------------
    def state(self) -> tuple[Rows, dict]:
        """(rows waiting: pending episodes with their env index, then ready rows; counters)."""
        parts, owners = [], []
        for e, p in enumerate(self.pending):
            for part in p:
                parts.append(dict(part, episode_id=np.full(num_rows(part), -1, np.int64)))
                owners.append(np.full(num_rows(part), e, np.int32))
        for part in self.ready:
            parts.append(part)
            owners.append(np.full(num_rows(part), -1, np.int32))
        meta = {"next_episode": self.next_episode, "stats": self.stats,
                "ready_rows": self.ready_rows}
        if not parts:
            return {}, meta
        return dict(concat(parts), waiting_env=np.concatenate(owners)), meta

    def restore(self, rows: Rows, meta: dict) -> None:
        self.next_episode, self.stats = meta["next_episode"], dict(meta["stats"])
        self.ready_rows = meta["ready_rows"]
        self.pending = [[] for _ in range(self.num_envs)]
        self.ready = []
        if not rows:
            return
        owner = rows.pop("waiting_env")
        for e in range(self.num_envs):
            mine = owner == e
            if mine.any():
                part = take(rows, mine)
                part.pop("episode_id")
                self.pending[e] = [part]
        if (owner < 0).any():
            self.ready = [take(rows, owner < 0)]
