"""The vllm backend: the prior architecture done right. The jitted chunk hands observations to
the host through `io_callback`; the host renders text with the reference renderer, tokenizes,
and asks a vLLM server for post-norm per-token states of the same prompt the jax encoders
build (`fused.llm.text_encoder.text_prompt`)."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from fused.llm.config import LLMConfig
from fused.llm.encoder import Encoded
from fused.llm.text_encoder import ALL_ABLATIONS, ReadsText, TextPrompt, text_prompt
from fused.text.buckets import encode_buckets
from fused.text.format import render_text
from llm_jax.vllm_client import VLLMClient


class HostEncoder(ReadsText):
    """States from a vLLM server serving the model's last layer, post-norm."""

    backend = "vllm"
    post_norm = True
    activation_room = None
    draws = False
    load_shape = None
    ablations = ALL_ABLATIONS
    frozen = None  # (nothing on the device: the server holds the weights)

    def __init__(self, cfg: LLMConfig, prompt: TextPrompt, seed: int = 0):
        self.cfg, self.seed = cfg, seed
        self.qcfg, self.layer = prompt.qcfg, prompt.qcfg.num_layers
        self.renderer, self.tokenizer = prompt.renderer, prompt.tokenizer
        self.layout, self.offset = prompt.renderer.layout, prompt.renderer.offset
        self.prefix_ids, self.tail = prompt.prefix_ids, prompt.tail
        self.hidden_size = prompt.qcfg.hidden_size
        self.dtype = cfg.compute_dtype
        self.buckets = encode_buckets(prompt.total)
        self.client = VLLMClient(cfg.url, model=cfg.weights)
        self.client.health()
        self.seconds = 0.0  # host time spent

    @classmethod
    def create(cls, cfg: LLMConfig, env_name: str, seed: int = 0, like=None) -> "HostEncoder":
        return cls(cfg, text_prompt(cfg, env_name, seed), seed)

    def encode_numpy(self, obs: np.ndarray) -> tuple[np.ndarray, np.int32]:
        """obs [B, D] -> (hidden [B, H] float32, observation + tail tokens encoded)."""
        t0 = time.perf_counter()
        prefix, tail = self.prefix_ids.tolist(), self.tail.tolist()
        seqs, own = [], []
        for o in np.asarray(obs):
            ids = self.tokenizer.encode(render_text(self.layout, o[self.offset:])) + tail
            seqs.append(prefix + ids)
            own.append(len(ids))
        states = self.client.token_states(seqs)
        if self.cfg.pool == "last":
            out = np.stack([s[-1] for s in states])
        else:
            out = np.stack([s[-k:].mean(0) for s, k in zip(states, own)])
        self.seconds += time.perf_counter() - t0
        return out.astype(np.float32), np.int32(sum(own))

    def encode(self, frozen, obs, microbatch: int | None = None, keys=None) -> Encoded:
        shapes = (jax.ShapeDtypeStruct((obs.shape[0], self.hidden_size), jnp.float32),
                  jax.ShapeDtypeStruct((), jnp.int32))
        return Encoded(*io_callback(self.encode_numpy, shapes, obs, ordered=True))

    def shuffle(self, frozen, hidden, key):
        if self.cfg.hidden != "shuffle":  # (a setting of the host's config, fixed when built)
            return hidden
        return hidden[jax.random.permutation(key, hidden.shape[0])]

    def call_seconds(self, obs, microbatch: int) -> None:
        return None  # (its host time is its own to count: `seconds`)
