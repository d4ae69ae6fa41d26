"""The vllm backend's host side: the prior architecture done right. The jitted chunk hands
observations to the host through `io_callback`; the host renders text with the reference
renderer, tokenizes, and asks a vLLM server for post-norm per-token states."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from fused.llm.config import LLMConfig
from fused.envspec import ObsLayout
from fused.text.format import render_text
from llm_jax.vllm_client import VLLMClient


class HostEncoder:
    """Called through `io_callback` from `fused.llm.encoder.encode_observations`."""

    def __init__(self, cfg: LLMConfig, layout: ObsLayout, tokenizer, prefix: np.ndarray,
                 tail: np.ndarray, hidden_size: int, offset: int = 0):
        self.cfg = cfg
        self.layout, self.offset = layout, offset  # the symbolic part: obs[offset:]
        self.tokenizer = tokenizer
        self.prefix, self.tail = prefix.tolist(), tail.tolist()
        self.client = VLLMClient(cfg.url, model=cfg.weights)
        self.client.health()
        self.hidden_size = hidden_size
        self.seconds = 0.0  # host time spent, for the time-share metric

    def encode_numpy(self, obs: np.ndarray) -> tuple[np.ndarray, np.int32]:
        """obs [B, D] -> (hidden [B, H] float32, observation + tail tokens encoded)."""
        t0 = time.perf_counter()
        seqs, own = [], []
        for o in np.asarray(obs):
            ids = self.tokenizer.encode(render_text(self.layout, o[self.offset:])) + self.tail
            seqs.append(self.prefix + ids)
            own.append(len(ids))
        states = self.client.token_states(seqs)
        if self.cfg.pool == "last":
            out = np.stack([s[-1] for s in states])
        else:
            out = np.stack([s[-k:].mean(0) for s, k in zip(states, own)])
        self.seconds += time.perf_counter() - t0
        return out.astype(np.float32), np.int32(sum(own))

    def callback(self, obs):
        shapes = (jax.ShapeDtypeStruct((obs.shape[0], self.hidden_size), jnp.float32),
                  jax.ShapeDtypeStruct((), jnp.int32))
        return io_callback(self.encode_numpy, shapes, obs, ordered=True)
