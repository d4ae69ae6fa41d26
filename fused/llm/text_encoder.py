"""Text encoders: each observation rendered to Qwen3 tokens on the device (`fused.text.render`),
put between the prompt's prefix and tail, and encoded against the prefix's cached keys and
values; the hidden state is the residual stream after `--llm.layer`, pooled over the prompt
(`TextEncoder`) or over tokens the model generates after it (`ImaginingEncoder`).

Cost control: rows are sorted by token count and encoded in micro-batches, each padded only to
the smallest bucket length (64, 128, ..., L) that holds its longest row (`lax.switch` over
pre-compiled bucket sizes), so padding does not make every call cost the worst case.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fused.errors import ConfigError
from fused.llm.batching import Batching, CallShape, for_calls
from fused.llm.config import (LLMConfig, check_llm_memory, model_config, pool_every,
                              sampling_of, tokenizer_of)
from fused.llm.digests import folder_digest, prompt_digest
from fused.llm.encoder import Encoded, OnDevice
from fused.llm.weights import make_or_read, same_weights
from fused.runs.config_io import to_dict
from fused.text.buckets import at_smallest_fit, coarse_buckets, encode_buckets
from fused.text.prompt import IMAGINE_INSTRUCTION, INSTRUCTION, garbage_prefix, prompt_parts
from fused.text.render import Renderer, make_renderer, render_tokens
from llm_jax.config import Qwen3Config
from llm_jax.decode import GenerateSpec, generate, pool_generated
from llm_jax.memory import generation_need
from llm_jax.model import AttentionConfig, PrefixCache, encode, first_layers, prefill
from llm_jax.tokenizer import stop_ids
from llm_jax.weights import Weights

log = logging.getLogger(__name__)

ALL_ABLATIONS = ("real", "zero", "shuffle", "garbage-prompt")


class TextPrompt(NamedTuple):
    """The host pieces of a text prompt around an observation."""

    tokenizer: Any
    renderer: Renderer
    prefix_ids: np.ndarray  # [P] int32 (its ordinary tokens shuffled for `garbage-prompt`)
    tail: np.ndarray  # [K] int32
    qcfg: Qwen3Config
    layer: int
    total: int  # the most tokens after the prefix: the renderer's bound and the tail


def text_prompt(cfg: LLMConfig, env_name: str, seed: int, instruction: str = INSTRUCTION,
                thinking: bool = False, new_tokens: int = 0) -> TextPrompt:
    """The prompt of `cfg` on `env_name`: ConfigErrors where it cannot fit the model (past its
    context with `new_tokens` generated after it; a tokenizer that is not the model's)."""
    tok = tokenizer_of(cfg.weights)
    renderer = make_renderer(env_name, tok)
    parts = prompt_parts(tok, env_name, instruction, thinking)
    qcfg = model_config(cfg)
    layer = qcfg.num_layers if cfg.layer is None else cfg.layer
    total = renderer.max_tokens + len(parts.tail)
    if len(parts.prefix) + total + new_tokens > qcfg.max_position_embeddings:
        raise ConfigError(f"llm.weights: a prompt of up to {len(parts.prefix) + total} tokens "
                          + (f"and {new_tokens} imagined " if new_tokens else "")
                          + f"exceeds the model's max_position_embeddings="
                          f"{qcfg.max_position_embeddings}; use a model with a longer context"
                          + (" or fewer --llm.imagine.tokens" if new_tokens else ""))
    if tok.vocab_size > qcfg.vocab_size:
        raise ConfigError(f"llm.weights: the tokenizer has {tok.vocab_size} tokens but the "
                          f"model's vocab_size is {qcfg.vocab_size}; tokenizer and weights do not "
                          "belong together")
    prefix_ids = (garbage_prefix(parts, tok, seed) if cfg.hidden == "garbage-prompt"
                  else parts.prefix)
    return TextPrompt(tok, renderer, prefix_ids, parts.tail, qcfg, layer, total)


class FrozenText(NamedTuple):
    """Device arrays a text encoder's calls read."""

    params: Weights  # the computed layers only (every layer, per layer, to generate)
    prefix: PrefixCache
    tail: jax.Array  # [K] int32
    # [] bool: `--llm.hidden shuffle` (data, not a branch: real and shuffled runs and
    # evaluations share one compiled program)
    shuffle: jax.Array


def append_tail(tokens, lengths, tail):
    """tokens [B, L] right-padded, lengths [B], tail [K] -> ([B, L + K], lengths + K)."""
    k = tail.shape[0]
    padded = jnp.pad(tokens, ((0, 0), (0, k)), constant_values=0)
    put = jax.vmap(lambda row, n: jax.lax.dynamic_update_slice(row, tail, (n,)))
    return put(padded, lengths), lengths + k


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


class ReadsText:
    """What encoders of a text prompt share: their call sizes, what names their states and a
    label set's card. Needs `cfg`, `qcfg`, `layer`, `renderer`, `prefix_ids`, `tail`,
    `buckets`, `dtype`, `activation_room`, `seed`, `backend` and `post_norm`."""

    @property
    def call_shape(self) -> CallShape:
        # rows are typically a quarter of the renderer's worst case (Classic: 209 of 1013)
        bound = self.buckets[-1]
        return CallShape(self.qcfg, self.layer,
                         self.renderer.max_tokens // 4 + bound - self.renderer.max_tokens,
                         bound, len(self.prefix_ids), self.dtype, self.activation_room)

    def batching(self, local_envs: int, platform: str | None = None) -> Batching:
        return for_calls(self.call_shape, self.cfg, local_envs, platform)

    def identity(self) -> dict:
        return {"weights_digest": folder_digest(self.cfg.weights, self.cfg.random_model,
                                                self.seed),
                "prompt_digest": prompt_digest(self.prefix_ids, self.tail),
                "layer": self.layer, "pool": self.cfg.pooled, "post_norm": self.post_norm}

    def card(self, label_dtype: str, imagine: dict | None = None) -> dict:
        m = self.cfg
        entry = {"llm": to_dict(m), "backend": self.backend, **self.identity(),
                 "model": dict(self.qcfg.__dict__), "prompt_tokens": int(len(self.prefix_ids)),
                 "skip_n": m.skip_n, "dtype": label_dtype, "compute_dtype": m.compute_dtype,
                 "hidden": m.hidden}
        return json.loads(json.dumps(entry))  # as card.json gives it back (tuples are lists)


class TextEncoder(ReadsText, OnDevice):
    """A Qwen3 reading each observation's text against the cached prompt prefix (jax)."""

    backend = "jax"

    draws = False
    ablations = ALL_ABLATIONS
    generates = False  # (imagination: every layer computed, one set of arrays per layer)

    def __init__(self, cfg: LLMConfig, prompt: TextPrompt, frozen: FrozenText, seed: int,
                 room: float | None):
        self.cfg, self.seed, self.frozen = cfg, seed, frozen
        self.qcfg, self.layer, self.renderer = prompt.qcfg, prompt.layer, prompt.renderer
        self.tokenizer, self.prefix_ids, self.tail = prompt.tokenizer, prompt.prefix_ids, \
            prompt.tail
        self.hidden_size = prompt.qcfg.hidden_size
        self.post_norm = cfg.post_norm
        self.attn = AttentionConfig(cfg.attention)
        self.dtype = cfg.compute_dtype
        self.activation_room = room  # device bytes left for a call's activations
        self.buckets = self.buckets_for(cfg, prompt.total)
        sparse = sum(prompt.qcfg.sparse_layers[:prompt.layer])
        self.load_shape = self.load_of(sparse, prompt.qcfg.num_experts)

    # --- what differs in imagination (overridden there) ----------------------------------------

    @staticmethod
    def prompt_of(cfg: LLMConfig, env_name: str, seed: int) -> TextPrompt:
        return text_prompt(cfg, env_name, seed)

    @staticmethod
    def buckets_for(cfg: LLMConfig, total: int) -> tuple[int, ...]:
        return encode_buckets(total, cfg.encode_lengths)

    @staticmethod
    def load_of(sparse_layers: int, experts: int) -> tuple[int, int] | None:
        """Router load of the computed sparse layers (a MoE's), reported with each call."""
        return (sparse_layers, experts) if sparse_layers else None

    # --- host setup -----------------------------------------------------------------------------

    @classmethod
    def create(cls, cfg: LLMConfig, env_name: str, seed: int = 0, like=None):
        """Weights (or a random model), tokenizer, renderer, prefix cache: ConfigErrors before
        anything compiles. An ablation `like` another encoder of the same weights shares them,
        and its prefix cache where the prefix is the same."""
        prompt = cls.prompt_of(cfg, env_name, seed)
        qcfg = prompt.qcfg
        dtype = jnp.dtype(cfg.compute_dtype)
        attn = AttentionConfig(cfg.attention)
        computed = qcfg.num_layers if cls.generates else prompt.layer
        params, cache, room = None, None, None
        if (isinstance(like, TextEncoder) and same_weights(cfg, like.cfg)
                and (cfg.weights or seed == like.seed)):
            params, room = like.frozen.params, like.activation_room
            if np.array_equal(prompt.prefix_ids, like.prefix_ids):
                cache = like.frozen.prefix
        if params is None:
            # an explicit call size, else one row (auto call sizes fit what is left)
            rows = max(cfg.microbatch, cfg.refresh_batch, 1)
            need = generation_need(qcfg, dtype, computed, rows, prompt.total,
                                   cfg.imagine.tokens if cls.generates else 0,
                                   len(prompt.prefix_ids))
            room = check_llm_memory(cfg, need, cls.generates) + need["activations"]
            params = make_or_read(cfg, qcfg, seed, computed, per_layer=cls.generates)
        if not cls.generates:  # layers past the hidden state's are never computed, nor logits
            params = first_layers(params, qcfg, prompt.layer).replace(lm_head=None)
        if cache is None and computed > 0:
            cache = jax.jit(partial(prefill, cfg=qcfg, num_layers=computed, attn=attn))(
                params, prefix_tokens=jnp.asarray(prompt.prefix_ids))
        elif cache is None:  # embeddings only: no attention, an empty cache
            empty = jnp.zeros((0, len(prompt.prefix_ids), qcfg.num_kv_heads, qcfg.head_dim),
                              dtype)
            cache = PrefixCache(empty, empty)
        frozen = FrozenText(params, cache, jnp.asarray(prompt.tail),
                            jnp.asarray(cfg.hidden == "shuffle"))
        return cls(cfg, prompt, frozen, seed, room)

    # --- device ---------------------------------------------------------------------------------

    def prompts(self, frozen: FrozenText, obs):
        """obs [B, D] -> each observation's prompt after the prefix (tokens [B, L], lengths
        [B])."""
        tokens, lengths = render_tokens(self.renderer, obs)
        return append_tail(tokens, lengths, frozen.tail)

    def _encode_tokens(self, frozen: FrozenText, tokens, lengths):
        """One micro-batch [M, L] padded only to the smallest bucket holding its longest row:
        (hidden [M, H] float32, router load [L_sparse, E] or None)."""
        c = self.cfg
        report = self.load_shape is not None

        def at(size):
            def run(t, n):
                out = encode(frozen.params, self.qcfg, t[:, :size], n, self.layer, c.pool,
                             c.post_norm, frozen.prefix, self.attn, expert_load=report)
                h, load = out if report else (out, None)
                return h.astype(jnp.float32), load
            return run

        return at_smallest_fit(self.buckets, lengths.max(), at, tokens, lengths)

    def encode(self, frozen: FrozenText, obs, microbatch: int | None = None,
               keys=None) -> Encoded:
        tokens, lengths = self.prompts(frozen, obs)
        hidden, load = sorted_microbatches(lambda t, n: self._encode_tokens(frozen, t, n),
                                           lengths, microbatch, tokens, lengths)
        return Encoded(hidden, lengths.sum(), None if load is None else load.sum(0))

class Imagined(NamedTuple):
    hidden: jax.Array  # [B, H] float32: the generated tokens' states at the layer, pooled
    generated: jax.Array  # [B, N] int32: the tokens (the pad id past num_generated)
    num_generated: jax.Array  # [B]


class ImaginingEncoder(TextEncoder):
    """The Qwen3 generates up to `--llm.imagine.tokens` tokens after each observation's prompt
    (an instruction of its own); their states at `--llm.layer` (post-norm with --llm.post-norm)
    are pooled by `--llm.imagine.pool`. Each row draws with its own key, so its tokens do not
    depend on the batch it lands in."""

    draws = True
    generates = True

    def __init__(self, cfg: LLMConfig, prompt: TextPrompt, frozen: FrozenText, seed: int,
                 room: float | None):
        super().__init__(cfg, prompt, frozen, seed, room)
        self.stop_ids = stop_ids(cfg.folder, prompt.tokenizer, prompt.qcfg.vocab_size,
                                 chat=True)
        self.sampling = sampling_of(cfg.imagine, cfg, "--llm.imagine.")
        self.pad_id = prompt.tokenizer.pad_id
        self.generate_spec = GenerateSpec(
            max_new_tokens=cfg.imagine.tokens, pad_id=self.pad_id,
            sampling=self.sampling.sampling, stop_ids=self.stop_ids, hidden_layer=self.layer,
            post_norm=cfg.post_norm, attn=self.attn)
        log.info(f"imagination sampling: {self.sampling.describe()}")

    @staticmethod
    def prompt_of(cfg: LLMConfig, env_name: str, seed: int) -> TextPrompt:
        im = cfg.imagine
        instruction = (Path(im.prompt).expanduser().read_text().strip() if im.prompt
                       else IMAGINE_INSTRUCTION)
        return text_prompt(cfg, env_name, seed, instruction, im.thinking, im.tokens)

    @staticmethod
    def buckets_for(cfg: LLMConfig, total: int) -> tuple[int, ...]:
        return coarse_buckets(total)

    @staticmethod
    def load_of(sparse_layers: int, experts: int) -> None:
        return None  # (decoding keeps no router statistics)

    def imagine(self, frozen: FrozenText, obs, microbatch: int | None = None,
                keys=None) -> tuple[Imagined, jax.Array]:
        """(what was imagined about each of obs [B, D], the prompt tokens [B] lengths)."""
        im = self.cfg.imagine
        sampling = self.sampling.sampling
        if keys is None:
            if not sampling.greedy:
                raise ValueError("sampled imagination needs a key per observation")
            keys = jax.random.split(jax.random.PRNGKey(0), obs.shape[0])
        tokens, lengths = self.prompts(frozen, obs)

        def at(size):
            def run(t, n, k):
                out = generate(frozen.params, self.qcfg, self.generate_spec, t[:, :size], n,
                               prefix=frozen.prefix, row_keys=k)
                pooled = pool_generated(out.hidden, out.num_tokens,
                                        None if im.pool == "last" else pool_every(im.pool))
                return Imagined(pooled, out.tokens, out.num_tokens), None
            return run

        out, _ = sorted_microbatches(
            lambda t, n, k: at_smallest_fit(self.buckets, n.max(), at, t, n, k), lengths,
            microbatch, tokens, lengths, keys)
        return out, lengths

    def encode(self, frozen: FrozenText, obs, microbatch: int | None = None,
               keys=None) -> Encoded:
        out, lengths = self.imagine(frozen, obs, microbatch, keys)
        return Encoded(out.hidden, lengths.sum() + out.num_generated.sum(), None,
                       out.generated, out.num_generated)

    def card(self, label_dtype: str, imagine: dict | None = None) -> dict:
        entry = super().card(label_dtype)
        entry["imagine"] = dict(imagine or {}, sampling=self.sampling.record())
        return json.loads(json.dumps(entry))
