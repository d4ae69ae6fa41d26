"""Hidden states of observations, inside the jitted chunk (jax backend) or from a vLLM server.

Host side, `make_llm(cfg, env_name)` loads (or randomly builds) the Qwen3, the tokenizer, the
device renderer and the prompt, and prefills the prompt prefix once. Device side,
`encode_observations` renders observations to tokens, appends the prompt tail and encodes them
against the cached prefix (when to call it is `fused.llm.policy_input`'s business).

Cost control: envs are sorted by token count and encoded in microbatches, each padded only to
the smallest bucket length (64, 128, ..., L) that holds its longest row (`lax.switch` over
pre-compiled bucket sizes), so padding does not make every call cost the worst case.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fused.errors import ConfigError
from fused.llm.config import (LLMConfig, ModelConfig, check_llm_memory, is_vl,
                              model_config, pool_every, sampling_of, tokenizer_of)
from fused.llm.vllm_host import HostEncoder
from fused.text.buckets import at_smallest_fit, coarse_buckets, encode_buckets
from fused.text.prompt import IMAGINE_INSTRUCTION, garbage_prefix, prompt_parts
from fused.text.render import Renderer, make_renderer, render_tokens
from llm_jax.config import Qwen3Config
from llm_jax.loader import WeightsError, load_params
from llm_jax.memory import generation_need
from llm_jax.model import (AttentionConfig, PrefixCache, encode, first_layers, init_params,
                           prefill)
from llm_jax.sampling import GREEDY, Resolved

log = logging.getLogger(__name__)


class FrozenLLM(NamedTuple):
    """Device arrays the chunk takes as an argument (never trained, never checkpointed)."""

    params: Any  # Qwen3 params, first `layer` layers only (all of them with imagination)
    prefix: PrefixCache
    tail: jax.Array  # [K] int32
    # [] bool: `--llm.hidden shuffle` (data, not a branch: real and shuffled runs and
    # evaluations share one compiled program)
    shuffle: jax.Array


class LLM(NamedTuple):
    """Static pieces (host objects, shapes) of the LLM augmentation."""

    cfg: LLMConfig
    backend: str  # "jax" or "vllm"
    qcfg: Qwen3Config
    layer: int
    renderer: Renderer
    frozen: FrozenLLM | None  # jax backend
    host: HostEncoder | None  # vllm backend
    buckets: tuple[int, ...]
    tokenizer: Any
    prefix_ids: np.ndarray  # [P] the prompt prefix encoded (shuffled for garbage-prompt)
    attn: AttentionConfig
    seed: int = 0  # of the random model's weights (when --llm.weights is not given)
    stop_ids: tuple[int, ...] = ()  # end-of-turn tokens (imagination stops there)
    pad_id: int = 0  # the tokenizer's padding token (fills generated tokens past a row's end)
    dtype: str = "float32"  # the compute dtype (--llm.dtype, `auto` resolved)
    sampling: Resolved = Resolved(GREEDY, {})  # imagination's, and where its values came from
    # Device bytes left for a call's activations once weights and caches are in (None: not
    # checked); auto micro-batches stay within it (`fused.llm.batching.for_llm`).
    activation_room: float | None = None
    # A Qwen3-VL reading frames (`fused.llm.vl.VLEncoder`; renderer None, frozen.params its
    # vision tower and text layers, prefix_ids the whole prompt, one bucket of its length)
    vl: Any = None

    @property
    def imagines(self) -> bool:
        return self.cfg.imagine.tokens > 0

    @property
    def hidden_size(self) -> int:
        return self.qcfg.hidden_size

    @property
    def reports_load(self) -> bool:
        """Encoding returns router load statistics: the jax backend on a MoE model whose
        computed layers include sparse ones (not imagination, whose decoding keeps none, nor a
        Qwen3-VL-MoE reading frames, whose pass with images keeps none either)."""
        return (self.backend == "jax" and not self.imagines and self.vl is None
                and any(self.qcfg.sparse_layers[:self.layer]))


def same_weights(a: LLMConfig, b: LLMConfig) -> bool:
    """Two --llm.* settings that read the same (truncated) weights in the same dtype."""
    return ((a.weights, a.random_model, a.compute_dtype, a.layer, a.imagine.tokens > 0)
            == (b.weights, b.random_model, b.compute_dtype, b.layer, b.imagine.tokens > 0))


def load_llm_params(model: ModelConfig, qcfg: Qwen3Config, need: dict[str, int],
                    generates: bool, seed: int = 0, layers: int | None = None) -> dict:
    """The model's weights in its dtype, its first `layers` layers (default all): read from
    --llm.weights, or the random model of `qcfg`'s shape made from `seed` (with a notice that
    its outputs mean nothing). Before anything is made or read, `need` (every device byte of
    the job: `llm_jax.memory.generation_need`) is checked against the device's memory: a
    ConfigError naming the figures and the fix when they do not fit."""
    check_llm_memory(model, need, generates)
    return _make_or_read(model, qcfg, seed, layers, per_layer=generates)


def _make_or_read(model: ModelConfig, qcfg: Qwen3Config, seed: int, layers: int | None,
                  per_layer: bool = False) -> dict:
    """The weights, stacked by layer (`lax.scan` over them: encoding), or with `per_layer` one
    set of arrays per layer (`llm_jax.weights.per_layer`: the decode loop's layout)."""
    dtype = jnp.dtype(model.compute_dtype)
    if model.weights is None:
        log.info(f"notice: --llm.weights not given: using a RANDOM Qwen3 ({model.random_model}: "
                 f"{qcfg.num_layers} layers, hidden {qcfg.hidden_size}); its outputs carry no "
                 "meaning (for tests and speed only)")

        # jitted: a released shape's weights are made on the device without float32 copies
        return jax.jit(partial(init_params, qcfg, dtype=dtype, layers=layers,
                               per_layer=per_layer))(jax.random.PRNGKey(seed))
    try:
        return load_params(model.weights, dtype, layers, per_layer=per_layer)[1]
    except WeightsError as e:
        raise ConfigError(f"llm.weights={model.weights!r}: {e}") from None


def make_llm(cfg: LLMConfig, env_name: str, seed: int = 0, weights_of: LLM | None = None) -> LLM:
    """Host setup: weights (or a random model), tokenizer, renderer, prefix cache. Problems a
    model brings (too few layers, a prompt past its context, a foreign vocabulary) are
    ConfigErrors naming the field, raised before anything compiles."""
    if is_vl(cfg):
        return make_vl_llm(cfg, env_name, seed, weights_of)
    backend = cfg.active_backend
    override = bucket_override()  # (a bad value: one line before any work)
    if override:
        log.info(f"encoding lengths {override} from ${BUCKETS_ENV} (not the default's)")
    tok = tokenizer_of(cfg.weights)
    renderer = make_renderer(env_name, tok)
    im = cfg.imagine
    if im.tokens:
        instruction = (Path(im.prompt).expanduser().read_text().strip() if im.prompt
                       else IMAGINE_INSTRUCTION)
        parts = prompt_parts(tok, env_name, instruction, im.thinking)
    else:
        parts = prompt_parts(tok, env_name)
    dtype_name = cfg.compute_dtype
    dtype = jnp.dtype(dtype_name)
    qcfg = model_config(cfg)
    layer = qcfg.num_layers if cfg.layer is None else cfg.layer
    total = renderer.max_tokens + len(parts.tail)
    if len(parts.prefix) + total + im.tokens > qcfg.max_position_embeddings:
        raise ConfigError(f"llm.weights: a prompt of up to {len(parts.prefix) + total} tokens "
                          + (f"and {im.tokens} imagined " if im.tokens else "")
                          + f"exceeds the model's max_position_embeddings="
                          f"{qcfg.max_position_embeddings}; use a model with a longer context"
                          + (" or fewer --llm.imagine.tokens" if im.tokens else ""))
    if tok.vocab_size > qcfg.vocab_size:
        raise ConfigError(f"llm.weights: the tokenizer has {tok.vocab_size} tokens but the "
                          f"model's vocab_size is {qcfg.vocab_size}; tokenizer and weights do not "
                          "belong together")
    prefix_ids = garbage_prefix(parts, tok, seed) if cfg.hidden == "garbage-prompt" \
        else parts.prefix
    attn = AttentionConfig(cfg.attention)
    frozen, host = None, None
    room = None
    if backend == "jax":
        params, cache = None, None
        if (weights_of is not None and weights_of.frozen is not None
                and same_weights(cfg, weights_of.cfg) and (cfg.weights or seed == weights_of.seed)):
            # an ablation of a loaded model: its weights, and its prefix cache if the same prefix
            params, room = weights_of.frozen.params, weights_of.activation_room
            if np.array_equal(prefix_ids, weights_of.prefix_ids):
                cache = weights_of.frozen.prefix
        computed = qcfg.num_layers if im.tokens else layer  # generating needs every layer
        if params is None:
            # an explicit call size, else one row (auto call sizes fit what is left)
            rows = max(cfg.microbatch, cfg.refresh_batch, 1)
            need = generation_need(qcfg, dtype, computed, rows, total, im.tokens,
                                   len(prefix_ids))
            room = check_llm_memory(cfg, need, im.tokens > 0) + need["activations"]
            params = _make_or_read(cfg, qcfg, seed, computed, per_layer=im.tokens > 0)
        if not im.tokens:  # layers past the hidden state's are never computed, nor logits
            params = {k: v for k, v in first_layers(params, qcfg, layer).items()
                      if k != "lm_head"}
        if cache is None and computed > 0:
            cache = jax.jit(partial(prefill, cfg=qcfg, num_layers=computed, attn=attn))(
                params, prefix_tokens=jnp.asarray(prefix_ids))
        elif cache is None:  # embeddings only: no attention, an empty cache
            empty = jnp.zeros((0, len(prefix_ids), qcfg.num_kv_heads, qcfg.head_dim), dtype)
            cache = PrefixCache(empty, empty)
        frozen = FrozenLLM(params, cache, jnp.asarray(parts.tail),
                           jnp.asarray(cfg.hidden == "shuffle"))
    else:
        host = HostEncoder(cfg, renderer.layout, tok, prefix_ids, parts.tail,
                           qcfg.hidden_size, renderer.offset)
    stop, sampling = (), Resolved(GREEDY, {})
    if im.tokens:
        from llm_jax.tokenizer import stop_ids

        stop = stop_ids(cfg.folder, tok, qcfg.vocab_size, chat=True)
        sampling = sampling_of(im, cfg, "--llm.imagine.")
        log.info(f"imagination sampling: {sampling.describe()}")
    buckets = coarse_buckets(total) if im.tokens else encode_buckets(total, override)
    return LLM(cfg=cfg, backend=backend, qcfg=qcfg, layer=layer, renderer=renderer,
               frozen=frozen, host=host, buckets=buckets, tokenizer=tok, prefix_ids=prefix_ids,
               attn=attn, seed=seed, stop_ids=stop, pad_id=tok.pad_id, dtype=dtype_name,
               sampling=sampling, activation_room=room)


BUCKETS_ENV = "FUSED_ENCODE_BUCKETS"


def bucket_override() -> tuple[int, ...] | None:
    """$FUSED_ENCODE_BUCKETS (e.g. "256,512"): the padded lengths of encoding calls below the
    prompt bound, instead of the default's steps of 64 (`encode_buckets`). Fewer sizes compile
    faster (each is compiled at every call site of a fused program: 10 -> 2 made an
    LLM-augmented evaluation's block compile 5.6 s -> 3.8 s on a tiny model) and pad more; the
    states are the same up to float rounding. The test suite sets it (tests/conftest.py)."""
    raw = os.environ.get(BUCKETS_ENV, "").strip()
    if not raw:
        return None
    try:
        sizes = tuple(int(x) for x in raw.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) <= 0 or list(sizes) != sorted(set(sizes)):
        raise ConfigError(f"${BUCKETS_ENV}={raw!r}: ascending positive token counts, e.g. "
                          "256 or 256,512 (or unset it for the default)")
    return sizes


def make_vl_llm(cfg: LLMConfig, env_name: str, seed: int = 0,
                weights_of: LLM | None = None) -> LLM:
    """`make_llm` for a Qwen3-VL (`fused.llm.config.validate_vl` passed): it reads each env's frame
    as `label.py label` does; an ablation of `weights_of` (the same model) shares its weights."""
    from fused.llm.vl import VLEncoder

    if cfg.hidden == "garbage-prompt":
        raise ConfigError("llm.hidden=garbage-prompt with a vision-language model: not built "
                          "(its prompt is the frame and one instruction); use real, zero or "
                          "shuffle")
    rows = max(cfg.microbatch, cfg.refresh_batch, 1)  # (auto call sizes fit what is left)
    shared = (weights_of is not None and weights_of.vl is not None
              and same_weights(cfg, weights_of.cfg))
    enc = VLEncoder(cfg, env_name, rows,
                    params=weights_of.frozen.params if shared else None)
    log.info(f"{cfg.weights} ({enc.dtype}) {enc.memory_line}")
    params, enc.params = enc.params, None  # (the chunk gets them as an argument)
    empty = jnp.zeros((0, 0, enc.cfg.text.num_kv_heads, enc.cfg.text.head_dim), enc.dtype)
    frozen = FrozenLLM(params, PrefixCache(empty, empty), jnp.zeros(0, jnp.int32),
                       jnp.asarray(cfg.hidden == "shuffle"))
    if enc.sampling is not None:
        log.info(f"imagination sampling: {enc.sampling.describe()}")
    return LLM(cfg=cfg, backend="jax", qcfg=enc.cfg.text, layer=enc.layer, renderer=None,
               frozen=frozen, host=None, buckets=(int(enc.ids.size),), tokenizer=enc.tokenizer,
               prefix_ids=enc.ids, attn=AttentionConfig(cfg.attention), seed=seed,
               stop_ids=enc.stop_ids, pad_id=enc.tokenizer.pad_id, dtype=enc.dtype,
               sampling=enc.sampling or Resolved(GREEDY, {}), activation_room=enc.room, vl=enc)


def append_tail(tokens, lengths, tail):
    """tokens [B, L] right-padded, lengths [B], tail [K] -> ([B, L + K], lengths + K)."""
    k = tail.shape[0]
    padded = jnp.pad(tokens, ((0, 0), (0, k)), constant_values=0)
    put = jax.vmap(lambda row, n: jax.lax.dynamic_update_slice(row, tail, (n,)))
    return put(padded, lengths), lengths + k


def _encode_tokens(llm: LLM, frozen: FrozenLLM, tokens, lengths):
    """One microbatch [M, L] padded only to the smallest bucket holding its longest row.
    Returns (hidden [M, H] float32, router load [L_sparse, E] or None: `reports_load`)."""
    c = llm.cfg
    post_norm = c.post_norm

    def at(size):
        def run(t, n):
            out = encode(frozen.params, llm.qcfg, t[:, :size], n, llm.layer, c.pool,
                         post_norm, frozen.prefix, llm.attn, expert_load=llm.reports_load)
            h, load = out if llm.reports_load else (out, None)
            return h.astype(jnp.float32), load
        return run

    return at_smallest_fit(llm.buckets, lengths.max(), at, tokens, lengths)


def sorted_microbatches(fn, lengths, microbatch: int | None, *rows):
    """`fn(*rows of one micro-batch)` -> (per-row outputs [mb, ...], other outputs), over the
    rows sorted by `lengths` [B] in micro-batches of `microbatch` (default all) under `lax.map`,
    so each pads only to its own longest row. Returns (the per-row outputs [B, ...] in the
    rows' own order, the other outputs stacked [B / mb, ...])."""
    b = lengths.shape[0]
    mb = microbatch or b
    order = jnp.argsort(lengths)
    undo = jnp.zeros(b, jnp.int32).at[order].set(jnp.arange(b, dtype=jnp.int32))
    per_row, other = jax.lax.map(lambda xs: fn(*xs), tuple(
        x[order].reshape(b // mb, mb, *x.shape[1:]) for x in rows))
    return jax.tree.map(lambda y: y.reshape(b, *y.shape[2:])[undo], per_row), other


def observation_prompts(llm: LLM, frozen: FrozenLLM, obs):
    """obs [B, D] -> each observation's prompt after the prefix (tokens [B, L], lengths [B])."""
    tokens, lengths = render_tokens(llm.renderer, obs)
    return append_tail(tokens, lengths, frozen.tail)


def encode_observations(llm: LLM, frozen: FrozenLLM | None, obs, microbatch: int | None = None,
                        keys=None, with_load: bool = False):
    """Hidden states of symbolic observations (a VL model's: of frames). obs: [B, D] -> ([B, H]
    float32, tokens []);
    with imagination (`--llm.imagine.tokens`), of the tokens generated about each (`keys` [B]:
    one per observation, for sampled imagination), and tokens counts prompts and generation.
    `with_load` (only where `llm.reports_load`): also the router load [L_sparse, E] int32,
    assignments of the encoded tokens to each expert of each computed sparse layer."""
    if with_load and not llm.reports_load:
        raise ValueError("router load asked of an LLM that reports none (dense, vllm backend, "
                         "imagination or frames)")
    with jax.named_scope("llm"):  # in profiles: `bench/trace_report.py` groups device time by it
        return _encode_observations(llm, frozen, obs, microbatch, keys, with_load)


def _encode_observations(llm: LLM, frozen: FrozenLLM | None, obs, microbatch, keys, with_load):
    if llm.backend == "vllm":
        return llm.host.callback(obs)
    if llm.vl is not None:  # frames: one prompt length, so plain micro-batches
        n = obs.shape[0]
        mb = microbatch or n
        frames = obs.reshape(n // mb, mb, *obs.shape[1:])
        prompts = jnp.int32(n * llm.vl.row_tokens)  # (after the shared prefix, as for text)
        if not llm.imagines:
            hidden = jax.lax.map(lambda f: llm.vl.fn(frozen.params, f), frames)
            return hidden.reshape(n, -1), prompts
        if keys is None:
            if not llm.sampling.sampling.greedy:
                raise ValueError("sampled imagination needs a key per observation")
            keys = jax.random.split(jax.random.PRNGKey(0), n)
        hidden, _, num = jax.lax.map(lambda a: llm.vl.imagine(frozen.params, *a),
                                     (frames, keys.reshape(n // mb, mb, *keys.shape[1:])))
        return hidden.reshape(n, -1), prompts + num.sum()
    if llm.imagines:
        out = imagine_observations(llm, frozen, obs, microbatch, keys)
        return out.hidden, out.tokens
    tokens, lengths = observation_prompts(llm, frozen, obs)
    hidden, load = sorted_microbatches(lambda t, n: _encode_tokens(llm, frozen, t, n), lengths,
                                       microbatch, tokens, lengths)
    if with_load:
        return hidden, lengths.sum(), load.sum(0)
    return hidden, lengths.sum()


class Imagined(NamedTuple):
    hidden: jax.Array  # [B, H] float32: the generated tokens' states at the layer, pooled
    generated: jax.Array  # [B, N] int32: the tokens (the pad id past num_generated)
    num_generated: jax.Array  # [B]
    tokens: jax.Array  # [] prompt and generated tokens, all rows


def pool_generated(hidden, num, pool: str):
    """`llm_jax.decode.pool_generated` by an imagination pool's name: `last`, `mean` or
    `every:K` (the mean of generated tokens 0, K, 2K, ...)."""
    from llm_jax.decode import pool_generated as pool_by

    return pool_by(hidden, num, None if pool == "last" else pool_every(pool))


def imagine_observations(llm: LLM, frozen: FrozenLLM, obs, microbatch: int | None = None,
                         keys=None) -> Imagined:
    """The LLM generates up to `imagine.tokens` tokens after each observation's prompt; their
    states at `llm.layer` (post-norm with --llm.post-norm) are pooled by `imagine.pool`.
    Micro-batches of rows sorted by prompt length, each padded to its smallest bucket; a row's
    draws use its own key (its tokens do not depend on the batch it lands in)."""
    from llm_jax.decode import generate

    im, c = llm.cfg.imagine, llm.cfg
    sampling = llm.sampling.sampling
    if keys is None:
        if not sampling.greedy:
            raise ValueError("sampled imagination needs a key per observation")
        keys = jax.random.split(jax.random.PRNGKey(0), obs.shape[0])
    tokens, lengths = observation_prompts(llm, frozen, obs)

    def at(size):
        def run(t, n, k):
            out = generate(frozen.params, llm.qcfg, t[:, :size], n, None,
                           max_new_tokens=im.tokens, pad_id=llm.pad_id, sampling=sampling,
                           stop_ids=llm.stop_ids, prefix=frozen.prefix, hidden_layer=llm.layer,
                           post_norm=c.post_norm, attn=llm.attn, row_keys=k)
            return (pool_generated(out.hidden, out.num_tokens, im.pool), out.tokens,
                    out.num_tokens), None
        return run

    (h, gen, num), _ = sorted_microbatches(
        lambda t, n, k: at_smallest_fit(llm.buckets, n.max(), at, t, n, k), lengths, microbatch,
        tokens, lengths, keys)
    return Imagined(h, gen, num, lengths.sum() + num.sum())
