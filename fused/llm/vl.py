"""A Qwen3-VL's states of game frames, on the device: for `label.py label --llm.weights VL_DIR`
on a pixel dataset (`VLLabeller`) and for policies that read them as they act (`train.py`,
`offline.py eval`, `label.py generate` on pixel envs with a VL model; `fused.llm.encoder`).

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
prefix's states included. It is off by default: slower on CPU, as measured.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fused.envspec import spec
from fused.errors import ConfigError
from fused.llm.config import LLMConfig, tokenizer_of

VL_INSTRUCTION = ("This is a frame of {game}, a 2D open-world survival game seen from above, "
                  "the inventory below the map. Think about what matters most in this "
                  "situation, then name the single best next action.")


def is_vl_folder(weights: str | None) -> bool:
    """Whether --llm.weights names a Qwen3-VL checkpoint (its config.json has a vision part)."""
    from fused.llm.config import ModelConfig, is_vl

    return is_vl(ModelConfig(weights=weights))


class VLEncoder:
    """A Qwen3-VL's pooled states of an env's frames: `fn(params, frames [M, H * W * 3] in
    [0, 1], the frame first in each row) -> [M, H_text] float32`, for calls of `rows` frames
    (the memory check counts that many). `params` holds the vision tower and the text model's
    first `layer` layers (every layer with imagination: `imagine(params, frames, keys)`
    generates up to `imagine.tokens` tokens after each frame's prompt and pools their states,
    as the text path's imagination does)."""

    def __init__(self, m: LLMConfig, env_name: str, rows: int, params: dict | None = None,
                 prefix_cache: bool = False):
        from llm_jax.loader import resolve_folder
        from llm_jax.memory import MemoryFitError, check_fits, fixes, generation_need, itemsize
        from llm_jax.vision import preprocess
        from llm_jax.vl import VLConfig, image_prompt_ids, load_vl_params, rope_index

        s = spec(env_name)
        folder = resolve_folder(m.weights)
        cfg = VLConfig.from_folder(folder)
        self.cfg, self.m, self.image = cfg, m, s.image
        self.layer = cfg.text.num_layers if m.layer is None else m.layer
        dtype = self.dtype = m.compute_dtype
        h, w, _ = s.image
        _, grid = preprocess(jnp.zeros((1, h, w, 3), jnp.uint8), cfg.processor)
        per_image = int(np.prod(grid)) // cfg.vision.spatial_merge_size ** 2
        tok = tokenizer_of(m.weights)
        self.tokenizer = tok
        im = m.imagine
        text = (Path(im.prompt).expanduser().read_text().strip() if im.tokens and im.prompt
                else VL_INSTRUCTION.format(game=s.title))
        try:
            ids = image_prompt_ids(tok, folder, cfg, 1, text, True,
                                   bool(im.tokens and im.thinking), per_image)
        except ValueError as e:
            raise ConfigError(f"llm.weights={m.weights!r}: {e}") from None
        self.ids, self.grid, self.per_image = ids, tuple(int(g) for g in grid), per_image
        self.positions, self.deltas = rope_index(ids[None], np.array([ids.size]), cfg,
                                                 self.grid, 1)
        # with `prefix_cache`, the text before the image (the chat turn's start) is computed
        # once a call and the rows continue it. Off: measured 2-9% slower on CPU (4 of 122
        # tokens saved, but the rows' attention then runs row by row; bench numbers in
        # bench/vl_prefix_cache.py), not yet measured on a GPU
        self.prefix_len = int(np.argmax(ids == cfg.image_token_id)) if prefix_cache else 0
        self.instruction = text
        computed = cfg.text.num_layers if im.tokens else self.layer  # generating: every layer
        need = generation_need(cfg.text, dtype, computed, rows, ids.size, im.tokens, 0)
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
        if params is None:  # (given: another encoder's of the same model, layer and dtype)
            from llm_jax.loader import WeightsError

            # layers past the state's are never computed, nor logits: never read (the memory
            # check counted only the computed ones)
            try:
                _, params = load_vl_params(folder, jnp.dtype(dtype),
                                           None if im.tokens else self.layer)
            except WeightsError as e:
                raise ConfigError(f"llm.weights={m.weights!r}: {e}") from None
            if not im.tokens:
                params["text"].pop("lm_head", None)
        self.params = params
        self.stop_ids, self.sampling = (), None
        if im.tokens:
            from fused.llm.config import sampling_of
            from llm_jax.tokenizer import stop_ids

            self.stop_ids = stop_ids(folder, tok, cfg.text.vocab_size, chat=True)
            self.sampling = sampling_of(im, m, "--llm.imagine.")
        self.hidden_size = cfg.text.hidden_size

    @property
    def row_tokens(self) -> int:
        """Tokens each frame's row computes: the prompt after the shared prefix."""
        return int(self.ids.size) - self.prefix_len

    def _rows(self, frames):
        """(pixels, tokens, lengths, positions) of a batch of frames' prompts after the
        prefix."""
        from llm_jax.vision import preprocess

        h, w, _ = self.image
        n, p = frames.shape[0], self.prefix_len
        u8 = jnp.round(jnp.clip(frames[:, :h * w * 3], 0.0, 1.0) * 255.0).astype(jnp.uint8)
        pixels, _ = preprocess(u8.reshape(n, h, w, 3), self.cfg.processor)
        return (pixels, jnp.asarray(np.repeat(self.ids[None, p:], n, 0)),
                jnp.full(n, self.row_tokens, jnp.int32),
                jnp.asarray(np.repeat(self.positions[:, :, p:], n, 1)))

    def _prefix(self, params, layers: int):
        """(cache, states [P, H]) of the prompt's text before the image, or (None, None)."""
        from llm_jax.vl import vl_prefill

        if not self.prefix_len:
            return None, None
        return vl_prefill(params["text"], self.cfg, self.ids[:self.prefix_len], layers)

    def fn(self, params, frames):
        from llm_jax.vl import pool_states, vl_hidden_states

        pixels, tokens, lengths, positions = self._rows(frames)
        cache, before = self._prefix(params, self.layer)
        x = vl_hidden_states(params, self.cfg, tokens, lengths, self.layer, pixels, self.grid,
                             positions, cache).x
        if cache is not None:  # pooled over the whole prompt, the prefix's states included
            n, p = frames.shape[0], self.prefix_len
            x = jnp.concatenate([jnp.broadcast_to(before, (n, *before.shape)), x], axis=1)
            tokens = jnp.asarray(np.repeat(self.ids[None], n, 0))
            lengths = lengths + p
        return pool_states(params["text"], self.cfg, x, tokens, lengths, self.m.pool,
                           self.m.post_norm).astype(jnp.float32)

    def imagine(self, params, frames, keys):
        """(pooled states [M, H] float32 of the tokens generated after each frame's prompt,
        the tokens [M, N] (the pad id past the end), their counts [M]); `keys` [M]: each row's
        draws (sampled imagination)."""
        from fused.llm.config import pool_every
        from llm_jax.decode import pool_generated
        from llm_jax.vl import vl_generate

        im = self.m.imagine
        pixels, tokens, lengths, positions = self._rows(frames)
        deltas = jnp.asarray(np.repeat(self.deltas, frames.shape[0]))
        cache, _ = self._prefix(params, self.cfg.text.num_layers)  # decoding reads every layer
        out = vl_generate(params, self.cfg, tokens, lengths, pixels, self.grid, positions,
                          deltas, None, prefix=cache, max_new_tokens=im.tokens,
                          pad_id=self.tokenizer.pad_id, sampling=self.sampling.sampling,
                          stop_ids=self.stop_ids, hidden_layer=self.layer,
                          post_norm=self.m.post_norm, row_keys=keys)
        every = None if im.pool == "last" else pool_every(im.pool)
        return pool_generated(out.hidden, out.num_tokens, every), out.tokens, out.num_tokens


class VLLabeller(VLEncoder):
    """Frames [M, H * W * 3] (as the dataset codec decodes them, k / 255) -> pooled states
    [M, H_text] float32, in jitted batches of `batch` frames (the last one padded)."""

    def __init__(self, m: LLMConfig, env_name: str, batch: int):
        super().__init__(m, env_name, batch)
        self.batch = batch
        self.encode = jax.jit(self.fn)
        self.generate = jax.jit(self.imagine) if m.imagine.tokens else None

    def __call__(self, obs: np.ndarray, keys: np.ndarray):
        """As `fused.data.labelling.BatchEncoder`: (hidden [M, H], tokens encoded (prompts and
        generated), (generated tokens [M, N], their counts [M]))."""
        out, gen, num = [], [], []
        n_new = self.m.imagine.tokens
        from fused.llm.batching import padded_batches
        from fused.runs.interrupts import stop_if_interrupted

        for chunk, k, n in padded_batches(obs, keys, self.batch):
            stop_if_interrupted()
            if self.generate is None:
                out.append(np.asarray(self.encode(self.params, jnp.asarray(chunk)))[:n])
                continue
            h, g, c = self.generate(self.params, jnp.asarray(chunk), jnp.asarray(k))
            out.append(np.asarray(h)[:n])
            gen.append(np.asarray(g)[:n])
            num.append(np.asarray(c)[:n])
        hidden = np.concatenate(out) if out else np.zeros((0, self.hidden_size), np.float32)
        tokens = -(-len(obs) // self.batch) * self.batch * self.row_tokens
        if self.generate is None:
            return hidden, tokens, (np.zeros((len(obs), 0), np.int32),
                                    np.zeros(len(obs), np.int32))
        gen = np.concatenate(gen) if gen else np.zeros((0, n_new), np.int32)
        num = np.concatenate(num) if num else np.zeros(0, np.int32)
        return hidden, tokens + int(num.sum()), (gen, num)

    def card(self, c, seed: int) -> dict:
        """The label set's card entry."""
        from fused.llm.digests import folder_digest
        from fused.runs.config_io import to_dict

        m = self.m
        entry = {"llm": to_dict(m), "backend": "jax", "vision": {
            "grid": list(self.grid), "image_tokens": self.per_image,
            "instruction": VL_INSTRUCTION}, "weights_digest": folder_digest(m.weights, "",
                                                                            seed),
                 "model": dict(self.cfg.text.__dict__), "layer": self.layer, "pool": m.pooled,
                 "post_norm": m.post_norm,
                 "prompt_digest": hashlib.sha256(self.ids.tobytes()).hexdigest(),
                 "prompt_tokens": int(self.ids.size), "skip_n": m.skip_n, "dtype": c.dtype,
                 "compute_dtype": self.dtype, "hidden": m.hidden}
        if m.imagine.tokens:
            entry["imagine"] = dict(to_dict(c.imagine), sampling=self.sampling.record())
            entry["vision"]["instruction"] = self.instruction
        return json.loads(json.dumps(entry))

