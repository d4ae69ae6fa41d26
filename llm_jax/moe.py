"""Qwen3 mixture-of-experts MLP, as HF's `Qwen3MoeSparseMoeBlock` computes it: router logits in
the hidden dtype, softmax in float32, top-k, optional renormalisation (`norm_topk_prob`), the
weights cast back to the hidden dtype; each token's output is the weighted sum of its k experts'
SwiGLU outputs. No shared expert, no capacity: every (token, expert) assignment is computed,
none is dropped (so the load statistics are routing decisions, not losses).

The experts run as a grouped matmul over the assignments sorted by expert (`sort_by_expert`;
the gathered form keeps them in token order) in one of five forms (static, `MoEForm`), all
computing the same function:
- "ragged": `jax.lax.ragged_dot` (XLA's grouped GEMM). On CPU XLA lowers it to a dense product
  masked per group (num_experts times the FLOPs); on GPUs it was measured slower than "tiled"
  and ran out of memory where "tiled" did not (docs/BENCHMARKS.md). "auto" picks it on TPU
  only;
- "tiled" (CPU and GPU): the sorted rows in tiles of `tile_rows` rows that each belong to one expert
  (each expert's rows padded to whole tiles); a `fori_loop` over the tiles in use runs one
  expert's SwiGLU per tile. Padding is at most one tile per expert, and tiles past the last
  used one are not run;
- "gathered": each assignment's own expert weights gathered ([R, H, 2F], [R, F, H]) and one
  batched matmul each: R experts' weights read, for calls with few assignments (a decode step:
  R = B x K), where the tiled form's R / tile + E tiles would read every expert's weights, the
  unused ones as padding (Qwen3-30B-A3B at batch 1: 129 tiles a layer against 8
  assignments). "auto" picks it over "tiled" wherever it reads fewer experts' weights
  (R < R / tile + E);
- "pallas": each expert's rows padded to whole tiles in memory and both matmuls as one Pallas
  kernel launch each (`kernels.grouped_matmul`: a program per tile reads its expert's weights
  in place; tiles not in use return at once), where the tiled form's loop launches several
  kernels a tile and copies the expert's weights out for each (kernel counts:
  docs/BENCHMARKS.md). Triton on GPUs, Pallas' interpreter on CPU (for tests). Asked for only:
  "auto" does not pick it until it is timed on a GPU;
- "dense": every expert on every token, weighted by the (mostly zero) routing weights: the
  plain-jnp reference the other forms are tested against, never used for speed.

Letters: n tokens, h hidden, e experts, k experts per token, f expert width, r assignments
(token, choice) in expert order.
"""

from __future__ import annotations

import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from llm_jax.config import Qwen3Config
from llm_jax.weights import MoE

MoEForm = Literal["auto", "ragged", "tiled", "gathered", "pallas", "dense"]


class Routing(NamedTuple):
    """The router's choice for each token."""

    weights: jax.Array  # [N, K] in the hidden dtype (renormalised if norm_topk_prob)
    experts: jax.Array  # [N, K] int32, by descending probability


class Sorted(NamedTuple):
    """Assignments (token, choice) sorted by expert, stable (token order within an expert)."""

    order: jax.Array  # [R] index into the flattened [N * K] assignments
    token: jax.Array  # [R] the token of each sorted assignment
    sizes: jax.Array  # [E] int32 assignments per expert (the groups of the grouped matmul)


def resolve_moe_form(form: MoEForm, assignments: int | None = None, num_experts: int | None = None
                     ) -> Literal["ragged", "tiled", "gathered", "pallas", "dense"]:
    """`form` itself unless "auto": `ragged_dot` on TPU, elsewhere tiled, or gathered where a
    call's `assignments` (tokens x K) are fewer than the tiles the tiled form would run over
    `num_experts` (each tile reads one expert's weights). XLA:CPU lowers `ragged_dot` densely,
    and on GPUs it was measured slower than the tiled form (docs/BENCHMARKS.md)."""
    if form != "auto":
        return form
    if jax.default_backend() == "tpu":
        return "ragged"
    if assignments is not None and num_experts is not None and (
            assignments < gathered_below(assignments, num_experts)):
        return "gathered"
    return "tiled"


def gathered_below(assignments: int, num_experts: int) -> int:
    """The tiles the tiled form runs for `assignments` over `num_experts` (its loop's static
    trip count): the gathered form reads fewer experts' weights when assignments are fewer."""
    return -(-assignments // tile_rows(assignments, num_experts)) + num_experts


def route(cfg: Qwen3Config, router, h) -> Routing:
    """router: [H, E]; h: [N, H] (post-norm). Softmax in float32, then top-k, then (if
    norm_topk_prob) renormalise the k probabilities, then cast to h's dtype, as HF does."""
    logits = jnp.einsum("nh,he->ne", h, router)  # in h's dtype, as HF's F.linear
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    top, experts = jax.lax.top_k(probs, cfg.num_experts_per_tok)
    if cfg.norm_topk_prob:
        top = top / top.sum(-1, keepdims=True)
    return Routing(top.astype(h.dtype), experts.astype(jnp.int32))


def sort_by_expert(routing: Routing, num_experts: int) -> Sorted:
    flat = routing.experts.reshape(-1)  # [N * K]
    order = jnp.argsort(flat, stable=True)
    k = routing.experts.shape[1]
    sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    return Sorted(order, order // k, sizes)


def expert_load(routing: Routing, num_experts: int, valid=None) -> jax.Array:
    """[E] int32: assignments to each expert among the tokens where valid [N] (default all);
    a token counts once for each of its k experts, so the sum is k x valid tokens."""
    k = routing.experts.shape[1]
    w = None if valid is None else jnp.repeat(valid.astype(jnp.int32), k)
    return jnp.bincount(routing.experts.reshape(-1), weights=w,
                        length=num_experts).astype(jnp.int32)


def _swiglu(x):
    """[..., 2F] gate then up -> [..., F]."""
    gate, up = jnp.split(x, 2, axis=-1)
    return jax.nn.silu(gate) * up


def grouped_ragged(xs, sizes, gate_up, down):
    """xs: [R, H] sorted by expert, sizes: [E]; gate_up: [E, H, 2F], down: [E, F, H] ->
    [R, H], each row through its expert's SwiGLU (`jax.lax.ragged_dot`)."""
    act = _swiglu(jax.lax.ragged_dot(xs, gate_up, sizes))
    return jax.lax.ragged_dot(act, down, sizes)


def grouped_gathered(xs, experts, gate_up, down):
    """xs: [R, H] one row per assignment (any order), experts: [R] its expert; gate_up:
    [E, H, 2F], down: [E, F, H] -> [R, H], each row through its expert's SwiGLU, with that
    expert's weights gathered for it (R experts' weights read, one batched matmul each)."""
    act = _swiglu(jnp.einsum("rh,rhf->rf", xs, gate_up[experts]))
    return jnp.einsum("rf,rfh->rh", act, down[experts])


def grouped_pallas(xs, sizes, gate_up, down, tile: int | None = None):
    """As `grouped_ragged`, through `kernels.grouped_matmul`: sorted row j of expert e moves to
    e's tiles (each expert's rows padded to whole tiles of `tile` rows, a power of two >= 16),
    both matmuls run over the R / tile + E tiles in one launch each (unused tiles skipped), and
    the rows come back in sorted order."""
    from kernels.grouped_matmul import grouped_matmul

    r, h = xs.shape
    tile = tile or min(128, max(16, tile_rows(r, sizes.shape[0])))  # ([tile, 128] f32 sums)
    per, end, t, owner = _tiles(sizes, r, tile)
    group = jnp.where(t < end[-1], owner, -1)  # tiles past the last in use: skipped
    cum = jnp.cumsum(sizes)
    j = jnp.arange(r)
    expert = jnp.searchsorted(cum, j, side="right")  # [R] the expert of each sorted row
    pos = (end - per)[expert] * tile + j - (cum - sizes)[expert]  # its row among the tiles
    xp = jnp.zeros((t.shape[0] * tile, h), xs.dtype).at[pos].set(xs)
    run = functools.partial(grouped_matmul, tile=tile, interpret=jax.default_backend() == "cpu")
    return run(_swiglu(run(xp, gate_up, group)), down, group)[pos]


def _tiles(sizes, assignments: int, tile: int):
    """Each expert's rows in whole tiles of `tile` rows, tiles in expert order: (per [E] tiles
    of each expert, end [E] their cumulative count, t [R / tile + E] every tile any routing
    may need, owner [...] each tile's expert, the last expert for tiles past the last used)."""
    e = sizes.shape[0]
    per = (sizes + tile - 1) // tile
    end = jnp.cumsum(per)
    t = jnp.arange(-(-assignments // tile) + e)
    return per, end, t, jnp.minimum(jnp.searchsorted(end, t, side="right"), e - 1)


def tile_rows(assignments: int, num_experts: int) -> int:
    """Rows per tile of the tiled form: about half the mean group, a power of two in 8..256
    (smaller tiles run more loop steps, larger ones more padding)."""
    t = 8
    while t < 256 and 4 * t <= assignments // num_experts:
        t *= 2
    return t


def grouped_tiled(xs, sizes, gate_up, down, tile: int | None = None):
    """As `grouped_ragged`, by tiles: each expert's rows are padded to whole tiles of `tile`
    rows and a `fori_loop` runs tile by tile (in row order). A tile computes `tile` rows from
    its expert's first row on; rows past the expert's end are garbage written onto the next
    expert's rows, which that expert's own tiles (later in the loop) overwrite, so no mask is
    needed. The loop's trip count is static, the most tiles any routing needs (R / tile + E):
    tiles past the last one in use compute on the zero rows past the end and write there
    (dropped). A loop with a traced trip count makes a GPU's host read its condition back every
    tile; a known one runs without."""
    r, h = xs.shape
    tile = tile or tile_rows(r, sizes.shape[0])
    per, end, t, owner = _tiles(sizes, r, tile)
    first = (jnp.cumsum(sizes) - sizes)[owner] + (t - (end - per)[owner]) * tile  # first row
    xp = jnp.concatenate([xs, jnp.zeros((tile, h), xs.dtype)])  # room for the last tile

    first = jnp.where(t < end[-1], first, r)  # unused tiles: the zero rows past the end

    def one_tile(i, y):
        row, ex = first[i], owner[i]
        x = jax.lax.dynamic_slice(xp, (row, 0), (tile, h))
        act = _swiglu(x @ gate_up[ex])
        return jax.lax.dynamic_update_slice(y, act @ down[ex], (row, 0))

    return jax.lax.fori_loop(0, t.shape[0], one_tile, jnp.zeros_like(xp))[:r]


def dense_reference(cfg: Qwen3Config, mp: MoE, h, routing: Routing):
    """The test oracle: every expert on every token ([E, N, H] in float32), summed with the
    routing weights scattered to [N, E] (zeros where an expert was not chosen); the router of
    `mp` is not read (`routing` is given)."""
    f32 = jnp.float32
    n = h.shape[0]
    comb = jnp.zeros((n, cfg.num_experts), f32).at[jnp.arange(n)[:, None], routing.experts].set(
        routing.weights.astype(f32))
    gu = jnp.einsum("nh,ehc->enc", h.astype(f32), mp.gate_up.astype(f32))
    y = jnp.einsum("enf,efh->enh", _swiglu(gu), mp.down.astype(f32))
    return jnp.einsum("enh,ne->nh", y, comb).astype(h.dtype)


def moe_mlp(cfg: Qwen3Config, mp: MoE, h, valid=None, form: MoEForm = "auto"):
    """The sparse MLP of one block. mp: one layer's `MoE` (router [H, E], gate_up [E, H, 2F],
    down [E, F, H]); h: [B, T, H] (after the MLP norm); valid: [B, T] bool, the positions counted
    in the load (default all). Returns ([B, T, H], load [E] int32 from `expert_load`)."""
    b, t, hd = h.shape
    x = h.reshape(b * t, hd)
    routing = route(cfg, mp.router, x)
    load = expert_load(routing, cfg.num_experts, None if valid is None else valid.reshape(-1))
    form = resolve_moe_form(form, b * t * cfg.num_experts_per_tok, cfg.num_experts)
    if form == "dense":
        return dense_reference(cfg, mp, x, routing).reshape(b, t, hd), load
    if form == "gathered":  # assignments in (token, choice) order: no sort
        ys = grouped_gathered(jnp.repeat(x, routing.experts.shape[1], 0),
                              routing.experts.reshape(-1), mp.gate_up, mp.down)
    else:
        s = sort_by_expert(routing, cfg.num_experts)
        grouped = {"ragged": grouped_ragged, "tiled": grouped_tiled,
                   "pallas": grouped_pallas}[form]
        ys = grouped(x[s.token], s.sizes, mp.gate_up, mp.down)  # [R, H], expert order
        ys = jnp.zeros_like(ys).at[s.order].set(ys)  # back in (token, choice) order
    ys = ys * routing.weights.reshape(-1)[:, None]  # in h's dtype, as HF
    y = ys.reshape(b * t, -1, hd)  # [N, K, H]
    return y.astype(jnp.float32).sum(1).astype(h.dtype).reshape(b, t, hd), load
