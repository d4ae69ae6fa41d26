"""Labels of frames by a Qwen3-VL: `label.py label --llm.weights VL_DIR` on a pixel dataset.

Each labelled row's frame (stored uint8) is preprocessed on the device (`llm_jax.vision`: HF's
processor, Pillow's bicubic bit for bit), put in a user turn of the model's chat template before
a short instruction (`VL_INSTRUCTION`), and the residual stream after `--llm.layer` is pooled:
`last` / `mean` as for text, or over the image tokens, `image-mean` or `every:K` (the prior
system's every:8 of the last layer). Every frame of a dataset has one size, so every row's
prompt has the same tokens and M-RoPE positions (computed once on the host); one jitted
function takes a batch of frames to pooled states. The label set is a label set like any
other (shards resumable, verified, its card entry naming the weights, prompt and pooling).
"""

from __future__ import annotations

import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np

from fused.envspec import spec
from fused.errors import ConfigError
from fused.llm.config import LLMConfig

VL_INSTRUCTION = ("This is a frame of {game}, a 2D open-world survival game seen from above, "
                  "the inventory below the map. Think about what matters most in this "
                  "situation, then name the single best next action.")


def is_vl_folder(weights: str | None) -> bool:
    """Whether --llm.weights names a Qwen3-VL checkpoint (its config.json has a vision part)."""
    from fused.llm.config import ModelConfig, is_vl

    return is_vl(ModelConfig(weights=weights))


def validate_vl(m: LLMConfig, env_name: str) -> None:
    """--llm.* for labelling frames with a VL model, checked before anything is loaded."""
    from llm_jax.loader import WeightsError, resolve_folder
    from llm_jax.vision import VisionConfigError
    from llm_jax.vl import VLConfig, image_pool_every

    if not spec(env_name).is_pixels:
        raise ConfigError(f"llm.weights={m.weights!r} is a vision-language model: it labels "
                          f"frames, and this dataset holds {env_name} (use a text Qwen3)")
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
        raise ConfigError("llm.imagine with a vision-language model: not built yet (prompt "
                          "states only)")
    if m.hidden != "real" or m.active_backend != "jax":
        raise ConfigError("a vision-language model labels with --llm.hidden real on the jax "
                          "backend")


class VLLabeller:
    """Frames [M, H * W * 3] (as the dataset codec decodes them, k / 255) -> pooled states
    [M, H_text] float32, in jitted batches of `batch` frames (the last one padded)."""

    def __init__(self, m: LLMConfig, env_name: str, batch: int):
        from llm_jax.loader import resolve_folder
        from llm_jax.memory import MemoryFitError, check_fits, fixes, generation_need, itemsize
        from llm_jax.tokenizer import load_tokenizer
        from llm_jax.vision import preprocess
        from llm_jax.vl import (VLConfig, image_prompt_ids, load_vl_params, pool_states,
                                rope_index, vl_hidden_states)

        s = spec(env_name)
        folder = resolve_folder(m.weights)
        cfg = VLConfig.from_folder(folder)
        self.cfg, self.m, self.batch, self.image = cfg, m, batch, s.image
        self.layer = cfg.text.num_layers if m.layer is None else m.layer
        dtype = self.dtype = m.compute_dtype
        h, w, _ = s.image
        _, grid = preprocess(jnp.zeros((1, h, w, 3), jnp.uint8), cfg.processor)
        per_image = int(np.prod(grid)) // cfg.vision.spatial_merge_size ** 2
        tok = load_tokenizer(m.weights)
        self.tokenizer = tok
        text = VL_INSTRUCTION.format(game=s.title)
        try:
            ids = image_prompt_ids(tok, folder, cfg, 1, text, True, False, per_image)
        except ValueError as e:
            raise ConfigError(f"llm.weights={m.weights!r}: {e}") from None
        self.ids, self.grid, self.per_image = ids, tuple(int(g) for g in grid), per_image
        pos, _ = rope_index(ids[None], np.array([ids.size]), cfg, self.grid, 1)
        need = generation_need(cfg.text, dtype, self.layer, batch, ids.size, 0, 0)
        v = cfg.vision
        patches = per_image * v.spatial_merge_size ** 2
        need["vision weights"] = v.num_params() * itemsize(dtype)
        need["vision activations"] = batch * (
            patches * (v.hidden_size * 4 + v.intermediate_size) * itemsize(dtype)
            + v.num_heads * patches ** 2 * 4)
        try:
            check_fits(need, fixes(dtype, "--llm.dtype", "--llm.layer", "--batch"))
        except MemoryFitError as e:
            raise ConfigError(f"llm.weights={m.weights!r} ({dtype}): {e}") from None
        _, self.params = load_vl_params(folder, jnp.dtype(dtype))
        tokens = jnp.asarray(np.repeat(ids[None], batch, 0))
        lengths = jnp.full(batch, ids.size, jnp.int32)
        positions = jnp.asarray(np.repeat(pos, batch, 1))
        layer, grid_ = self.layer, self.grid

        def encode(params, frames):
            u8 = jnp.round(jnp.clip(frames, 0.0, 1.0) * 255.0).astype(jnp.uint8)
            pixels, _ = preprocess(u8.reshape(frames.shape[0], h, w, 3), cfg.processor)
            x = vl_hidden_states(params, cfg, tokens, lengths, layer, pixels, grid_,
                                 positions).x
            return pool_states(params["text"], cfg, x, tokens, lengths, m.pool,
                               m.post_norm).astype(jnp.float32)

        self.fn = jax.jit(encode)
        self.hidden_size = cfg.text.hidden_size

    def __call__(self, obs: np.ndarray, keys: np.ndarray):
        """As `fused.data.labelling.BatchEncoder`: (hidden [M, H], tokens encoded, no
        imagination)."""
        out = []
        for s in range(0, len(obs), self.batch):
            chunk = obs[s:s + self.batch]
            n = len(chunk)
            if n < self.batch:
                chunk = np.concatenate([chunk, np.repeat(chunk[:1], self.batch - n, 0)])
            out.append(np.asarray(self.fn(self.params, jnp.asarray(chunk)))[:n])
        hidden = np.concatenate(out) if out else np.zeros((0, self.hidden_size), np.float32)
        tokens = -(-len(obs) // self.batch) * self.batch * self.ids.size
        return hidden, tokens, (np.zeros((len(obs), 0), np.int32), np.zeros(len(obs), np.int32))

    def card(self, c, seed: int) -> dict:
        """The label set's card entry."""
        from fused.llm.digests import folder_digest
        from fused.runs.config_io import to_dict

        m = self.m
        entry = {"llm": to_dict(m), "backend": "jax", "vision": {
            "grid": list(self.grid), "image_tokens": self.per_image,
            "instruction": VL_INSTRUCTION}, "weights_digest": folder_digest(m.weights, "",
                                                                            seed),
                 "model": dict(self.cfg.text.__dict__), "layer": self.layer, "pool": m.pool,
                 "post_norm": m.post_norm,
                 "prompt_digest": hashlib.sha256(self.ids.tobytes()).hexdigest(),
                 "prompt_tokens": int(self.ids.size), "skip_n": m.skip_n, "dtype": c.dtype,
                 "compute_dtype": self.dtype, "hidden": m.hidden}
        return json.loads(json.dumps(entry))

