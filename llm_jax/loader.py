"""HF model folder (config.json + safetensors, single or sharded) -> (config, params).

Host-only: reads with safetensors' numpy backend (memory-mapped), converts each tensor as
`model.WEIGHTS` says (lm_head for untied models only), stacks layers, casts, and only then puts arrays on the device. No random
init, no pickle, no network. Every missing, unexpected or mis-shaped tensor is reported at once.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from llm_jax.config import Qwen3Config
from llm_jax.model import IGNORED, LAYER_WEIGHTS, present_weights


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


def expected_tensors(cfg: Qwen3Config) -> dict[str, tuple[int, ...]]:
    out = {n: shape for s in present_weights(cfg).values()
           for n, shape in zip(s.hf_names, s.hf_shapes(cfg))}
    for i in range(cfg.num_layers):
        out.update({n.format(i=i): shape for s in LAYER_WEIGHTS.values()
                    for n, shape in zip(s.hf_names, s.hf_shapes(cfg))})
    return out


def load_params(folder: str | Path, dtype=jnp.float32) -> tuple[Qwen3Config, dict]:
    folder = resolve_folder(folder)
    if not folder.is_dir():
        raise WeightsError(f"{folder} is not a folder; pass a HuggingFace Qwen3 model folder or "
                           "hub id")
    cfg = Qwen3Config.from_folder(folder)
    check_weights(folder)
    files = _tensor_files(folder)
    expected = expected_tensors(cfg)
    handles: dict[Path, object] = {}

    def handle(name):
        path = files[name]
        if path not in handles:
            handles[path] = safe_open(path, framework="numpy")
        return handles[path]

    def shape_of(name):
        return tuple(handle(name).get_slice(name).get_shape())

    missing = sorted(set(expected) - set(files))
    unexpected = sorted(n for n in set(files) - set(expected) if n not in IGNORED)
    wrong = [f"{n}: {shape_of(n)} != {s}" for n, s in expected.items()
             if n in files and shape_of(n) != s]
    if missing or unexpected or wrong:
        if any(re.match(r"model\.layers\.\d+\.mlp\.experts", n) for n in unexpected):
            raise WeightsError(f"{folder} holds a mixture-of-experts model, not Qwen3 dense")
        parts = [f"{len(missing)} missing: {missing[:8]}" if missing else "",
                 f"{len(unexpected)} unexpected: {unexpected[:8]}" if unexpected else "",
                 f"{len(wrong)} mis-shaped: {wrong[:8]}" if wrong else ""]
        raise WeightsError(f"{folder} does not match its config.json ("
                           + "; ".join(p for p in parts if p) + "); is it a Qwen3 checkpoint?")

    def convert(spec, i=None):
        names = [n.format(i=i) for n in spec.hf_names]
        return spec.convert([handle(n).get_tensor(n) for n in names], cfg).astype(dtype)

    params = {k: jnp.asarray(convert(s)) for k, s in present_weights(cfg).items()}
    params["layers"] = {
        k: jnp.asarray(np.stack([convert(s, i) for i in range(cfg.num_layers)]))
        for k, s in LAYER_WEIGHTS.items()}
    return cfg, params
