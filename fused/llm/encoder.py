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
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fused.errors import ConfigError
from fused.llm.config import LLMConfig, ModelConfig, model_config
from fused.envspec import spec
from fused.llm.vllm_host import HostEncoder
from fused.text.prompt import garbage_prefix, prompt_parts
from fused.text.render import Renderer, at_smallest_fit, make_renderer, render_tokens
from llm_jax.config import Qwen3Config
from llm_jax.loader import WeightsError, load_params
from llm_jax.model import AttentionConfig, PrefixCache, encode, init_params, prefill
from llm_jax.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


class FrozenLLM(NamedTuple):
    """Device arrays the chunk takes as an argument (never trained, never checkpointed)."""

    params: Any  # Qwen3 params, first `layer` layers only
    prefix: PrefixCache
    tail: jax.Array  # [K] int32


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

    @property
    def hidden_size(self) -> int:
        return self.qcfg.hidden_size


def _buckets(length: int) -> tuple[int, ...]:
    """Padded lengths a microbatch may take: steps of 64 up to 512, then doubling, then L."""
    out, b = [], 64
    while b < length:
        out.append(b)
        b = b + 64 if b < 512 else b * 2
    return tuple(out) + (length,)


def same_weights(a: LLMConfig, b: LLMConfig) -> bool:
    """Two --llm.* settings that read the same (truncated) weights in the same dtype."""
    return (a.weights, a.random_model, a.dtype, a.layer) == (b.weights, b.random_model, b.dtype,
                                                            b.layer)


def load_llm_params(model: ModelConfig, qcfg: Qwen3Config, seed: int = 0) -> dict:
    """The model's weights in its dtype: read from --llm.weights, or the random model of
    `qcfg`'s shape made from `seed` (with a notice that its outputs mean nothing)."""
    dtype = jnp.bfloat16 if model.dtype == "bfloat16" else jnp.float32
    if model.weights is None:
        log.info(f"notice: --llm.weights not given: using a RANDOM Qwen3 ({model.random_model}: "
                 f"{qcfg.num_layers} layers, hidden {qcfg.hidden_size}); its outputs carry no "
                 "meaning (for tests and speed only)")
        return init_params(qcfg, jax.random.PRNGKey(seed), dtype)
    try:
        return load_params(model.weights, dtype)[1]
    except WeightsError as e:
        raise ConfigError(f"llm.weights={model.weights!r}: {e}") from None


def make_llm(cfg: LLMConfig, env_name: str, seed: int = 0, weights_of: LLM | None = None) -> LLM:
    """Host setup: weights (or a random model), tokenizer, renderer, prefix cache. Problems a
    model brings (too few layers, a prompt past its context, a foreign vocabulary) are
    ConfigErrors naming the field, raised before anything compiles."""
    backend = cfg.active_backend
    tok = load_tokenizer(cfg.weights)
    renderer = make_renderer(env_name, tok)
    parts = prompt_parts(tok, env_name)
    dtype = jnp.bfloat16 if cfg.dtype == "bfloat16" else jnp.float32
    qcfg = model_config(cfg)
    layer = qcfg.num_layers if cfg.layer is None else cfg.layer
    total = renderer.max_tokens + len(parts.tail)
    if len(parts.prefix) + total > qcfg.max_position_embeddings:
        raise ConfigError(f"llm.weights: a prompt of up to {len(parts.prefix) + total} tokens "
                          f"exceeds the model's max_position_embeddings="
                          f"{qcfg.max_position_embeddings}; use a model with a longer context")
    if tok.vocab_size > qcfg.vocab_size:
        raise ConfigError(f"llm.weights: the tokenizer has {tok.vocab_size} tokens but the "
                          f"model's vocab_size is {qcfg.vocab_size}; tokenizer and weights do not "
                          "belong together")
    prefix_ids = garbage_prefix(parts, tok, seed) if cfg.hidden == "garbage-prompt" \
        else parts.prefix
    attn = AttentionConfig(cfg.attention)
    frozen, host = None, None
    if backend == "jax":
        params, cache = None, None
        if (weights_of is not None and weights_of.frozen is not None
                and same_weights(cfg, weights_of.cfg) and (cfg.weights or seed == weights_of.seed)):
            # an ablation of a loaded model: its weights, and its prefix cache if the same prefix
            params = weights_of.frozen.params
            if np.array_equal(prefix_ids, weights_of.prefix_ids):
                cache = weights_of.frozen.prefix
        else:
            params = load_llm_params(cfg, qcfg, seed)
        params = {"embed": params["embed"], "final_norm": params["final_norm"],
                  "layers": jax.tree.map(lambda a: a[:layer], params["layers"])}
        if cache is None and layer > 0:
            cache = jax.jit(partial(prefill, cfg=qcfg, num_layers=layer, attn=attn))(
                params, prefix_tokens=jnp.asarray(prefix_ids))
        elif cache is None:  # embeddings only: no attention, an empty cache
            empty = jnp.zeros((0, len(prefix_ids), qcfg.num_kv_heads, qcfg.head_dim), dtype)
            cache = PrefixCache(empty, empty)
        frozen = FrozenLLM(params, cache, jnp.asarray(parts.tail))
    else:
        host = HostEncoder(cfg, spec(env_name).layout, tok, prefix_ids, parts.tail,
                           qcfg.hidden_size)
    return LLM(cfg, backend, qcfg, layer, renderer, frozen, host, _buckets(total), tok,
               prefix_ids, attn, seed)


def append_tail(tokens, lengths, tail):
    """tokens [B, L] right-padded, lengths [B], tail [K] -> ([B, L + K], lengths + K)."""
    k = tail.shape[0]
    padded = jnp.pad(tokens, ((0, 0), (0, k)), constant_values=0)
    put = jax.vmap(lambda row, n: jax.lax.dynamic_update_slice(row, tail, (n,)))
    return put(padded, lengths), lengths + k


def _encode_tokens(llm: LLM, frozen: FrozenLLM, tokens, lengths):
    """One microbatch [M, L] padded only to the smallest bucket holding its longest row."""
    c = llm.cfg
    post_norm = c.post_norm

    def at(size):
        def run(t, n):
            return encode(frozen.params, llm.qcfg, t[:, :size], n, llm.layer, c.pool,
                          post_norm, frozen.prefix, llm.attn).astype(jnp.float32)
        return run

    return at_smallest_fit(llm.buckets, lengths.max(), at, tokens, lengths)


def encode_observations(llm: LLM, frozen: FrozenLLM | None, obs, microbatch: int | None = None):
    """Hidden states of symbolic observations. obs: [B, D] -> ([B, H] float32, tokens [])."""
    if llm.backend == "vllm":
        return llm.host.callback(obs)
    tokens, lengths = render_tokens(llm.renderer, obs)
    tokens, lengths = append_tail(tokens, lengths, frozen.tail)
    b = obs.shape[0]
    mb = microbatch or b
    order = jnp.argsort(lengths)
    tokens, lengths_s = tokens[order], lengths[order]
    h = jax.lax.map(lambda x: _encode_tokens(llm, frozen, *x),
                    (tokens.reshape(b // mb, mb, -1), lengths_s.reshape(b // mb, mb)))
    hidden = jnp.zeros((b, llm.hidden_size), jnp.float32).at[order].set(h.reshape(b, -1))
    return hidden, lengths.sum()
