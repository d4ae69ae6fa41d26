"""LLM hidden states for the policy, inside the jitted chunk (jax backend) or from a vLLM server.

Host side, `make_llm(cfg, env_name)` loads (or randomly builds) the Qwen3, the tokenizer, the
device renderer and the prompt, and prefills the prompt prefix once. Device side,
`encode_observations` renders observations to tokens, appends the prompt tail and encodes them
against the cached prefix; `llm_step` decides per rollout step whether to call (every `skip_n`
env steps, counted globally so any skip_n works) or to refresh envs whose episode just ended.

Cost control: envs are sorted by token count and encoded in microbatches, each padded only to
the smallest bucket length (64, 128, ..., L) that holds its longest row (`lax.switch` over
pre-compiled bucket sizes), so padding does not make every call cost the worst case.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fused.config import LLMConfig
from fused.prompt import garbage_prefix, prompt_parts
from fused.render import Renderer, at_smallest_fit, make_renderer, render_tokens
from fused.text_format import render_text
from llm_jax.config import Qwen3Config
from llm_jax.model import PrefixCache, encode, init_params, prefill

# The built-in tiny random Qwen3 (real vocabulary so real prompt tokens embed): no meaning.
TINY = Qwen3Config(vocab_size=151_936, hidden_size=128, intermediate_size=384, num_layers=2,
                   num_heads=2, num_kv_heads=1, head_dim=64, rope_theta=1_000_000.0,
                   rms_norm_eps=1e-6, tie_word_embeddings=True)


class FrozenLLM(NamedTuple):
    """Device arrays the chunk takes as an argument (never trained, never checkpointed)."""

    params: Any  # Qwen3 params, first `layer` layers only
    prefix: PrefixCache
    tail: jax.Array  # [K] int32


@struct.dataclass
class RunningNorm:
    count: jax.Array  # []
    mean: jax.Array  # [H]
    var: jax.Array  # [H]


@struct.dataclass
class LLMState:
    hidden: jax.Array  # [N, H] float32, raw (un-normalised) hidden state per env
    age: jax.Array  # [N] int32: steps since the env's episode ended unencoded (0 = up to date)
    norm: RunningNorm


class LLM(NamedTuple):
    """Static pieces (host objects, shapes) of the LLM augmentation."""

    cfg: LLMConfig
    backend: str  # "jax" or "vllm"
    qcfg: Qwen3Config
    layer: int
    renderer: Renderer
    frozen: FrozenLLM | None  # jax backend
    host: Any  # vllm backend: HostEncoder
    buckets: tuple[int, ...]
    tokenizer: Any

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


def make_llm(cfg: LLMConfig, env_name: str, seed: int = 0) -> LLM:
    """Host setup: weights (or the tiny random model), tokenizer, renderer, prefix cache."""
    from llm_jax.loader import load_params
    from llm_jax.tokenizer import load_tokenizer

    backend = cfg.active_backend
    tok = load_tokenizer(cfg.weights)
    renderer = make_renderer(env_name, tok)
    parts = prompt_parts(tok, env_name)
    dtype = jnp.bfloat16 if cfg.dtype == "bfloat16" else jnp.float32
    if cfg.weights is not None:
        qcfg = Qwen3Config.from_folder(cfg.weights)
    else:
        if backend == "vllm":
            raise ValueError("llm.backend vllm needs --llm.weights (the folder the server serves)")
        qcfg = TINY if cfg.random_model == "tiny" else Qwen3Config.shape(cfg.random_model)
        print(f"notice: --llm.weights not given: using a RANDOM Qwen3 ({cfg.random_model}: "
              f"{qcfg.num_layers} layers, hidden {qcfg.hidden_size}); its hidden states carry no "
              "meaning (for tests and speed only)", flush=True)
    layer = qcfg.num_layers if cfg.layer is None else cfg.layer
    if layer > qcfg.num_layers:
        raise ValueError(f"llm.layer={layer} but the model has {qcfg.num_layers} layers")
    total = renderer.max_tokens + len(parts.tail)
    if len(parts.prefix) + total > qcfg.max_position_embeddings:
        raise ValueError(f"prompt of up to {len(parts.prefix) + total} tokens exceeds the model's "
                         f"max_position_embeddings={qcfg.max_position_embeddings}")
    frozen, host = None, None
    if backend == "jax":
        if cfg.weights is not None:
            _, params = load_params(cfg.weights, dtype)
        else:
            params = init_params(qcfg, jax.random.PRNGKey(seed), dtype)
        params = {"embed": params["embed"], "final_norm": params["final_norm"],
                  "layers": jax.tree.map(lambda a: a[:layer], params["layers"])}
        prefix_ids = parts.prefix
        if cfg.hidden == "garbage-prompt":
            prefix_ids = garbage_prefix(parts, tok, seed)
        if layer > 0:
            cache = jax.jit(partial(prefill, cfg=qcfg, num_layers=layer))(
                params, prefix_tokens=jnp.asarray(prefix_ids))
        else:  # embeddings only: no attention, an empty cache
            empty = jnp.zeros((0, len(prefix_ids), qcfg.num_kv_heads, qcfg.head_dim), dtype)
            cache = PrefixCache(empty, empty)
        frozen = FrozenLLM(params, cache, jnp.asarray(parts.tail))
    else:
        host = HostEncoder(cfg, env_name, tok, parts, qcfg.hidden_size)
    return LLM(cfg, backend, qcfg, layer, renderer, frozen, host,
               _buckets(total), tok)


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
                          post_norm, frozen.prefix).astype(jnp.float32)
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


def default_microbatch(num_envs: int) -> int:
    """Largest divisor of num_envs that is at most 32."""
    return max(d for d in range(1, min(num_envs, 32) + 1) if num_envs % d == 0)


# --- running normalisation --------------------------------------------------------------------

def init_norm(h: int) -> RunningNorm:
    return RunningNorm(jnp.zeros(()), jnp.zeros(h), jnp.ones(h))


def update_norm(n: RunningNorm, x, weight, axis_name=None) -> RunningNorm:
    """Merge a batch x [B, H] with per-row weights [B] (0/1) into the running moments
    (batch moments summed over devices when sharded, so every device keeps the same stats)."""
    psum = (lambda v: jax.lax.psum(v, axis_name)) if axis_name else (lambda v: v)
    w = weight.astype(jnp.float32)
    m = psum(w.sum())
    safe = jnp.maximum(m, 1.0)
    bmean = psum((w[:, None] * x).sum(0)) / safe
    bvar = psum((w[:, None] * (x - bmean) ** 2).sum(0)) / safe
    total = n.count + m
    frac = m / jnp.maximum(total, 1.0)
    delta = bmean - n.mean
    mean = n.mean + frac * delta
    var = jnp.where(n.count > 0, (n.count * n.var + m * bvar) / jnp.maximum(total, 1.0)
                    + delta ** 2 * n.count * m / jnp.maximum(total, 1.0) ** 2, bvar)
    keep = m > 0
    return RunningNorm(total, jnp.where(keep, mean, n.mean), jnp.where(keep, var, n.var))


def policy_hidden(llm: LLM, s: LLMState) -> jax.Array:
    """What the policy sees: [N, H] normalised (if enabled) hidden states. Without LLM calls
    (`constant_hidden`) the state is zero whatever was restored, so every row is the same."""
    h = jnp.zeros_like(s.hidden) if llm.cfg.constant_hidden else s.hidden
    if not llm.cfg.normalize:
        return h
    return (h - s.norm.mean) / jnp.sqrt(s.norm.var + 1e-6)


# --- per-step logic ---------------------------------------------------------------------------

def init_llm_state(llm: LLM, num_envs: int) -> LLMState:
    return LLMState(jnp.zeros((num_envs, llm.hidden_size), jnp.float32),
                    jnp.ones(num_envs, jnp.int32),  # never encoded yet: waiting
                    init_norm(llm.hidden_size))


def _ablate(llm: LLM, hidden, key):
    if llm.cfg.hidden == "shuffle":
        return hidden[jax.random.permutation(key, hidden.shape[0])]
    return hidden


def llm_step(llm: LLM, frozen, s: LLMState, obs, done, step, key, microbatch, axis_name=None):
    """Hidden states for the observations `obs` [N, D] about to be acted on.

    `done` [N]: the episode of the env ended on the previous step (so `obs` starts a new one);
    `step`: global env-step counter. Returns (state, metrics dict of scalars).

    Envs whose episode ended are re-encoded in batches of `refresh_batch`, oldest first: as soon
    as that many are waiting, or when one has waited `refresh_wait` steps (so a refresh rarely
    encodes padding rows, and no env keeps a previous episode's state longer than that)."""
    c = llm.cfg
    n = obs.shape[0]
    stale = (s.age > 0) | (done & c.refresh_on_reset)
    age = jnp.where(stale, s.age + 1, 0)
    zero = jnp.zeros((), jnp.float32)
    if c.constant_hidden:
        return s.replace(age=jnp.zeros_like(age)), {
            "llm/calls": zero, "llm/refreshed": zero, "llm/tokens": zero}
    k_full, k_part = jax.random.split(key)

    def full(s):
        h, tokens = encode_observations(llm, frozen, obs, microbatch)
        h = _ablate(llm, h, k_full)
        norm = update_norm(s.norm, h, jnp.ones(n), axis_name)
        return (LLMState(h, jnp.zeros_like(age), norm),
                {"llm/calls": jnp.float32(1), "llm/refreshed": zero,
                 "llm/tokens": tokens.astype(jnp.float32)})

    def refresh(s):
        r = min(c.refresh_batch, n)
        idx = jnp.argsort(-age, stable=True)[:r]  # longest-waiting stale envs first
        valid = stale[idx]
        h, tokens = encode_observations(llm, frozen, obs[idx], None)
        h = _ablate(llm, h, k_part)
        hidden = s.hidden.at[idx].set(jnp.where(valid[:, None], h, s.hidden[idx]))
        norm = update_norm(s.norm, h, valid, axis_name)
        return (LLMState(hidden, age.at[idx].set(0), norm),
                {"llm/calls": zero, "llm/refreshed": valid.sum().astype(jnp.float32),
                 "llm/tokens": tokens.astype(jnp.float32)})

    def keep(s):
        return s.replace(age=age), {"llm/calls": zero, "llm/refreshed": zero,
                                    "llm/tokens": zero}

    due = (stale.sum() >= min(c.refresh_batch, n)) | (age.max() >= c.refresh_wait)
    if axis_name is not None:  # every device must take the same branch (collectives inside)
        due = jax.lax.psum(due.astype(jnp.int32), axis_name) > 0
    branch = jnp.where(step % c.skip_n == 0, 0, jnp.where(due, 1, 2))
    return jax.lax.switch(branch, [full, refresh, keep], s)


def hidden_metrics(h: jax.Array) -> dict:
    """Statistics of raw hidden states h [N, H] across envs."""
    n = h.shape[0]
    norms = jnp.linalg.norm(h, axis=-1)
    unit = h / jnp.maximum(norms[:, None], 1e-12)
    total = jnp.sum(unit, axis=0)
    cos = (jnp.dot(total, total) - n) / max(n * (n - 1), 1)
    per_dim = h.std(axis=0)
    return {"hidden/mean": h.mean(), "hidden/std": h.std(), "hidden/norm": norms.mean(),
            "hidden/active_dims": jnp.mean(per_dim > 1e-2 * jnp.maximum(per_dim.mean(), 1e-12)),
            "hidden/mean_cosine": cos}


# --- vLLM backend: the host renders and calls the server --------------------------------------

class HostEncoder:
    """Host side of the vllm backend, called through `jax.experimental.io_callback`."""

    def __init__(self, cfg: LLMConfig, env_name: str, tokenizer, parts, hidden_size: int):
        from fused.text_format import get_layout
        from llm_jax.vllm_client import VLLMClient

        self.cfg = cfg
        self.layout = get_layout(env_name)
        self.tokenizer = tokenizer
        self.parts = parts
        self.client = VLLMClient(cfg.url, model=cfg.weights)
        self.client.health()
        self.hidden_size = hidden_size
        self.seconds = 0.0  # host time spent, for the time-share metric

    def encode_numpy(self, obs: np.ndarray) -> tuple[np.ndarray, np.int32]:
        t0 = time.perf_counter()
        prefix, tail = self.parts.prefix.tolist(), self.parts.tail.tolist()
        seqs, own = [], []
        for o in np.asarray(obs):
            ids = self.tokenizer.encode(render_text(self.layout, o)) + tail
            seqs.append(prefix + ids)
            own.append(len(ids))
        states = self.client.token_states(seqs)
        if self.cfg.pool == "last":
            out = np.stack([s[-1] for s in states])
        else:
            out = np.stack([s[-k:].mean(0) for s, k in zip(states, own)])
        self.seconds += time.perf_counter() - t0
        return out.astype(np.float32), np.int32(sum(own))

    def callback(self, obs):
        from jax.experimental import io_callback

        shapes = (jax.ShapeDtypeStruct((obs.shape[0], self.hidden_size), jnp.float32),
                  jax.ShapeDtypeStruct((), jnp.int32))
        return io_callback(self.encode_numpy, shapes, obs, ordered=True)
