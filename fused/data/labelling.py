"""`label.py label`: hidden states of a dataset's observations as a named label set.

Which rows get a label follows online training at `--llm.skip-n K`: the policy input calls the
LLM when the stream step t is a multiple of K and re-encodes an env at the first step of each
episode; every other row carries the label of the latest labelled row of its episode (what the
online policy acts on with immediate refreshes: `--llm.refresh-wait 1`). A label set stores,
per shard, the encoded states `hidden` [M, H] (bf16 or fp16) and, per row, `label_row` [rows]:
the index of its state. A row whose label comes from an earlier shard (its episode began there)
has that observation re-encoded here, so every shard is self-contained and the shards of one
set are independent units of work (process i of n takes shards i, i + n, ...).

Encoding is the training path's own: the encoder `fused.llm.encoders.make_encoder` picks for the
settings (the text encoder's device renderer, cached prompt prefix and length buckets; a
Qwen3-VL on frames; `--llm.backend vllm` sends the same prompts to a vLLM server).
"""

from __future__ import annotations

import shutil
import threading
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from fused.errors import ConfigError
from fused.llm.config import LLMConfig
from fused.data.config import LabelConfig, parse_part
from fused.data.store import Dataset, DatasetError, commit_group, committed
from fused.envspec import spec, text_env
from fused.llm import batching
from fused.llm.encoder import Encoder
from fused.llm.encoders import kind_of, make_encoder
from fused.rl.obs_codec import ObsCodec
from fused.runs.cluster import barrier, part_done
from fused.runs.config_io import from_dict, to_dict
from fused.runs.blocks import run_blocks
from fused.runs.progress import JobProgress
from llm_jax.graphs import loop_jit

STORAGE = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def labelled(t: np.ndarray, step: np.ndarray, skip_n: int) -> np.ndarray:
    """Rows the online path encodes at skip_n: a call (t % skip_n == 0) or an episode start."""
    return (t % skip_n == 0) | (step == 0)


def label_sources(cols: dict, skip_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which states one shard (episode-contiguous rows) encodes, and which each row uses.

    Returns (source [M]: the row of each state to encode, or -1 for a row of an earlier shard;
    label_row [rows]: each row's state; carried [M, 2]: (episode_id, step) of those earlier
    rows, (-1, -1) for rows of this shard)."""
    t, step, ep = cols["t"], cols["step"], cols["episode_id"]
    is_label = labelled(t, step, skip_n)
    first = np.ones(len(t), bool)
    first[1:] = ep[1:] != ep[:-1]  # first row of each episode inside the shard
    source, carried = [], []
    label_row = np.empty(len(t), np.int32)
    for i in range(len(t)):
        if is_label[i] or first[i]:
            label_row[i] = len(source)
            if is_label[i]:
                source.append(i)
                carried.append((-1, -1))
            else:  # the latest labelled step of this episode lies before the shard
                at = max(t[i] - step[i], (t[i] // skip_n) * skip_n)
                source.append(-1)
                carried.append((int(ep[i]), int(step[i] - (t[i] - at))))
        else:
            label_row[i] = label_row[i - 1]
    return np.array(source, np.int64), label_row, np.array(carried, np.int64).reshape(-1, 2)


def find_rows(ds: Dataset, names: list[str], shard: int, wanted: np.ndarray,
              columns: list[str]) -> dict:
    """`columns` of the rows (episode_id, step) in `wanted` [k, 2], looked up in the shards
    before `shard` of its stream (the episodes that continue into it began there)."""
    stream = names[shard].split("-")[0]
    where: list = [None] * len(wanted)
    i = shard - 1
    while any(w is None for w in where):
        if i < 0 or names[i].split("-")[0] != stream:
            missing = [tuple(x) for x, w in zip(wanted.tolist(), where) if w is None]
            raise DatasetError(f"{ds.root}: rows (episode, step) {missing} that shard "
                               f"{names[shard]} continues are in no earlier shard; the dataset "
                               "is damaged")
        cols = ds.read(names[i], ["episode_id", "step"])
        for k, (e, s) in enumerate(wanted):
            hit = np.flatnonzero((cols["episode_id"] == e) & (cols["step"] == s))
            if where[k] is None and hit.size:
                where[k] = (names[i], int(hit[0]))
        i -= 1
    rows = [ds.read(name, columns, np.array([r])) for name, r in where]
    return {c: np.concatenate([r[c] for r in rows]) for c in columns}


def label(c: LabelConfig, console, num_devices: int = 1,
          resume_command: str = "the same command") -> Dataset:
    """The label set `c.name` of the dataset `c.data`: this process's shards (its `--part`),
    then, once every process is done, the manifest. Shards already committed and good are kept;
    Ctrl-C keeps every shard committed (`resume_command` finishes the set)."""
    ds = Dataset(c.data)
    card, manifest = ds.card(), ds.manifest()
    env = card["env"]
    if not spec(env).has_text and not kind_of(c.model).reads_frames:
        raise ConfigError(f"data={ds.root} holds {env!r} frames and no text observation to "
                          "label: text labels need a symbolic dataset (its text twin, "
                          f"{text_env(env) or 'none'}, from the same policy and seeds)")
    done = manifest["labels"].get(c.name)
    old = card.get("labels", {}).get(c.name)
    if c.name == "behaviour":
        raise ConfigError("name='behaviour' is the behaviour policy's own label set (written by "
                          "generate); pick another --name")
    if done and not old and not c.overwrite:
        raise ConfigError(f"label set {c.name!r} is in {ds.root}/manifest.json but card.json "
                          "does not say how it was made; pass --overwrite to redo it or --name "
                          "for another")
    encoder = make_encoder(c.model, env, seed=0)
    entry = encoder.card(c.dtype, to_dict(c.imagine))
    if old and not c.overwrite:
        if {k: v for k, v in with_defaults(old).items() if k in entry} != entry:
            raise ConfigError(f"label set {c.name!r} in {ds.root} was made with other settings; "
                              "pass --overwrite to replace it or --name for another")
    part = parse_part(c.part, jax.process_count())
    proc, nproc = part or (jax.process_index(), jax.process_count())
    if proc == 0 and c.overwrite:
        shutil.rmtree(ds.label_dir(c.name), ignore_errors=True)
        manifest["labels"].pop(c.name, None)
        ds.write_manifest(manifest)
    if (proc == 0 or part is not None) and (c.overwrite or not old):
        # (every part of a job array writes the same entry: whichever runs first)
        ds.write_card(dict(card, labels={**card.get("labels", {}), c.name: entry}))
    barrier("label.py label: set prepared")
    ds.label_dir(c.name).mkdir(parents=True, exist_ok=True)
    names = [s["name"] for s in manifest["shards"]]
    rows = {s["name"]: s["rows"] for s in manifest["shards"]}
    mine = [i for i in range(len(names)) if i % nproc == proc]
    encoder = BatchEncoder(encoder, c, num_devices)
    t0 = time.time()
    with JobProgress(console, sum(rows[names[i]] for i in mine), unit="rows",
                     description=f"labelling {c.name}", rate=True) as progress:
        job = LabelShards(ds, c, names, mine, bool(done), encoder, progress, resume_command)
        run_blocks(job, console)
    states, tokens, redone = job.states, job.tokens, job.redone
    if part_done(console, c.part, f"{len(mine)} shards", "label.py label: shards done"):
        return ds
    if proc == 0:
        entries = [committed(ds.label_dir(c.name, n), verify=False) for n in names]
        manifest = ds.manifest()
        manifest["labels"][c.name] = {"shards": entries}
        ds.write_manifest(manifest)
        if done and not c.overwrite:
            console.print(f"label set {c.name!r}: every shard verified; {redone} redone")
            return ds
        console.print(f"done: label set {c.name!r}: {len(names)} shards, {sum(rows.values()):,} "
                      f"rows; this process encoded {states:,} states ({tokens:,} tokens, with "
                      f"the padding rows of each shard's last batch) in "
                      f"{time.time() - t0:.0f}s -> {ds.label_dir(c.name)}")
    return ds


class LabelShards:
    """This process's shards of a label set, one block each (`fused.runs.blocks`): a shard whose
    states are committed and verify is kept, a stale or damaged one is redone."""

    def __init__(self, ds: Dataset, c: LabelConfig, names: list[str], mine: list[int],
                 done: bool, encoder: "BatchEncoder", progress: JobProgress,
                 resume_command: str):
        self.ds, self.c, self.names, self.todo, self.done = ds, c, names, list(mine), done
        self.encoder, self.progress, self.resume_command = encoder, progress, resume_command
        self.codec = ObsCodec(spec(ds.card()["env"]))
        self.rows = {s["name"]: s["rows"] for s in ds.manifest()["shards"]}
        self.lock = threading.Lock()
        self.states = self.tokens = self.redone = 0

    def pending(self) -> bool:
        return bool(self.todo)

    def run_block(self) -> None:
        ds, c, i = self.ds, self.c, self.todo[0]
        name = self.names[i]
        target = ds.label_dir(c.name, name)
        if self.done and not c.overwrite and ds.problem("labels", name, c.name):
            shutil.rmtree(target, ignore_errors=True)  # stale (damage `committed` finds)
        if committed(target, verify=True) is None:
            columns, tokens = label_columns(ds, self.names, i, c, self.codec, self.encoder)
            with self.lock:
                commit_group(target, columns)
            self.states += len(columns["hidden"])
            self.tokens += tokens
            self.redone += 1
        self.todo.pop(0)
        self.progress.advance(self.rows[name], info=f"{self.states:,} states encoded")

    def stopped(self) -> str:
        return (f"interrupted: the work committed so far is kept; resume with "
                f"`{self.resume_command}`")


def label_columns(ds: Dataset, names: list[str], i: int, c: LabelConfig, codec: ObsCodec,
                  encoder: "BatchEncoder") -> tuple[dict, int]:
    """Shard `i`'s label columns (its states, each row's state, imagined text with
    --imagine.keep-text) and the tokens encoded."""
    ocols = codec.columns
    cols = ds.read(names[i], ["t", "step", "episode_id"] + ocols)
    source, label_row, carried = label_sources(cols, c.model.skip_n)
    obs = codec.decode(np, {k: cols[k] for k in ocols})
    states = obs[np.maximum(source, 0)]
    earlier = source < 0
    if earlier.any():
        states[earlier] = codec.decode(np, find_rows(ds, names, i, carried[earlier], ocols))
    # each state's own draws (sampled imagination): its shard and its index there
    keys = np.asarray(jax.vmap(lambda k: jax.random.fold_in(
        jax.random.fold_in(jax.random.PRNGKey(c.imagine.seed), i), k))(
        jnp.arange(len(states))))
    hidden, tokens, imagined = encoder(states, keys)
    columns = {"hidden": hidden.astype(STORAGE[c.dtype]), "label_row": label_row}
    if c.imagine.tokens and c.imagine.keep_text:
        columns.update(text_columns(encoder.tokenizer, *imagined))
    return columns, tokens


def text_columns(tokenizer, generated: np.ndarray, num: np.ndarray) -> dict:
    """The imagined tokens and their text (UTF-8 bytes, zero-padded) as label columns."""
    texts = [tokenizer.decode(g[:n].tolist()).encode() for g, n in zip(generated, num)]
    width = max([len(t) for t in texts] + [1])
    raw = np.zeros((len(texts), width), np.uint8)
    for j, t in enumerate(texts):
        raw[j, :len(t)] = np.frombuffer(t, np.uint8)
    return {"imagined": generated.astype(np.int32), "imagined_len": num.astype(np.int32),
            "imagined_text": raw, "imagined_text_len": np.array([len(t) for t in texts],
                                                                np.int32)}


def imagined_texts(columns: dict) -> list[str]:
    """The texts of a label shard read with `Dataset.read_labels` (kept with --imagine.keep-text)."""
    return [bytes(r[:n]).decode() for r, n in zip(columns["imagined_text"],
                                                  columns["imagined_text_len"])]


class BatchEncoder:
    """Observations [M, D] (and a key per observation) -> hidden [M, H] float32, in jitted
    batches of `batch` rows split over this process's devices (the last batch padded with its
    first row); with imagination also the generated tokens [M, N] and their counts [M]."""

    def __init__(self, encoder: Encoder, c: LabelConfig, num_devices: int):
        self.encoder, self.batch, self.tokenizer = encoder, c.batch, encoder.tokenizer
        microbatch = encoder.batching(c.batch // num_devices).microbatch

        def encode(obs, keys, frozen):
            with jax.named_scope("llm"):
                e = encoder.encode(frozen, obs, microbatch, keys)
            n = obs.shape[0]
            gen = e.generated if e.generated is not None else jnp.zeros((n, 0), jnp.int32)
            num = e.num_generated if e.num_generated is not None else jnp.zeros(n, jnp.int32)
            return e.hidden, e.tokens, gen, num

        fn = encode
        if num_devices > 1:
            from jax.sharding import Mesh, PartitionSpec as P

            mesh = Mesh(np.array(jax.local_devices()[:num_devices]), ("rows",))
            fn = jax.shard_map(lambda o, k, f: _summed(encode(o, k, f), "rows"), mesh=mesh,
                               in_specs=(P("rows"), P("rows"), P()),
                               out_specs=(P("rows"), P(), P("rows"), P("rows")),
                               check_vma=False)
        self.fn = loop_jit(fn, c.cuda_graphs)  # (an imagination's decode loop inside)

    def __call__(self, obs: np.ndarray, keys: np.ndarray):
        out, gen, num, tokens = [], [], [], 0
        for chunk, k, n in batching.padded_batches(obs, keys, self.batch):
            h, tok, g, m = self.fn(jnp.asarray(chunk), jnp.asarray(k), self.encoder.frozen)
            out.append(np.asarray(h)[:n])
            gen.append(np.asarray(g)[:n])
            num.append(np.asarray(m)[:n])
            tokens += int(tok)
        if not out:
            return (np.zeros((0, self.encoder.hidden_size)), 0,
                    (np.zeros((0, 0), np.int32), np.zeros(0, np.int32)))
        return np.concatenate(out), tokens, (np.concatenate(gen), np.concatenate(num))


def with_defaults(card_entry: dict) -> dict:
    """A label set's card entry with its `llm` settings read as today's config reads them
    (fields added since it was written take their defaults), so it compares with a new one."""
    if "llm" not in card_entry:
        return card_entry
    try:
        llm = to_dict(from_dict(LLMConfig, card_entry["llm"], "the label set's card"))
    except ConfigError:
        return card_entry
    return dict(card_entry, llm=llm)


def _summed(out, axis):
    h, tokens, gen, num = out
    return h, jax.lax.psum(tokens, axis), gen, num
