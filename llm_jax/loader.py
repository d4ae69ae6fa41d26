"""HF model folder (config.json + safetensors, single or sharded) -> (config, `Weights`).

Host-only: reads with safetensors' numpy backend (memory-mapped), converts each tensor as the
description of `llm_jax.weights` (`WEIGHTS`) says (lm_head for untied models only; a MoE
layer's experts one tensor per expert and projection, as HF writes them), stacks each layer
group, casts, and only then puts arrays on the device. No random init, no pickle, no network.
Every missing, unexpected or mis-shaped tensor is reported at once.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from llm_jax.config import Qwen3Config
from llm_jax.weights import (IGNORED, Layer, Stacked, Weights, WeightSpec, layer_groups,
                             present_weights)


class WeightsError(ValueError):
    """The folder's tensors do not match the Qwen3 architecture its config.json describes."""


def _tensor_files(folder: Path) -> dict[str, Path]:
    """Map tensor name -> file, from the shard index or the single file."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        missing = sorted({f for f in weight_map.values() if not (folder / f).is_file()})
        if missing:
            raise WeightsError(f"{index} names shard files that are absent: {missing}; "
                               "re-download the model")
        return {name: folder / f for name, f in weight_map.items()}
    single = folder / "model.safetensors"
    if single.is_file():
        with safe_open(single, framework="numpy") as f:
            return {name: single for name in f.keys()}
    found = sorted(p.name for p in folder.glob("*"))[:10]
    raise WeightsError(f"{folder} has no model.safetensors or model.safetensors.index.json "
                       f"(found {found}); pass a HuggingFace Qwen3 model folder")


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def resolve_folder(weights: str | Path) -> Path:
    """A model folder, or a Hugging Face hub id (`Qwen/Qwen3-4B`) resolved as every HF tool
    does: the snapshot in the local cache ($HF_HUB_CACHE / $HF_HOME), else downloaded where the
    network allows (not with HF_HUB_OFFLINE=1). WeightsError (one line) when neither works."""
    path = Path(weights).expanduser()
    if path.exists() or not HUB_ID.fullmatch(str(weights)):
        return path
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(str(weights), local_files_only=True))
    except Exception:  # noqa: BLE001 (not in the cache: try the network below)
        pass
    try:
        return Path(snapshot_download(str(weights), allow_patterns=[
            "*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"]))
    except Exception as e:  # noqa: BLE001 (offline, unknown id, gated: all end here)
        raise WeightsError(
            f"{weights} is neither a folder nor a model in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}), and it could not be downloaded "
            f"({type(e).__name__}); pass a model folder, or fetch it first where the network "
            f"allows (`hf download {weights}`)") from None


def check_weights(folder: Path) -> None:
    """WeightsError (one line) unless `folder` holds safetensors weights (single or sharded)."""
    if not ((folder / "model.safetensors").is_file()
            or (folder / "model.safetensors.index.json").is_file()):
        found = sorted(p.name for p in folder.glob("*"))[:10]
        raise WeightsError(f"{folder} has config.json but no model.safetensors or "
                           f"model.safetensors.index.json (found {found}); the weights are "
                           "missing: download them again")


def expected_tensors(cfg: Qwen3Config, layers: int | None = None) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of every tensor of a model of `cfg` cut after `layers` layers (default
    all): the top-level weights, then each layer's in its group (experts one per tensor)."""
    out = {n: shape for s in present_weights(cfg).values() for n, shape in s.names(cfg)}
    for desc, idx in layer_groups(cfg, layers).values():
        for i in idx:
            out.update({n: shape for s in jax.tree.leaves(desc) for n, shape in s.names(cfg, i)})
    return out


# Stacked expert tensors (one [E, ...] per layer), written by some tools instead of HF's
# per-expert tensors: named in the error so the fix is plain.
STACKED_EXPERTS = re.compile(r"layers\.\d+\.mlp\.experts\.(gate_up_proj|down_proj)")


class TensorReader:
    """The safetensors of a model folder (single or sharded), memory-mapped: names, shapes, and
    each tensor read as numpy on demand."""

    def __init__(self, folder: Path):
        check_weights(folder)
        self.files = _tensor_files(folder)
        self.handles: dict[Path, object] = {}

    def _handle(self, name):
        path = self.files[name]
        if path not in self.handles:
            self.handles[path] = safe_open(path, framework="numpy")
        return self.handles[path]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handle(name).get_slice(name).get_shape())

    def read(self, name: str) -> np.ndarray:
        return self._handle(name).get_tensor(name)


def check_tensors(folder: Path, reader: TensorReader, expected: dict[str, tuple[int, ...]],
                  kind: str, ignored: tuple[str, ...] = IGNORED) -> None:
    """WeightsError (one line) naming every missing, unexpected and mis-shaped tensor."""
    files = reader.files
    missing = sorted(set(expected) - set(files))
    unexpected = sorted(n for n in set(files) - set(expected) if n not in ignored)
    wrong = [f"{n}: {reader.shape(n)} != {s}" for n, s in expected.items()
             if n in files and reader.shape(n) != s]
    if missing or unexpected or wrong:
        parts = [f"{len(missing)} missing: {missing[:8]}" if missing else "",
                 f"{len(unexpected)} unexpected: {unexpected[:8]}" if unexpected else "",
                 f"{len(wrong)} mis-shaped: {wrong[:8]}" if wrong else ""]
        hint = ""
        if any(STACKED_EXPERTS.search(n) for n in unexpected):
            hint = ("; its experts are stacked tensors (mlp.experts.gate_up_proj / down_proj): "
                    "re-save it with transformers' save_pretrained, which writes HF's "
                    "per-expert tensors (mlp.experts.{j}.gate_proj.weight ...)")
        raise WeightsError(f"{folder} does not match its config.json, which describes {kind} ("
                           + "; ".join(p for p in parts if p) + ")" + hint)


def model_kind(cfg: Qwen3Config) -> str:
    return (f"a MoE model ({cfg.num_experts} experts, sparse layers "
            f"{[i for i, s in enumerate(cfg.sparse_layers) if s]})" if cfg.is_moe
            else "a dense model")


def load_params(folder: str | Path, dtype=jnp.float32, layers: int | None = None,
                per_layer: bool = False) -> tuple[Qwen3Config, Weights]:
    """(config, weights) of a model folder; with `layers`, only the first `layers` layers'
    tensors are read (`first_layers` of the whole; every tensor's name and shape is checked
    all the same). `per_layer`: the per-layer layout (`llm_jax.weights.per_layer`), each
    layer's arrays put on the device as read, never stacked."""
    folder = resolve_folder(folder)
    if not folder.is_dir():
        raise WeightsError(f"{folder} is not a folder; pass a HuggingFace Qwen3 model folder or "
                           "hub id")
    cfg = Qwen3Config.from_folder(folder)
    reader = TensorReader(folder)
    check_tensors(folder, reader, expected_tensors(cfg), model_kind(cfg))
    return cfg, read_params(reader.read, cfg, dtype, layers, per_layer)


def read_params(read, cfg: Qwen3Config, dtype=jnp.float32, layers: int | None = None,
                per_layer: bool = False) -> Weights:
    """The text model's weights from `read(HF name)` (names as `llm_jax.weights` gives them),
    as `load_params` lays them out."""
    top = {k: jnp.asarray(s.convert(read, cfg).astype(dtype))
           for k, s in present_weights(cfg).items()}
    groups = layer_groups(cfg, layers)
    if per_layer:
        blocks: dict[int, Layer] = {}
        for group, (desc, idx) in groups.items():
            for i in idx:
                arrays = jax.tree.map(lambda s: jnp.asarray(s.convert(read, cfg, i).astype(dtype)),
                                      desc)
                blocks[i] = arrays if group == "common" else blocks[i].replace(mlp=arrays)
        return Weights(layers=tuple(blocks[i] for i in sorted(blocks)), **top)

    def stack(s: WeightSpec, idx: tuple[int, ...]):
        # Filled layer by layer: the host holds one copy of the stack, not a list and a copy.
        out = np.empty((len(idx), *s.shape(cfg)), jnp.dtype(dtype))
        for n, i in enumerate(idx):
            out[n] = s.convert(read, cfg, i)
        return jnp.asarray(out)

    stacks = {group: jax.tree.map(lambda s, idx=idx: stack(s, idx), desc)
              for group, (desc, idx) in groups.items()}
    return Weights(layers=Stacked(**stacks), **top)
