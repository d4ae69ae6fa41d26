"""`label.py returns`: discounted returns-to-go of every row, as a named returns set.

Rows are episode-contiguous within a stream and shards are in stream order, so the whole
dataset read in manifest order is one sequence of episodes; returns-to-go run backwards over it
as one linear recurrence, x[i] = r[i] + gamma * c[i] * x[i + 1] (c[i] = 0 where the episode ends
at row i), computed with an associative scan, so an episode spanning any number of shards needs
no special case. An episode's last row:
- terminated: x = r (nothing after it);
- truncated (time limit): x = r + gamma * V(final observation) (the behaviour critic's, stored
  at generation; without a critic, x = r);
- neither (cut by the end of the data: incomplete): `exclude` (default) keeps x = r but flags
  the episode's rows complete = valid = False for loaders to skip; `bootstrap` sets x = V(s)
  of that last row, the behaviour critic's estimate of the return from it (valid = True).
Stored per shard: rtg [rows] float32, complete [rows] (the episode ended within the data),
valid [rows] (rtg estimates a return: what loaders train on).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from fused.errors import ConfigError
from fused.data.config import ReturnsConfig
from fused.data.store import Dataset, commit_group, committed
from fused.runs.cluster import barrier
from fused.runs.interrupts import stop_if_interrupted

COLUMNS = ("reward", "terminated", "truncated", "episode_id", "value", "truncation_value")


def returns_to_go(reward, terminated, truncated, episode_id, value, truncation_value, gamma,
                  incomplete="exclude"):
    """All [R] in row order (episodes contiguous). Returns (rtg [R] float32, complete [R]: the
    row's episode ended within the data, valid [R]: its rtg estimates a return (complete, or
    bootstrapped))."""
    n = len(reward)
    last = np.ones(n, bool)
    last[:-1] = episode_id[1:] != episode_id[:-1]  # the episode's last row
    ended = terminated | truncated
    complete_ep = (ended & last)
    # complete flag per row: the flag of its episode's last row, spread back over the episode
    ep_index = np.cumsum(np.r_[True, last[:-1]]) - 1
    complete = complete_ep[last][ep_index]
    tail = np.zeros(n, np.float64)  # what follows the last row of an episode
    boot = truncated & last & np.isfinite(truncation_value)
    tail[boot] = gamma * truncation_value[boot]
    cont = np.where(last, 0.0, gamma)
    b = reward.astype(np.float64) + tail
    valid = complete
    if incomplete == "bootstrap":
        cut = last & ~ended & np.isfinite(value)
        b[cut] = value[cut]
        valid = complete | cut[last][ep_index]
    rtg = _linear_recurrence(cont.astype(np.float32), b.astype(np.float32))
    return np.asarray(rtg, np.float32), complete, valid


@jax.jit
def _linear_recurrence(a, b):
    """x[i] = b[i] + a[i] * x[i + 1], x past the end 0: a reverse associative scan."""
    def combine(later, earlier):  # (a, b) pairs; `later` holds the elements after `earlier`
        a2, b2 = later
        a1, b1 = earlier
        return a1 * a2, b1 + a1 * b2

    _, x = jax.lax.associative_scan(combine, (jnp.asarray(a), jnp.asarray(b)), reverse=True)
    return x


def no_return_fix(critic: bool, policy: str | None = None) -> str:
    """What to do about data where no row has a valid return-to-go: bootstrapping needs the
    behaviour critic's values, which random, LLM and human play lack."""
    if critic:
        return "use `label.py returns --incomplete bootstrap`"
    if policy == "human":
        return ("play an episode to its end with `play.py human` on the same --out (or end "
                "them sooner with --env.max-episode-steps), then rerun `label.py returns`; "
                "a person's play has no critic to bootstrap from")
    return ("generate more --steps (or shorter episodes, --env.max-episode-steps); its policy "
            "had no critic to bootstrap from")


def compute_returns(c: ReturnsConfig, console) -> Dataset:
    ds = Dataset(c.data)
    card, manifest = ds.card(), ds.manifest()
    name = c.set_name
    done = None if c.overwrite else manifest["returns"].get(name)
    if done is not None and (done.get("gamma"), done.get("incomplete")) != (c.gamma,
                                                                            c.incomplete):
        raise ConfigError(f"returns set {name!r} in {ds.root} has gamma {done.get('gamma')} and "
                          f"incomplete={done.get('incomplete')}; pass --overwrite to replace it "
                          "or --name for another")
    t0 = time.time()
    shards = manifest["shards"]
    parts = []
    for s in shards:  # (read and verified shard by shard: a safe point each)
        stop_if_interrupted()
        parts.append(ds.read(s["name"], list(COLUMNS)))
    cols = {k: np.concatenate([p[k] for p in parts]) for k in COLUMNS}
    if c.incomplete == "bootstrap" and not np.isfinite(cols["value"]).any():
        raise ConfigError("incomplete=bootstrap needs the behaviour critic's values; this "
                          f"dataset's policy ({ds.card().get('policy', 'unknown')}) had none: "
                          "use incomplete=exclude")
    rtg, complete, valid = returns_to_go(**cols, gamma=c.gamma, incomplete=c.incomplete)
    proc, nproc = jax.process_index(), jax.process_count()
    ds.returns_dir(name).mkdir(parents=True, exist_ok=True)
    offset, redone = 0, 0
    for i, s in enumerate(shards):
        stop_if_interrupted()
        n = s["rows"]
        if done is not None and ds.problem("returns", s["name"], name) is None:
            offset += n  # a complete set: rewrite only what is stale or damaged
            continue
        if i % nproc == proc:
            redone += 1
            commit_group(ds.returns_dir(name, s["name"]),
                         {"rtg": rtg[offset:offset + n], "complete": complete[offset:offset + n],
                          "valid": valid[offset:offset + n]})
        offset += n
    barrier("label.py returns: shards done")
    if proc == 0:
        last = np.r_[cols["episode_id"][1:] != cols["episode_id"][:-1], True]
        episodes = int(last.sum())
        entry = {"gamma": c.gamma, "incomplete": c.incomplete, "episodes": episodes,
                 "episodes_incomplete": int((~complete[last]).sum()),
                 "rows_incomplete": int((~complete).sum())}
        manifest = ds.manifest()
        manifest.setdefault("returns", {})[name] = dict(entry, shards=[
            committed(ds.returns_dir(name, s["name"]), verify=False) for s in shards])
        ds.write_manifest(manifest)
        card = ds.card()
        ds.write_card(dict(card, returns={**card.get("returns", {}), name: entry}))
        if done is not None:
            console.print(f"returns {name!r}: every shard verified; {redone} rewritten")
            return ds
        console.print(f"done: returns {name!r} (gamma {c.gamma}) for {len(rtg):,} rows, "
                      f"{episodes:,} episodes ({entry['episodes_incomplete']} incomplete: "
                      f"{c.incomplete}) in {time.time() - t0:.1f}s")
        if not valid.any():  # nothing an offline run could train on: say so now, not later
            critic = bool(np.isfinite(cols["value"]).any())
            console.print(f"warning: no row of {ds.root} has a valid return-to-go (every "
                          f"episode cut by the end of the data); "
                          f"{no_return_fix(critic, ds.card().get('policy'))}")
    return ds
