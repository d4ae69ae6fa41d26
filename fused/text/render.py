"""On-device text -> token rendering of Craftax symbolic observations, and the prompt around it.

`make_renderer(env_name, tokenizer)` pre-tokenizes every fragment the text format can contain
(`fused.text.format`): the map header, each `r, c` coordinate (alone and with its leading `,`),
each tile word with its leading `:` or ` on`, each `, Label` and `:value` of the inventory line.
Fragments are cut where Qwen3's pre-tokenizer splits the full text anyway (its regex never joins
a letter run to a following digit, comma or space, digits are single tokens), so the concatenated
fragment tokens equal `tokenizer.encode(reference_text)`; `python -m fused.text.render check`
and the property tests verify this on real rollouts. `render_tokens(renderer, obs)` is pure jnp: per env
it picks a fragment id for each of a fixed number of slots, then packs the fragments' tokens
left-aligned into `[L_max]`.

L_max is a hard bound, not an estimate: the sum over slots of the longest fragment each slot can
take (every tile interesting, with the longest mob + item + block names, and the widest values),
so no reachable observation is ever cut.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fused.envspec import ObsLayout, TextEnvName, text_env, text_offset
from fused.rl.envs import rollout_observations
from fused.text.buckets import at_smallest_fit, pack_sizes
from fused.text.format import MAP_EMPTY, MAP_HEADER, get_layout, render_text


class Renderer(NamedTuple):
    """Fragment tables (numpy, become jit constants) and slot ids for one env's layout."""

    layout: ObsLayout
    frag_tokens: np.ndarray  # [sum of lengths] int32, every fragment's tokens end to end
    frag_offsets: np.ndarray  # [F] int32, where each fragment begins in frag_tokens
    frag_lengths: np.ndarray  # [F] int32, fragment 0 is empty
    ids: dict  # name -> fragment id (fixed fragments) or base id (families)
    max_tokens: int  # L_max
    pad_id: int
    offset: int = 0  # where the symbolic observation begins (after a pixel env's frame)


class _Tables:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.texts: list[str] = [""]

    def add(self, text: str) -> int:
        self.texts.append(text)
        return len(self.texts) - 1

    def family(self, texts) -> int:
        ids = [self.add(t) for t in texts]
        return ids[0]


def make_renderer(env_name: str, tokenizer) -> Renderer:
    """Build the fragment tables for `env_name` with the (host) Qwen3 tokenizer; a pixel env's
    renderer reads its text twin's observation after the frame (`fused.envspec.text_offset`)."""
    layout = get_layout(text_env(env_name) or env_name)
    t = _Tables(tokenizer)
    ids = {
        "header": t.add(MAP_HEADER),
        # "]" and the blank line after it form one pre-token ("]\n\n"): one fragment
        "empty_map": t.add(MAP_EMPTY + "\n\n"),
        "blank": t.add("\n\n"),
        "inventory": t.add("Inventory:"),
        "darkness": t.add(":darkness"),
    }
    coords = [f" {r - layout.rows // 2}, {c - layout.cols // 2}"
              for r in range(layout.rows) for c in range(layout.cols)]
    ids["coord"] = t.family(coords)  # the first tile shown
    ids["comma_coord"] = t.family("," + x for x in coords)  # every later one: one slot, not two
    ids["block_head"] = t.family(":" + b for b in layout.blocks)
    ids["block_on"] = t.family(" on " + b for b in layout.blocks)
    if layout.items:
        ids["item_head"] = t.family(":" + i for i in layout.items)
        ids["item_on"] = t.family(" on " + i for i in layout.items)
    ids["mob_head"] = t.family(":" + (m or "unknown_mob") for m in layout.mobs)
    ids["labels"] = t.family((" " if i == 0 else ", ") + f.label for i, f in enumerate(layout.aux))
    kinds = {f.kind.name: f.kind for f in layout.aux}
    for name, kind in kinds.items():
        ids[f"value/{name}"] = t.family(":" + kind.text(v) for v in range(kind.count))

    encoded = [tokenizer.encode(s) for s in t.texts]
    tokens = np.array([x for e in encoded for x in e], np.int32)
    lengths = np.array([len(e) for e in encoded], np.int32)
    offsets = (np.cumsum(lengths) - lengths).astype(np.int32)

    def longest(base, n):
        return int(lengths[base:base + n].max())

    cell = (longest(ids["comma_coord"], layout.rows * layout.cols)
            + max(longest(ids["mob_head"], len(layout.mobs)),
                  longest(ids["block_head"], len(layout.blocks)),
                  lengths[ids["darkness"]])
            + (longest(ids["item_on"], len(layout.items)) if layout.items else 0)
            + longest(ids["block_on"], len(layout.blocks)))
    aux = sum(lengths[ids["labels"] + i] + longest(ids[f"value/{f.kind.name}"], f.kind.count)
              for i, f in enumerate(layout.aux))
    max_tokens = int(max(lengths[ids["header"]] + layout.rows * layout.cols * cell,
                         lengths[ids["empty_map"]])
                     + lengths[ids["blank"]] + lengths[ids["inventory"]] + aux)
    return Renderer(layout, tokens, offsets, lengths, ids, max_tokens, tokenizer.pad_id,
                    text_offset(env_name))


def _value_ids(r: Renderer, aux: jax.Array) -> jax.Array:
    """Fragment id of each `:value` of the inventory line. aux: [A] -> [len(layout.aux)]."""
    return jnp.stack([r.ids[f"value/{f.kind.name}"]
                      + jnp.clip(f.decode(jnp, aux).astype(jnp.int32), 0, f.kind.count - 1)
                      for f in r.layout.aux])


def fragment_ids(r: Renderer, obs: jax.Array) -> jax.Array:
    """Fragment id per slot for one observation [D] -> [S] (0 = empty slot)."""
    lay = r.layout
    nb, ni, nm = len(lay.blocks), len(lay.items), len(lay.mobs)
    grid = obs[:lay.map_size].reshape(lay.rows * lay.cols, lay.channels)
    lit = grid[:, -1] > 0.5 if lay.has_light else jnp.ones(grid.shape[0], bool)
    block = jnp.argmax(grid[:, :nb], axis=-1)
    item = jnp.argmax(grid[:, nb:nb + ni], axis=-1) if ni else jnp.zeros_like(block)
    mobs = grid[:, nb + ni:nb + ni + nm]
    has_mob = mobs.max(axis=-1) > 0.5
    mob = jnp.argmax(mobs, axis=-1)
    has_item = item > 0
    background = jnp.isin(block, jnp.array([lay.blocks.index(b) for b in lay.background]))
    shown = ~lit | has_mob | has_item | ~background
    any_shown = shown.any()

    head = jnp.where(has_mob, r.ids["mob_head"] + mob,
                     jnp.where(has_item, r.ids.get("item_head", 0) + item, r.ids["block_head"] + block))
    head = jnp.where(lit, head, r.ids["darkness"])
    item_on = r.ids.get("item_on", 0) + item
    block_on = r.ids["block_on"] + block
    # ":mob on item on block", ":mob on block", ":item on block" or ":block"
    on1 = jnp.where(has_mob & has_item, item_on, jnp.where(has_mob | has_item, block_on, 0))
    on2 = jnp.where(has_mob & has_item, block_on, 0)
    on1, on2 = jnp.where(lit, on1, 0), jnp.where(lit, on2, 0)
    earlier = _prefix(jnp.add, shown.astype(jnp.int32)) - shown
    coord_base = jnp.where(earlier > 0, r.ids["comma_coord"], r.ids["coord"])
    coord = coord_base + jnp.arange(grid.shape[0])
    # Slots per tile: [", r, c", head, " on ..."(, " on block" when the env has items)]; fewer
    # slots means less packing work (the pack is most of the renderer's time on CPU).
    cells = jnp.stack([coord, head, on1, on2] if ni else [coord, head, on1], axis=-1)
    cells = jnp.where(shown[:, None], cells, 0).reshape(-1)

    values = _value_ids(r, obs[lay.map_size:])
    labels = r.ids["labels"] + jnp.arange(len(lay.aux))
    inventory = jnp.stack([labels, values], axis=-1).reshape(-1)
    first = jnp.where(any_shown, r.ids["header"], r.ids["empty_map"])[None]
    blank = jnp.where(any_shown, r.ids["blank"], 0)[None]
    fixed = jnp.array([r.ids["inventory"]])
    return jnp.concatenate([first, cells, blank, fixed, inventory]).astype(jnp.int32)


def _prefix(op, x):
    """Inclusive prefix reduction as an associative scan (faster than lax.cummax for the packing
    below on XLA:CPU)."""
    return jax.lax.associative_scan(op, x)


def pack_fragments(r: Renderer, ids, size: int | None = None):
    """Concatenate the tokens of fragments `ids` [S] left-aligned into [size] (default L_max; a
    smaller size only when the fragments fit in it); returns (tokens [size], length []).

    Gather-based: each non-empty slot marks its start position, a running max turns the marks
    into "slot covering position p", and every output token is one lookup in the flat fragment
    table. This touches S + 3 L elements instead of scattering S x (widest fragment)."""
    max_tokens = size or r.max_tokens
    lengths = jnp.asarray(r.frag_lengths)[ids]  # [S]
    start = _prefix(jnp.add, lengths) - lengths
    slot = jnp.arange(ids.shape[0])
    marks = jnp.full((max_tokens,), -1, jnp.int32).at[
        jnp.where(lengths > 0, start, max_tokens)].max(slot, mode="drop")
    at = _prefix(jnp.maximum, marks)  # slot whose fragment covers each position
    pos = jnp.arange(max_tokens)
    safe = jnp.maximum(at, 0)
    tok = jnp.asarray(r.frag_tokens)[jnp.asarray(r.frag_offsets)[ids[safe]] + pos - start[safe]]
    total = lengths.sum()
    return jnp.where(pos < total, tok, r.pad_id).astype(jnp.int32), total


def render_tokens(r: Renderer, obs: jax.Array):
    """obs: [B, D] symbolic observations -> (tokens [B, L_max] int32 right-padded, lengths [B]).
    Pure jnp, no host call: tokens equal `tokenizer.encode(render_text(layout, obs[b]))`.

    The packing costs per output position, and L_max is a worst case far above real
    observations (Classic: L_max 1,013, random-rollout states 233 tokens on average), so the
    batch is packed at the smallest of `fused.text.buckets.pack_sizes` that its longest observation fits
    (`lax.switch`, exact for every state) and the rest is filled with padding."""
    ids = jax.vmap(lambda o: fragment_ids(r, o))(obs[:, r.offset:])
    longest = jnp.asarray(r.frag_lengths)[ids].sum(-1).max()
    sizes = pack_sizes(r.max_tokens)

    def packed(size):
        def run(ids):
            tokens, lengths = jax.vmap(lambda i: pack_fragments(r, i, size))(ids)
            return jnp.pad(tokens, ((0, 0), (0, r.max_tokens - size)),
                           constant_values=r.pad_id), lengths
        return run

    return at_smallest_fit(sizes, longest, packed, ids)


# --- check CLI ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Check:
    """Compare device tokens with tokenizer.encode(reference text) on random-policy states."""

    env: TextEnvName = "Craftax-Symbolic-v1"
    """Environment whose symbolic observations are rendered."""
    states: int = 1000
    """Number of states to compare."""
    seed: int = 0
    """PRNG seed of the rollouts."""
    num_envs: int = 16
    """Parallel envs in the rollout (states are taken from every step of every env)."""
    weights: str | None = None
    """Model folder whose tokenizer to use; default the packaged Qwen3 tokenizer."""


def check(a: Check) -> int:
    from llm_jax.tokenizer import load_tokenizer  # (the check's own: fused.text is below it)

    tok = load_tokenizer(a.weights)
    r = make_renderer(a.env, tok)
    obs = rollout_observations(a.env, a.states, a.seed, a.num_envs)
    tokens, lengths = jax.jit(lambda o: render_tokens(r, o))(obs)
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    longest = 0
    for i in range(len(obs)):
        text = render_text(r.layout, obs[i])
        want = tok.encode(text)
        got = tokens[i, :lengths[i]].tolist()
        longest = max(longest, len(want))
        if got != want:
            print(f"MISMATCH at state {i} ({a.env}, seed {a.seed})\nreference text:\n{text}\n"
                  f"device tokens decode to:\n{tok.decode(got)}", file=sys.stderr)
            return 1
    print(f"ok: {len(obs)} states of {a.env} (seed {a.seed}) render to identical tokens; "
          f"longest {longest} tokens, L_max {r.max_tokens}")
    return 0


if __name__ == "__main__":
    import tyro

    sys.exit(check(tyro.extras.subcommand_cli_from_dict({"check": Check})))
