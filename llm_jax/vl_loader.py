"""Qwen3-VL model folder (config.json, preprocessor_config.json, safetensors) -> (config,
`VLWeights`), host-only: every tensor's name and shape checked first (the text model's from
`llm_jax.weights`' description under `model.language_model.`, the tower's from
`llm_jax.vl_weights`'), all problems in one line; a VL-MoE checkpoint's stacked expert tensors
read through `stacked_experts`. `random_vl_params` makes weights of a config's shape instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from llm_jax.config import Qwen3Config
from llm_jax.loader import (TensorReader, WeightsError, check_tensors, expected_tensors,
                            model_kind, read_params, resolve_folder)
from llm_jax.vl_config import VLConfig
from llm_jax.vl_weights import VLWeights, read_vision_params, vision_tensors
from llm_jax.weights import random_params


def text_name(name: str) -> str:
    """Our text table's HF name -> its name inside a Qwen3-VL checkpoint."""
    return "model.language_model." + name[len("model."):] if name.startswith("model.") else name


def load_vl_params(folder: str | Path, dtype=jnp.float32, layers: int | None = None
                   ) -> tuple[VLConfig, VLWeights]:
    """(config, weights: the text model's and the vision tower's) of a Qwen3-VL folder; every
    tensor's name and shape checked first, all problems in one line. With `layers`, only the
    text model's first `layers` layers are read (`first_layers` of the whole)."""
    folder = resolve_folder(folder)
    if not folder.is_dir():
        raise WeightsError(f"{folder} is not a folder; pass a HuggingFace Qwen3-VL model folder")
    cfg = VLConfig.from_folder(folder)
    reader = TensorReader(folder)
    expected = {text_name(n): s for n, s in expected_tensors(cfg.text).items()}
    read = reader.read
    if cfg.text.is_moe:
        expected, read = stacked_experts(reader, cfg.text, expected)
    expected.update(vision_tensors(cfg.vision))
    check_tensors(folder, reader, expected, "a Qwen3-VL " + model_kind(cfg.text),
                  ignored=("lm_head.weight",))
    text = read_params(lambda n: read(text_name(n)), cfg.text, dtype, layers)
    return cfg, VLWeights(text, read_vision_params(reader.read, cfg.vision, dtype))


PER_EXPERT = re.compile(r"^(model\.language_model\.layers\.\d+\.mlp\.experts)\.(\d+)\."
                        r"(gate|up|down)_proj\.weight$")


def stacked_experts(reader: TensorReader, cfg: Qwen3Config, expected: dict):
    """A Qwen3-VL-MoE checkpoint stacks each sparse layer's experts in two tensors,
    `mlp.experts.gate_up_proj` and `down_proj`: [E, H, 2F] (gate, then up; x @ W) and [E, F, H]
    as released, or their transposes [E, 2F, H], [E, H, F] as transformers 5's save_pretrained
    writes them. Told apart by shape as HF's loader does (the transposed layout where both
    fit: a square tensor is taken as it is). Returns `expected` with the per-expert names of
    `llm_jax.weights` replaced by the stacked tensors (in the layout the file has) and a reader
    serving each per-expert HF Linear weight from them (one stacked tensor held at a time)."""
    e, h, f = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    released = {"gate_up_proj": (e, h, 2 * f), "down_proj": (e, f, h)}
    out, transposed = {}, {}
    for name, shape in expected.items():
        m = PER_EXPERT.match(name)
        if not m:
            out[name] = shape
            continue
        for proj, want in released.items():
            full = f"{m.group(1)}.{proj}"
            if full in out:
                continue
            saved = (want[0], want[2], want[1])
            transposed[full] = full in reader.files and reader.shape(full) == saved
            out[full] = saved if transposed[full] else want
    held: dict[str, np.ndarray] = {}

    def read(name: str) -> np.ndarray:
        m = PER_EXPERT.match(name)
        if not m:
            return reader.read(name)
        full = f"{m.group(1)}.{'down_proj' if m.group(3) == 'down' else 'gate_up_proj'}"
        if full not in held:
            held.clear()
            w = reader.read(full)
            held[full] = w.transpose(0, 2, 1) if transposed[full] else w
        w = held[full][int(m.group(2))]  # [H, 2F] or [F, H]: x @ w
        return {"gate": w[:, :f], "up": w[:, f:], "down": w}[m.group(3)].T  # [out, in]

    return out, read


def random_vl_params(cfg: VLConfig, seed: int = 0, dtype=jnp.float32,
                     layers: int | None = None) -> VLWeights:
    """Random weights of `cfg`'s shape (normal, std 0.02; LayerNorms 1 and 0; biases 0), the
    text model's first `layers` layers: for speed figures of a released shape without its
    checkpoint (outputs mean nothing)."""
    rng = np.random.default_rng(seed)
    shapes = vision_tensors(cfg.vision)

    def read(name):
        if name.endswith("bias"):
            return np.zeros(shapes[name], np.float32)
        if name.endswith("norm.weight") or ".norm1." in name or ".norm2." in name:
            return np.ones(shapes[name], np.float32)
        return rng.standard_normal(shapes[name], np.float32) * 0.02

    text = random_params(cfg.text, jax.random.PRNGKey(seed), dtype, layers)
    return VLWeights(text, read_vision_params(read, cfg.vision, dtype))
