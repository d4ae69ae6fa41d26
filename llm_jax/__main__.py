"""`python -m llm_jax encode|truncate ...`: hidden states of a text, or a layer-truncated copy of a
checkpoint (so a vLLM server's post-norm output equals our `layer=L, post_norm=True`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import tyro


@dataclasses.dataclass(frozen=True)
class Encode:
    weights: str
    """HuggingFace Qwen3 model folder."""
    out: str
    """Output .npz with `hidden` ([T, H] for pool none, else [H]) and `token_ids` [T]."""
    text: str | None = None
    """Text to encode."""
    text_file: str | None = None
    """Read the text from this file instead."""
    chat: bool = False
    """Wrap the text as a user message in the Qwen3 chat template (with generation prompt)."""
    enable_thinking: bool = False
    """With --chat: leave thinking on (off appends the empty <think></think> block)."""
    layer: int | None = None
    """Layer (HF convention: 0 = embeddings, i = after block i); default the last."""
    pool: Literal["none", "last", "mean"] = "last"
    """Pooling over positions."""
    post_norm: bool = False
    """Apply the final RMSNorm."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype."""
    attention: Literal["auto", "cudnn", "blocked", "row", "pallas"] = "auto"
    """Attention form (llm_jax.model.attention); pallas runs interpreted on CPU."""
    prefix_text_file: str | None = None
    """Encode this file's text first as a cached prefix (`prefill`), then the text after it
    (the layout of the LLM-augmented policy's prompt); the .npz then also holds `prefix_ids`."""


@dataclasses.dataclass(frozen=True)
class Truncate:
    weights: str
    """HuggingFace Qwen3 model folder."""
    layers: int
    """Keep the first L layers."""
    out: str
    """New model folder (config.json, model.safetensors, tokenizer files)."""


def run_encode(a: Encode) -> Path:
    if (a.text is None) == (a.text_file is None):
        raise SystemExit("error: give exactly one of --text or --text-file")
    text = a.text if a.text is not None else Path(a.text_file).read_text()
    import jax
    import jax.numpy as jnp

    from llm_jax.loader import load_params
    from llm_jax.model import AttentionConfig, encode, prefill
    from llm_jax.tokenizer import load_tokenizer

    cfg, params = load_params(a.weights, jnp.float32 if a.dtype == "float32" else jnp.bfloat16)
    layer = cfg.num_layers if a.layer is None else a.layer
    if not 0 <= layer <= cfg.num_layers:
        raise SystemExit(f"error: --layer {layer} must lie in 0..{cfg.num_layers}")
    tok = load_tokenizer(a.weights)
    if a.chat:
        text = tok.apply_chat_template([{"role": "user", "content": text}],
                                       enable_thinking=a.enable_thinking)
    ids = np.asarray(tok.encode(text), np.int32)
    if ids.size == 0:
        raise SystemExit("error: the text encodes to no tokens")
    if int(ids.max()) >= cfg.vocab_size:
        raise SystemExit(f"error: token id {int(ids.max())} >= the model's vocab_size "
                         f"{cfg.vocab_size}; tokenizer and weights do not belong together")
    attn = AttentionConfig(form=a.attention)
    extra = {}
    cache = None
    if a.prefix_text_file is not None:
        prefix_ids = np.asarray(tok.encode(Path(a.prefix_text_file).read_text()), np.int32)
        if prefix_ids.size == 0:
            raise SystemExit("error: --prefix-text-file encodes to no tokens")
        cache = jax.jit(lambda p, t: prefill(p, cfg, t, max(layer, 1), attn))(
            params, jnp.asarray(prefix_ids))
        extra["prefix_ids"] = prefix_ids
    fn = jax.jit(lambda p, t, n, c: encode(p, cfg, t, n, layer, a.pool, a.post_norm, c, attn))
    hidden = fn(params, jnp.asarray(ids)[None], jnp.array([ids.size]), cache)[0]
    out = Path(a.out)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez(tmp, hidden=np.asarray(hidden, np.float32), token_ids=ids, **extra)
    os.replace(tmp, out)
    print(f"{ids.size} tokens, layer {layer}, pool {a.pool}, hidden {tuple(hidden.shape)} -> {out}")
    return out


def run_truncate(a: Truncate) -> Path:
    from safetensors.numpy import save_file

    from llm_jax.loader import _tensor_files, load_params
    from llm_jax.model import LAYER_WEIGHTS, present_weights

    src, out = Path(a.weights), Path(a.out)
    cfg, _ = load_params(src)  # full validation before writing anything
    if not 1 <= a.layers <= cfg.num_layers:
        raise SystemExit(f"error: --layers {a.layers} must lie in 1..{cfg.num_layers}")
    from safetensors import safe_open

    files = _tensor_files(src)
    keep = [n for s in present_weights(cfg).values() for n in s.hf_names] + [
        n.format(i=i) for i in range(a.layers) for s in LAYER_WEIGHTS.values() for n in s.hf_names]
    if "lm_head.weight" in files and "lm_head.weight" not in keep:  # a tied model's copy
        keep.append("lm_head.weight")
    tensors = {}
    for name in keep:
        with safe_open(files[name], framework="numpy") as f:
            tensors[name] = f.get_tensor(name)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    conf = json.loads((src / "config.json").read_text())
    conf["num_hidden_layers"] = a.layers
    if isinstance(conf.get("layer_types"), list):
        conf["layer_types"] = conf["layer_types"][: a.layers]
    if "max_window_layers" in conf:
        conf["max_window_layers"] = min(conf["max_window_layers"], a.layers)
    (tmp / "config.json").write_text(json.dumps(conf, indent=1))
    for extra in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                  "generation_config.json"):
        if (src / extra).is_file():
            shutil.copy(src / extra, tmp / extra)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    print(f"kept {a.layers}/{cfg.num_layers} layers -> {out}")
    return out


def main(argv=None):
    from llm_jax.config import Qwen3ConfigError
    from llm_jax.loader import WeightsError
    from llm_jax.tokenizer import TokenizerError

    cmd = tyro.cli(Annotated[Encode, tyro.conf.subcommand("encode")]
                   | Annotated[Truncate, tyro.conf.subcommand("truncate")], args=argv)
    try:
        return run_encode(cmd) if isinstance(cmd, Encode) else run_truncate(cmd)
    except (Qwen3ConfigError, WeightsError, TokenizerError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
