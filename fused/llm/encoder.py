"""What every model that reads the game gives the rest of the code: one interface.

An `Encoder` turns a batch of observations into hidden states [B, H] inside jitted code (or
through a host callback). The policy input (`fused.llm.policy_input`), labelling
(`fused.data.labelling`), evaluation and the probes call only what is declared here; which
implementation they hold (text against a cached prompt prefix, text with imagination, a
Qwen3-VL on frames, the vLLM host, or one a user registers) is chosen once, by
`fused.llm.encoders.make_encoder`, and never asked again.

An implementation comes with its `EncoderKind`: the checks of its settings before anything is
built, and its construction (weights or a random model, the memory check, one-line errors).
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from fused.llm.batching import Batching
from fused.llm.config import LLMConfig


class Encoded(NamedTuple):
    """One call's result. Fields an encoder does not produce are None."""

    hidden: jax.Array  # [B, H] float32
    tokens: jax.Array  # [] tokens computed (prompts after any shared prefix, and generated)
    load: jax.Array | None = None  # [L_sparse, E] tokens routed to each expert (`load_shape`)
    generated: jax.Array | None = None  # [B, N] int32 tokens generated (imagination)
    num_generated: jax.Array | None = None  # [B] int32


class Encoder(Protocol):
    """A model that reads observations. Attributes are static (host) values; `frozen` holds the
    device arrays its `encode` reads, passed to jitted code as an argument (never closed over,
    never trained or checkpointed)."""

    cfg: LLMConfig
    hidden_size: int
    layer: int
    """The layer whose residual stream is read (HF convention: 0 = embeddings)."""
    frozen: Any
    tokenizer: Any
    """Decodes generated tokens (None where nothing is generated)."""
    draws: bool
    """`encode` draws random numbers: it needs one key per row."""
    load_shape: tuple[int, int] | None
    """[L_sparse, E] of the router load `encode` reports (mixture-of-experts models), or None."""
    ablations: tuple[str, ...]
    """The `--llm.hidden` settings it serves (`real` always)."""

    def encode(self, frozen, obs: jax.Array, microbatch: int | None = None,
               keys: jax.Array | None = None) -> Encoded:
        """Hidden states of obs [B, D] (jittable): rows in micro-batches of `microbatch` (a
        divisor of B; None: all at once); `keys` [B]: each row's draws, where `draws`."""

    def shuffle(self, frozen, hidden: jax.Array, key: jax.Array) -> jax.Array:
        """`--llm.hidden shuffle`: hidden [B, H] with its rows permuted by `key`; unchanged
        under any other setting."""

    def batching(self, local_envs: int, platform: str | None = None) -> Batching:
        """Call sizes for `local_envs` envs on this process's device (`fused.llm.batching`), the
        config's explicit --llm.microbatch / --llm.refresh-batch taking precedence."""

    def identity(self) -> dict:
        """What names its states: weights and prompt digests, layer, pool, post_norm. A label
        set records it; evaluating a policy trained on that set checks it."""

    def card(self, label_dtype: str, imagine: dict | None = None) -> dict:
        """A label set's card entry for states stored as `label_dtype` (`imagine`: the label
        command's imagination settings, recorded by encoders that imagine), as card.json gives
        it back (JSON types)."""

    def call_seconds(self, obs: jax.Array, microbatch: int) -> float | None:
        """Seconds of one call over obs [N, D] on the device (timed after a warm-up), or None
        where the encoder times its own calls."""


class EncoderKind(Protocol):
    """How one implementation is checked and built."""

    name: str
    """Its `--llm.encoder` name."""
    reads_frames: bool
    """It reads a pixel env's frames itself (else a pixel env also observes its text twin)."""

    def accepts(self, cfg: LLMConfig) -> bool:
        """Whether `--llm.encoder auto` picks it for `cfg` (kinds are asked in their order)."""

    def validate(self, cfg: LLMConfig, env_name: str, local_envs: int, num_devices: int,
                 online: bool) -> None:
        """ConfigError (one line) unless `cfg` can work on `env_name` with `local_envs` envs a
        device; nothing is loaded. `online`: a policy acts on the states (else a label set is
        made of them)."""

    def hidden_size(self, cfg: LLMConfig) -> int:
        """The width of its states, from the config alone."""

    def build(self, cfg: LLMConfig, env_name: str, seed: int = 0,
              like: Encoder | None = None) -> Encoder:
        """The encoder (host setup: weights, tokenizer, prompt, caches). `seed`: a random
        model's weights. `like`: an encoder of the same model already built (an ablation):
        its weights are shared rather than loaded again where they are the same."""


class OnDevice:
    """What encoders whose calls run on the device share: `--llm.hidden shuffle` as a flag among
    their frozen arrays (`frozen.shuffle`: data, so real and shuffled runs share one program),
    and a call timed by running it."""

    def shuffle(self, frozen, hidden: jax.Array, key: jax.Array) -> jax.Array:
        return jnp.where(frozen.shuffle, hidden[jax.random.permutation(key, hidden.shape[0])],
                         hidden)

    def call_seconds(self, obs, microbatch: int) -> float:
        obs = jax.device_get(obs)
        keys = jax.random.split(jax.random.PRNGKey(0), obs.shape[0])  # (imagination's draws)
        f = jax.jit(lambda o, fr: self.encode(fr, o, microbatch, keys).hidden)
        jax.block_until_ready(f(obs, self.frozen))
        t = time.perf_counter()
        jax.block_until_ready(f(obs, self.frozen))
        return time.perf_counter() - t
