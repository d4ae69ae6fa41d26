"""Text generation for Qwen3: a batch of ragged prompts after an optional shared prefix is
prefilled in one pass, then decoded token by token under `lax.while_loop`, all in one pure
function (`generate`) that the caller jits: the weights and arrays are its arguments, what it
does (sampling, stops, lengths, states asked for, attention form) one static `GenerateSpec`.

Positions. The shared prefix (a `PrefixCache`, `[L, P, K, D]`, computed once by
`model.prefill`) holds positions 0..P-1 and is read by every row, never copied per row. Row b's
own tokens are its prompt (`lengths[b]` tokens, right-padded to T) and then its generated tokens:
own token j sits at position P + j, so the i-th generated token at P + lengths[b] + i, exactly
as if HF transformers ran prefix + prompt + generated tokens as one sequence.

KV cache (`KVCache`). One buffer per layer, k and v `[B, S, K, D]` with S = T + max_new_tokens:
slot j of row b holds the key/value of the row's own token j (after k-norm and RoPE);
`lengths[b]` slots are filled. The prompt fills slots 0..lengths[b]-1 (its padding slots are
overwritten by the first generated tokens and never attended to: a query sees only filled
slots). The prefix is not in it.

The decode loop. Layers run unrolled, each on its own weight arrays (`llm_jax.weights
.layer_blocks`: the per-layer layout's `Layer`s, or static slices of the stacks taken once,
before the loop) and its own cache buffers, written in place at each row's slot: nothing inside
the `while_loop` slices a stack of layers or copies a cache (the scan over stacked layers did
both every step; `tests/test_decode.py` reads the compiled loop). `steps_per_check` decode steps
run per check of the loop's condition (stopped rows change nothing; fewer condition reads, which
a GPU makes the host wait for).

Hidden states of generated tokens (`hidden_layer`): HF's convention (0 = embeddings, i = the
residual after block i, pre-final-norm; `post_norm` applies the final RMSNorm, which at the last
layer is HF's `hidden_states[-1]`), at each generated token's OWN position: `hidden[b, i]` is
the state HF's forward over prefix + prompt + generated tokens gives at position
P + lengths[b] + i, where generated token i is the input. So the state of token i is computed
when token i is fed to the model (the step that predicts token i + 1); with `hidden_layer` set,
each row's last token is fed once more for its state (its logits are unused). A stop token is a
generated token: it is in `tokens` and has a state.

Attention: the prompt part uses the static `AttentionConfig` form (`model.attention`); a decode
step (one query per row) uses the plain jnp `decode_attention` below, a joint softmax over the
shared prefix, the row's filled cache slots and its own new key.

Letters in einsums: b batch, s cache slots, p prefix positions, h hidden, n query heads, k kv
heads, g query heads per kv head, d head dim, l layers.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
from einops import rearrange

from llm_jax.config import Qwen3Config
from llm_jax.model import (AttentionConfig, PrefixCache, Visual, hidden_states, lm_logits,
                           mlp_block, project_qkv, rms_norm, rope_tables, scan_layers)
from llm_jax.sampling import GREEDY, GenerateError, Sampling, sample_tokens
from llm_jax.weights import Layer, Weights, layer_blocks


class KVCache(NamedTuple):
    """Keys/values of every row's own tokens (prompt, then generated), after the shared prefix,
    one buffer per layer."""

    k: tuple[jax.Array, ...]  # L x [B, S, K, D]: slot j = the row's own token j, at P + j
    v: tuple[jax.Array, ...]  # L x [B, S, K, D]
    lengths: jax.Array  # [B] filled slots per row


class Generated(NamedTuple):
    """What `generate` returns."""

    tokens: jax.Array  # [B, N] int32: generated tokens (a stop token included); pad_id past
    #                    num_tokens
    num_tokens: jax.Array  # [B] int32: tokens generated per row (1..N)
    hidden: jax.Array | None  # [B, N, H] states of the generated tokens (0 past num_tokens)


@dataclasses.dataclass(frozen=True)
class GenerateSpec:
    """What `generate` does: static (part of the compiled program; hashable, so a jitted
    caller may close over it or pass it as a static argument). Bad values are a GenerateError
    when it is made."""

    max_new_tokens: int
    """Tokens generated per row at most (>= 1)."""
    pad_id: int
    """The tokenizer's padding token: fills `Generated.tokens` past each row's end."""
    sampling: Sampling = GREEDY
    """How each token is drawn (greedy by default)."""
    stop_ids: tuple[int, ...] = ()
    """A row stops after generating one of these (it is kept), or after max_new_tokens."""
    hidden_layer: int | None = None
    """Also return each generated token's state at this layer (module docstring: which
    positions); None: no states."""
    post_norm: bool = False
    """The states after the final RMSNorm (at the last layer: HF's hidden_states[-1])."""
    attn: AttentionConfig = AttentionConfig()
    """How the prompt pass computes attention, and a MoE's experts in every pass."""
    steps_per_check: int = 1
    """Decode steps per check of the loop's condition (module docstring)."""

    def __post_init__(self):
        object.__setattr__(self, "stop_ids", tuple(int(i) for i in self.stop_ids))
        if self.max_new_tokens < 1:
            raise GenerateError(f"max_new_tokens={self.max_new_tokens}; generate at least 1 "
                                "token")
        if self.steps_per_check < 1:
            raise GenerateError(f"steps_per_check={self.steps_per_check}; use 1 or more")


class DecodeState(NamedTuple):
    """The `lax.while_loop` carry. A row's token i is sampled when `num` becomes i + 1 and fed
    (its key/value cached, its state recorded) when `fed` becomes i + 1."""

    cache: KVCache
    tokens: jax.Array  # [B, N] int32
    num: jax.Array  # [B] tokens generated
    fed: jax.Array  # [B] generated tokens fed through the model
    stopped: jax.Array  # [B] bool: no more tokens will be sampled (stop token or N reached)
    hidden: jax.Array | None  # [B, N, H]


def pool_generated(hidden, num, every: int | None):
    """hidden [B, N, H] states of generated tokens (num [B] of them, `Generated.hidden` and
    `num_tokens`) -> [B, H] float32: the last one's (`every` None), else the mean of tokens
    0, every, 2 * every, ... (1: all of them)."""
    h = hidden.astype(jnp.float32)
    if every is None:
        return h[jnp.arange(h.shape[0]), num - 1]
    pos = jnp.arange(h.shape[1])[None]
    take = ((pos < num[:, None]) & (pos % every == 0)).astype(jnp.float32)
    return jnp.einsum("bnh,bn->bh", h, take) / take.sum(1, keepdims=True)


def check_generate(cfg: Qwen3Config, prompt_lengths: Sequence[int], max_new_tokens: int,
                   prefix_len: int = 0, hidden_layer: int | None = None) -> None:
    """Host-side checks before anything compiles; GenerateError (one line) when a prompt is
    empty, max_new_tokens < 1, the hidden layer does not exist, or prefix + prompt + new
    tokens would pass the model's context (`max_position_embeddings`)."""
    if max_new_tokens < 1:
        raise GenerateError(f"max_new_tokens={max_new_tokens}; generate at least 1 token")
    if len(prompt_lengths) == 0:
        raise GenerateError("no prompts given; pass at least one")
    if min(prompt_lengths) < 1:
        raise GenerateError(f"prompt {list(prompt_lengths).index(min(prompt_lengths))} is empty "
                            "(0 tokens); every row needs at least one token of its own")
    if hidden_layer is not None and not 0 <= hidden_layer <= cfg.num_layers:
        raise GenerateError(f"hidden_layer={hidden_layer} must lie in 0..{cfg.num_layers}")
    total = prefix_len + max(prompt_lengths) + max_new_tokens
    if total > cfg.max_position_embeddings:
        raise GenerateError(
            f"prefix {prefix_len} + longest prompt {max(prompt_lengths)} + max_new_tokens "
            f"{max_new_tokens} = {total} tokens exceeds the model's context "
            f"(max_position_embeddings={cfg.max_position_embeddings}); shorten the prompt or "
            "lower max_new_tokens")


def decode_attention(q, k, v, cache_k, cache_v, visible, prefix_k=None, prefix_v=None):
    """One query per row. q: [B, N, D]; k, v: [B, K, D] (the new token's own); cache_k/v:
    [B, S, K, D] with visible: [B, S] bool (filled slots); prefix_k/v: [P, K, D] shared by all
    rows. Scores and softmax in float32, one softmax over prefix, cache and the new key.
    Returns [B, N, D]."""
    f32 = jnp.float32
    kh = k.shape[1]
    qg = rearrange(q, "b (k g) d -> b k g d", k=kh) * q.shape[-1] ** -0.5
    s_own = jnp.einsum("bkgd,bskd->bkgs", qg, cache_k, preferred_element_type=f32)
    s_own = jnp.where(visible[:, None, None], s_own, -jnp.inf)
    s_new = jnp.einsum("bkgd,bkd->bkg", qg, k, preferred_element_type=f32)[..., None]
    parts = [s_own, s_new]
    if prefix_k is not None:
        parts.append(jnp.einsum("bkgd,pkd->bkgp", qg, prefix_k, preferred_element_type=f32))
    m = jnp.max(jnp.concatenate([x.max(-1, keepdims=True) for x in parts], -1), -1,
                keepdims=True)
    e = [jnp.exp(x - m) for x in parts]
    total = sum(x.sum(-1, keepdims=True) for x in e)
    out = (jnp.einsum("bkgs,bskd->bkgd", e[0].astype(v.dtype), cache_v, preferred_element_type=f32)
           + e[1] * v[:, :, None].astype(f32))
    if prefix_k is not None:
        out = out + jnp.einsum("bkgp,pkd->bkgd", e[2].astype(v.dtype), prefix_v,
                               preferred_element_type=f32)
    return rearrange(out / total, "b k g d -> b (k g) d").astype(q.dtype)


def _layer_step(cfg: Qwen3Config, rot, visible, moe_form, x, lp: Layer, xs):
    """One block for one token per row (the `scan_layers` step). x: [B, 1, H]; lp: the
    block's weights, its MLP (dense or experts) among them, for `mlp_block`; xs: its cache
    and prefix buffers."""
    ck, cv, pk, pv = xs
    q, k, v = project_qkv(cfg, lp, x, rot)  # [B, 1, N, D], [B, 1, K, D]
    a = decode_attention(q[:, 0], k[:, 0], v[:, 0], ck, cv, visible, pk, pv)  # [B, N, D]
    x = x + jnp.einsum("bnd,ndh->bh", a, lp.attn.o)[:, None]
    x, _ = mlp_block(cfg, lp, x, form=moe_form)
    return x, (x[:, 0], k[:, 0], v[:, 0])


def forward_one(blocks: Weights, cfg: Qwen3Config, tokens, cache: KVCache, prefix,
                attn: AttentionConfig = AttentionConfig(), offset=0):
    """Feed one token per row, at each row's slot `cache.lengths` (position P + lengths, plus
    `offset` [B]: a vision-language prompt's M-RoPE delta, `llm_jax.mrope.rope_index`).
    blocks: the per-layer layout (`per_layer`); prefix: (k, v) per layer, or None.
    tokens: [B]. Returns (states [L + 1, B, H]: embeddings, then the residual after each block,
    pre-norm; new keys, values [L, B, K, D]). The cache is read, not written."""
    x = blocks.embed[tokens][:, None]  # [B, 1, H]
    p = 0 if prefix is None else prefix[0][0].shape[0]
    rot = rope_tables((p + cache.lengths + offset)[:, None], cfg.head_dim, cfg.rope_theta,
                      x.dtype)
    visible = jnp.arange(cache.k[0].shape[1])[None] < cache.lengths[:, None]  # [B, S]
    n = cfg.num_layers
    pk, pv = ((None,) * n, (None,) * n) if prefix is None else prefix
    step = functools.partial(_layer_step, cfg, rot, visible, attn.moe_form)
    _, (xs, k, v) = scan_layers(cfg, blocks, n, step, x,
                                [(cache.k[i], cache.v[i], pk[i], pv[i]) for i in range(n)])
    return jnp.concatenate([x[None, :, 0], xs]), k, v


def _state_at(params: Weights, cfg: Qwen3Config, states, layer: int, post_norm: bool):
    h = states[layer]  # [B, H]
    return rms_norm(h, params.final_norm, cfg.rms_norm_eps) if post_norm else h


def _token_keys(row_keys, index):
    """The key of each row's token `index` [B]: fold_in(fold_in(key, row), index)."""
    return jax.vmap(jax.random.fold_in)(row_keys, index)


def _stops(tokens, num, stop_ids: tuple[int, ...], max_new_tokens: int):
    hit = jnp.isin(tokens, jnp.asarray(stop_ids, jnp.int32)) if stop_ids else False
    return hit | (num >= max_new_tokens)


def _decode_step(blocks: Weights, cfg: Qwen3Config, prefix, row_keys, offset,
                 spec: GenerateSpec, state: DecodeState):
    """Feed each active row's next unfed token, record its state, and (rows not stopped) sample
    the following token. Rows with nothing to feed compute too (batched) but change nothing:
    their writes go to an out-of-range index and are dropped."""
    sampling, stop_ids, n_new = spec.sampling, spec.stop_ids, spec.max_new_tokens
    hidden_layer, attn = spec.hidden_layer, spec.attn
    b = state.tokens.shape[0]
    rows = jnp.arange(b)
    active = state.fed < state.num if hidden_layer is not None else ~state.stopped
    last = state.tokens[rows, jnp.minimum(state.fed, n_new - 1)]
    states, k, v = forward_one(blocks, cfg, last, state.cache, prefix, attn, offset)
    slot = jnp.where(active, state.cache.lengths, state.cache.k[0].shape[1])
    cache = KVCache(tuple(c.at[rows, slot].set(k[i], mode="drop")
                          for i, c in enumerate(state.cache.k)),
                    tuple(c.at[rows, slot].set(v[i], mode="drop")
                          for i, c in enumerate(state.cache.v)),
                    state.cache.lengths + active)
    hidden = state.hidden
    if hidden_layer is not None:
        h = _state_at(blocks, cfg, states, hidden_layer, spec.post_norm)
        hidden = hidden.at[rows, jnp.where(active, state.fed, n_new)].set(h, mode="drop")
    grow = active & ~state.stopped
    if sampling.greedy:
        keys = row_keys
    else:
        keys = _token_keys(row_keys, state.num)
    final = rms_norm(states[-1], blocks.final_norm, cfg.rms_norm_eps)
    nxt = sample_tokens(lm_logits(blocks, cfg, final), keys, sampling)
    tokens = state.tokens.at[rows, jnp.where(grow, state.num, n_new)].set(nxt, mode="drop")
    num = state.num + grow
    stopped = state.stopped | (grow & _stops(nxt, num, stop_ids, n_new))
    return DecodeState(cache, tokens, num, state.fed + active, stopped, hidden)


def generate(params: Weights, cfg: Qwen3Config, spec: GenerateSpec, tokens, lengths, *,
             key=None, prefix: PrefixCache | None = None, row_keys=None,
             visual: Visual | None = None, pos_offset=None) -> Generated:
    """Generate up to `spec.max_new_tokens` tokens per row as `spec` says, pure and jittable
    (`spec` and `cfg` are static; the weights and every other argument are traced).

    tokens: [B, T] right-padded prompts, lengths: [B] (>= 1) their lengths; with `prefix` (all
    layers, from `model.prefill`) each prompt continues the shared prefix. key: a PRNG key;
    row b's i-th token is drawn with fold_in(fold_in(key, b), i), so rows and steps never share
    a key, the same key gives the same tokens, and a row's draws do not depend on the others.
    `row_keys` [B], when given, are the rows' keys instead of fold_in(key, b) (`key` unused): a
    caller whose rows have identities of their own (envs, dataset rows) keeps each row's draws
    whatever batch it lands in. A row stops after a stop token (kept) or after max_new_tokens;
    a stopped row changes no more, and the loop ends when every row has stopped. Logits in
    float32 from `lm_head` (untied) or the embedding (tied).
    params: stacked or per-layer (`llm_jax.weights.per_layer`, which spares the copy of each
    layer's weights taken before the loop). `visual` and `pos_offset` [B]: a prompt with images
    (`llm_jax.vl_model.vl_generate`): the prompt pass takes the image tokens, M-RoPE and
    DeepStack states, and generated tokens sit at their index plus the row's offset on all
    three rope axes (HF's rope deltas)."""
    n_new, hidden_layer = spec.max_new_tokens, spec.hidden_layer
    b, t = tokens.shape
    p = 0 if prefix is None else prefix.k.shape[1]
    check_generate(cfg, [t], n_new, p, hidden_layer)  # static shapes: at trace time
    if prefix is not None and prefix.k.shape[0] != cfg.num_layers:
        raise GenerateError(f"the prefix cache holds {prefix.k.shape[0]} layers; decoding needs "
                            f"all {cfg.num_layers} (prefill with num_layers=None)")
    if key is None and row_keys is None:
        raise GenerateError("generate needs a key or row_keys")
    lengths = lengths.astype(jnp.int32)
    x, (k, v), _ = hidden_states(params, cfg, tokens, lengths, cfg.num_layers, prefix, spec.attn,
                                 visual)
    n = cfg.num_layers
    pad = jnp.zeros((b, n_new, *k.shape[3:]), k.dtype)
    cache = KVCache(tuple(jnp.concatenate([k[i], pad], 1) for i in range(n)),
                    tuple(jnp.concatenate([v[i], pad], 1) for i in range(n)), lengths)
    # each layer's arrays taken once, outside the loop (no-ops for the per-layer layout)
    blocks = params.replace(layers=layer_blocks(params, cfg))
    per_layer_prefix = None if prefix is None else (
        tuple(prefix.k[i] for i in range(n)), tuple(prefix.v[i] for i in range(n)))
    last = rms_norm(x[jnp.arange(b), lengths - 1], params.final_norm, cfg.rms_norm_eps)
    if row_keys is None:
        row_keys = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(b))
    zero = jnp.zeros(b, jnp.int32)
    first = sample_tokens(lm_logits(params, cfg, last), _token_keys(row_keys, zero),
                          spec.sampling)
    out = jnp.full((b, n_new), spec.pad_id, jnp.int32).at[:, 0].set(first)
    hidden = (None if hidden_layer is None
              else jnp.zeros((b, n_new, cfg.hidden_size), x.dtype))
    num = zero + 1
    state = DecodeState(cache, out, num, zero, _stops(first, num, spec.stop_ids, n_new), hidden)

    def more(s: DecodeState):
        return jnp.any(s.fed < s.num) if hidden_layer is not None else jnp.any(~s.stopped)

    offset = 0 if pos_offset is None else pos_offset.astype(jnp.int32)
    step = functools.partial(_decode_step, blocks, cfg, per_layer_prefix, row_keys, offset, spec)
    if spec.steps_per_check > 1:
        one = step

        def step(s):
            return jax.lax.fori_loop(0, spec.steps_per_check, lambda _, s: one(s), s)

    state = jax.lax.while_loop(more, step, state)
    return Generated(state.tokens, state.num, state.hidden)
