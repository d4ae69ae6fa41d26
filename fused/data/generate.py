"""`label.py generate`: roll out a behaviour policy and write a trajectory dataset.

Each stream (num_envs / streams envs with their own keys) runs jitted blocks of `block_steps`
steps on this process's devices; the host assembles whole episodes and commits shards of
`shard_rows` rows (`fused.data.episodes`). After every commit the stream saves a resume point
(the device carry, the rows still waiting, the counters) as one more committed group, so a run
killed at any moment and started again writes the same bytes. Process i of n (jax.distributed)
takes streams i, i + n, ...; process 0 writes the manifest once all are done.

Per row: the observation acted on (`fused.rl.obs_codec`: symbolic ones exact, map bits packed;
frames as uint8 pictures [H, W, 3], their layout in the card), action, reward,
terminated, truncated, log_prob and value of the behaviour policy, the critic's value of the
final observation where truncated, step within the episode, stream step `t`, global env index,
achievements unlocked at that step (bits), episode id. An LLM-augmented behaviour policy's
hidden states go to the label set `behaviour`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from functools import partial
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from fused.errors import ConfigError
from fused.data.config import GenerateConfig, parse_part
from fused.data.episodes import EpisodeAssembler, Rows
from fused.data.store import (SET_NOUN, Dataset, DatasetError, attrs, commit_group, committed,
                               observation_layouts, read_group, to_layout)
from fused.agent import needs_text
from fused.envspec import spec
from fused.trained_policy import is_run, load_policy
from fused.rl.acting import epsilon_mixture, network_policy, random_policy
from fused.rl.collect import make_collect
from fused.rl.envs import make_env
from fused.rl.policy_input import Identity
from fused.rl.sharding import AXIS, jit_init, on_device
from fused.runs.cluster import part_done
from fused.runs.config_io import to_dict
from fused.runs.interrupts import interrupt_requested, stop_if_interrupted
from fused.runs.progress import JobProgress
from llm_jax.graphs import loop_jit

# Fields that do not change the data (a rerun may differ in them).
OPERATIONAL = ("out", "num_devices", "resume_seconds", "part", "cuda_graphs")


def repo_commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "fused",
                                "llm_jax", "label.py"], capture_output=True, text=True).stdout
        return rev + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def shard_name(stream: int, index: int) -> str:
    return f"s{stream:03d}-{index:06d}"


class ActingPolicy:
    """Who acts: the behaviour policy, its parameters and policy input (host setup)."""

    def __init__(self, c: GenerateConfig, num_devices: int):
        s = spec(c.env.name)
        if c.policy == "random":
            self.act, self.params, self.inputs = random_policy(s.num_actions), None, Identity()
            self.trained_inputs, self.source = None, {"policy": "random"}
            self.text = False
            return
        if not is_run(c.policy):  # (load_policy's line, with what only --policy here takes)
            raise ConfigError(f"--policy {c.policy}: no config.json there; pass a run folder "
                              "written by train.py or offline.py, or `random`")
        pol = load_policy(c.policy, c.envs_per_stream, c.checkpoint, num_devices)
        self.text = needs_text(pol.cfg)  # an LLM beside a CNN reads the text twin's observation
        if pol.cfg.env.name != c.env.name:
            raise ConfigError(f"env.name={c.env.name!r} but the policy {c.policy} was trained on "
                              f"{pol.cfg.env.name!r}")
        self.act = network_policy(pol.agent.network, epsilon_mixture(c.epsilon, s.num_actions))
        self.params, self.inputs, self.trained_inputs = pol.params, pol.agent.inputs, \
            pol.inputs_state
        self.source = {"policy": str(pol.run_dir), "checkpoint": pol.step,
                       "epsilon": c.epsilon, "run_config": to_dict(pol.cfg)}


def generate(c: GenerateConfig, console) -> Dataset:
    ds = Dataset(c.out)
    part = parse_part(c.part, jax.process_count())
    proc, nproc = part or (jax.process_index(), jax.process_count())
    devices = jax.local_devices()[:c.num_devices or jax.local_device_count()]
    behaviour = ActingPolicy(c, len(devices))
    card = {"env": c.env.name, "generate": {k: v for k, v in to_dict(c).items()
                                            if k not in OPERATIONAL}, **behaviour.source}
    check_card(ds, card)
    if (proc == 0 or part is not None) and not ds.card_path.exists():  # any part may be first
        ds.write_card(dict(card, commit=repo_commit(), labels={}, returns={}))
    writer = StreamWriter(ds, c, behaviour, devices)
    if len(devices) > 1:
        console.print(f"{len(devices)} devices: each stream's {c.envs_per_stream} envs split "
                      "over them")
    mine = [g for g in range(c.streams) if g % nproc == proc]
    t_start = time.time()
    with JobProgress(console, len(mine) * c.steps * c.envs_per_stream, unit="steps",
                     description="generating", rate=True) as progress:
        for g in mine:
            stop_if_interrupted()
            writer.run(g, progress)
    stop_if_interrupted()
    if part_done(console, c.part, f"{len(mine)} streams", "label.py generate: streams done"):
        return ds
    if proc == 0:
        finish(ds, c, card, time.time() - t_start, console)
    return ds


def check_card(ds: Dataset, card: dict) -> None:
    """A dataset already at --out must have been started by the same command (then it is
    resumed); anything else is an error naming the first difference."""
    if not ds.root.exists() or not any(ds.root.iterdir()):
        return
    if not ds.card_path.is_file():
        raise ConfigError(f"out={ds.root} exists and is not a dataset; choose another --out")
    old = ds.card()
    for k in ("env", "policy", "checkpoint", "epsilon"):
        if old.get(k) != card.get(k):
            raise ConfigError(f"out={ds.root} holds a dataset with {k}={old.get(k)!r}, not "
                              f"{card.get(k)!r}; choose another --out")
    # settings added since the dataset was written took their defaults there
    saved = with_defaults(old["generate"], to_dict(GenerateConfig(out="")))
    for k, v in card["generate"].items():
        if saved.get(k) != v:
            raise ConfigError(f"out={ds.root} holds a dataset generated with {k}="
                              f"{saved.get(k)!r}, not {v!r}; choose another --out")


def with_defaults(saved, defaults):
    """`saved` (a config's dict as a card recorded it) with the fields it lacks, at any depth,
    taken from `defaults`."""
    if not (isinstance(saved, dict) and isinstance(defaults, dict)):
        return saved
    return {**defaults, **{k: with_defaults(v, defaults.get(k)) for k, v in saved.items()}}


class StreamWriter:
    """Generates one stream after another on this process's devices."""

    def __init__(self, ds: Dataset, c: GenerateConfig, behaviour: ActingPolicy,
                 devices: list):
        self.ds, self.c, self.b = ds, c, behaviour
        s = spec(c.env.name)
        n = len(devices)
        col = make_collect(s, make_env(c.env, behaviour.text), c.env, behaviour.act,
                           behaviour.inputs, c.envs_per_stream, c.block_steps,
                           AXIS if n > 1 else None, n)
        mesh = Mesh(np.array(devices), (AXIS,))
        if n > 1:
            init, block = shard_collector(col.init, col.block, mesh, behaviour.inputs)
            self.init = jax.jit(init)
        else:
            block, self.init = col.block, jit_init(col)
        self.block = loop_jit(block, c.cuda_graphs, donate_argnums=0)
        self.sharded = n > 1  # (then the collector places the state on the devices itself)
        # parameters and LLM arrays on this process's devices: committed to the one device
        # (`on_device`), or replicated over several (a checkpoint restores onto one device)
        place = on_device if not self.sharded else partial(
            jax.device_put, device=NamedSharding(mesh, P()))
        self.frozen = place(behaviour.inputs.frozen)
        self.params = place(behaviour.params)

    def fresh(self, g: int):
        key = jax.random.fold_in(jax.random.PRNGKey(self.c.seed), g)
        state = self.init(key, self.frozen)
        if self.b.trained_inputs is not None:
            adopted = state.replace(inputs=self.b.inputs.adopt(state.inputs,
                                                               self.b.trained_inputs))
            # the trained run's arrays (its LLM normaliser) placed as the collector's own are:
            # replicated over the devices when sharded (they came from one device)
            state = adopted if not self.sharded else jax.device_put(
                adopted, jax.tree.map(lambda x: x.sharding, state))
        return state if self.sharded else on_device(state)

    def run(self, g: int, progress: JobProgress) -> None:
        c, ds = self.c, self.ds
        work = ds.work / f"stream-{g:03d}"
        if (work / "done.json").is_file():
            done = json.loads((work / "done.json").read_text())
            if all(committed(ds.shard_dir(shard_name(g, i)), verify=True)
                   for i in range(done["shards"])):
                progress.advance(c.steps * c.envs_per_stream)
                return
            (work / "done.json").unlink()  # a shard is damaged: regenerate the stream
        asm = EpisodeAssembler(c.envs_per_stream, c.shard_rows, g, c.streams, c.min_return)
        state, t0, shards = self.fresh(g), 0, 0
        resumed = self.resume_point(g, work, state, asm)
        if resumed is not None:
            state, t0, shards = resumed
            progress.advance(t0 * c.envs_per_stream)
        # Block k + 1 is dispatched before block k's rows are written, so the device steps
        # while the host assembles and compresses (a resume point needs the carry after block
        # k, which the next dispatch donates: then the next block waits for it).
        last_point = time.monotonic()
        running = self.dispatch(state, t0) if t0 < c.steps else None
        while running is not None:
            state, rec = running
            t_next = t0 + c.block_steps
            point = t_next < c.steps and (time.monotonic() - last_point >= c.resume_seconds
                                          or interrupt_requested())  # (saved, then stop)
            running = self.dispatch(state, t_next) if t_next < c.steps and not point else None
            rows = host_rows(jax.device_get(rec), t0, g * c.envs_per_stream)
            valid = min(c.block_steps, c.steps - t0)
            for shard in asm.add_block({k: v[:valid] for k, v in rows.items()}):
                self.commit(g, shards, shard)
                shards += 1
            t0 = t_next
            progress.advance(valid * c.envs_per_stream)
            if point:
                self.save_resume_point(work, state, t0, shards, asm)
                last_point = time.monotonic()
                stop_if_interrupted()  # a safe point: committed shards and this resume point
                running = self.dispatch(state, t0)
        for shard in asm.finish():
            self.commit(g, shards, shard)
            shards += 1
        work.mkdir(parents=True, exist_ok=True)
        (work / "done.json").write_text(json.dumps({"shards": shards, "stats": asm.stats}))
        for old in work.glob("resume-*"):
            shutil.rmtree(old)

    def dispatch(self, state, t0: int):
        """Starts one block (asynchronously): (state after it, its records)."""
        return self.block(state, self.params, self.frozen, np.int32(t0))

    def commit(self, g: int, index: int, rows: Rows) -> None:
        name = shard_name(g, index)
        hidden = rows.pop("behaviour_hidden", None)
        commit_group(self.ds.shard_dir(name), rows)
        if hidden is not None:
            self.ds.label_dir("behaviour").mkdir(parents=True, exist_ok=True)
            commit_group(self.ds.label_dir("behaviour", name),
                         {"hidden": hidden, "label_row": np.arange(len(hidden), dtype=np.int32)})

    # --- resume ---------------------------------------------------------------------------------
    def save_resume_point(self, work: Path, state, t0: int, shards: int,
                          asm: EpisodeAssembler) -> None:
        work.mkdir(parents=True, exist_ok=True)
        rows, meta = asm.state()
        carry = {f"carry_{i:04d}": np.asarray(x).reshape((-1,) if np.ndim(x) == 0 else
                                                         np.shape(x))
                 for i, x in enumerate(jax.tree.leaves(jax.device_get(state)))}
        name = f"resume-{t0:010d}"
        commit_group(work / name, {**rows, **carry}, dict(meta, t0=t0, shards=shards))
        for old in work.glob("resume-*"):
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)

    def resume_point(self, g: int, work: Path, fresh, asm: EpisodeAssembler):
        """(state, t0, shards) of the stream's latest resume point, or None to start over: no
        point yet, or a shard written before it is missing or damaged (found by its digest;
        the stream is then regenerated from its start, rewriting the good shards unchanged)."""
        points = sorted(p for p in work.glob("resume-*") if committed(p, verify=False))
        if points and committed(points[-1], verify=True) is None:  # damaged: start over
            points = []
        if not points:
            return None
        meta = attrs(points[-1])
        before = [self.ds.shard_dir(shard_name(g, i)) for i in range(int(meta["shards"]))]
        if not all(committed(p, verify=True) for p in before):
            for p in points:
                shutil.rmtree(p)
            return None
        cols = resume_rows(points[-1], self.c.env.name)
        leaves, treedef = jax.tree.flatten(fresh)
        restored = [jax.device_put(cols.pop(f"carry_{i:04d}").reshape(np.shape(x)).astype(x.dtype),
                                   x.sharding) for i, x in enumerate(leaves)]
        asm.restore(cols, meta)
        return jax.tree.unflatten(treedef, restored), int(meta["t0"]), int(meta["shards"])


def resume_rows(point: Path, env_name: str) -> dict:
    """A resume point's columns (rows waiting, the carry's leaves), the observation columns in
    the layout shards are written in now (a point a v1 writer saved holds flat frames)."""
    return to_layout(read_group(point), observation_layouts(env_name))


def host_rows(rec, t0: int, env_offset: int) -> Rows:
    """A block's records as dataset columns [T, N, ...] (numpy)."""
    if not rec.obs_exact.all():
        raise DatasetError("observation map entries outside {0, 1}: they cannot be stored as "
                           "bits; this env's layout in fused.envspec is wrong")
    t, n = rec.action.shape
    rows = dict(rec.obs)
    rows.update(action=rec.action.astype(np.uint8), reward=rec.reward,
                terminated=rec.terminated, truncated=rec.truncated, log_prob=rec.log_prob,
                value=rec.value, truncation_value=rec.truncation_value,
                step=rec.step.astype(np.int32), unlocked=rec.unlocked,
                t=np.broadcast_to((t0 + np.arange(t, dtype=np.int32))[:, None], (t, n)),
                env=np.broadcast_to(env_offset + np.arange(n, dtype=np.int32), (t, n)))
    if "hidden" in rec.extra:
        rows["behaviour_hidden"] = np.asarray(rec.extra["hidden"]).astype(ml_dtypes.bfloat16)
    return rows


def shard_collector(init, block, mesh, inputs):
    """init/block under shard_map over `mesh`, this process's devices (envs split)."""
    per_device = jax.vmap(init, in_axes=(None, None), axis_name=AXIS, axis_size=mesh.size)
    shape = jax.eval_shape(per_device, jax.random.PRNGKey(0), inputs.frozen)
    specs = shape.replace(env=jax.tree.map(lambda _: P(AXIS), shape.env),
                          inputs=inputs.state_specs(shape.inputs, AXIS), rng=P(),
                          achieved=P(AXIS), carry=jax.tree.map(lambda _: P(AXIS), shape.carry))
    rec_spec = P(None, AXIS)

    def wrap(f, i, o):
        return jax.shard_map(f, mesh=mesh, in_specs=i, out_specs=o, check_vma=False)

    return (wrap(init, (P(), P()), specs),
            wrap(block, (specs, P(), P(), P()), (specs, rec_spec)))


def merge_stats(parts: list[dict]) -> dict:
    """The streams' assembler counters added up (the best return: the maximum)."""
    stats: dict = {}
    for part in parts:
        for k, v in part.items():
            if k == "return_max_finished":
                known = [x for x in (stats.get(k), v) if x is not None]
                stats[k] = max(known) if known else None
            else:
                stats[k] = stats.get(k, 0) + v
    return stats


def finish(ds: Dataset, c: GenerateConfig, card: dict, seconds: float, console) -> None:
    """Manifest from the committed shards (and the behaviour label set), card with counts. The
    label and returns sets of an earlier manifest are kept; where a shard they were computed
    from now has other bytes, they are marked stale for those shards (their command redoes
    them) and one line says so."""
    stats = merge_stats([json.loads((ds.work / f"stream-{g:03d}" / "done.json").read_text())
                         ["stats"] for g in range(c.streams)])
    folder = ds.root / "shards"
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) \
        if folder.is_dir() else []
    if not names:
        best = stats.get("return_max_finished")
        best = "none" if best is None else f"{best:.2f}"
        raise DatasetError(
            f"no episode was kept: {stats['episodes_finished']:,} episodes finished (best "
            f"return {best}) and --min-return {c.min_return} keeps none of them; lower "
            "--min-return or raise --steps (rerun with another --out)")
    shards = [committed(ds.shard_dir(n), verify=False) for n in names]
    if any(s is None for s in shards):
        raise DatasetError(f"{ds.root}: a shard lost its record during generation; rerun")
    try:
        old_manifest = ds.manifest() if ds.manifest_path.is_file() else None
    except DatasetError:  # unreadable: rebuilt from the records below
        old_manifest = None
    old = ds.card()
    manifest = {"shards": shards, "labels": {}, "returns": {}}
    changed = set()
    if old_manifest is not None:
        before = {s["name"]: s["digest"] for s in old_manifest["shards"]}
        changed = {s["name"] for s in shards if before.get(s["name"]) != s["digest"]}
    labels = dict(old.get("labels", {}))
    if ds.label_dir("behaviour").is_dir():
        manifest["labels"]["behaviour"] = {"shards": [
            committed(ds.label_dir("behaviour", n), verify=False) for n in names]}
        run = card.get("run_config", {})
        labels["behaviour"] = {"source": "the behaviour policy's own hidden states (raw, before "
                                         "its normaliser)", "llm": run.get("llm"),
                               "dtype": "bfloat16", "skip_n": (run.get("llm") or {}).get("skip_n")}
    for kind in ("labels", "returns"):
        for set_name in old.get(kind, {}):
            if kind == "labels" and set_name == "behaviour":
                continue
            entry = kept_set(ds, kind, set_name, names, old_manifest, changed)
            if entry is not None:
                manifest[kind][set_name] = entry
                if entry.get("stale"):
                    console.print(f"{SET_NOUN[kind]} {set_name!r} is stale for "
                                  f"{len(entry['stale'])} regenerated shard(s): "
                                  f"{ds.redo_hint(kind, set_name)}")
    counts = {"rows": sum(s["rows"] for s in shards), "shards": len(shards), **stats}
    ds.write_manifest(manifest)
    ds.write_card(dict(old, labels=labels, counts=counts))
    console.print(f"done: {counts['shards']} shards, {counts['rows']:,} rows, "
                  f"{stats['episodes_kept']:,} episodes kept ({stats['episodes_incomplete']} cut "
                  f"by the end of the data), {seconds:.0f}s -> {ds.root}")


def kept_set(ds: Dataset, kind: str, set_name: str, names: list[str], old_manifest: dict | None,
             changed: set) -> dict | None:
    """A label or returns set's manifest entry after regeneration: the old entry (rebuilt from
    the shards' records if the old manifest is unreadable) with the regenerated shards whose
    bytes changed listed as stale; None if the set was never completed."""
    entry = (old_manifest or {}).get(kind, {}).get(set_name)
    if entry is None:
        if old_manifest is not None:
            return None  # a partial set: its own command finishes it
        records = [committed(ds.folder(kind, n, set_name), verify=False) for n in names]
        if any(r is None for r in records):
            return None
        entry = {"shards": records}
        if kind == "returns":
            entry.update(ds.card().get("returns", {}).get(set_name, {}))
    stale = sorted(set(entry.get("stale", [])) | (changed & set(names)))
    return dict(entry, stale=stale) if stale else {k: v for k, v in entry.items()
                                                    if k != "stale"}
