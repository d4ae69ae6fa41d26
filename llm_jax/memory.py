"""Device memory a Qwen3 needs, estimated from its config before any weight is made or read,
and checked against what the device has (CPU: available RAM; GPU/TPU: the allocator's
`bytes_limit` less what is in use). Host-only."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from llm_jax.config import Qwen3Config

GB = 1e9


class MemoryFitError(ValueError):
    """The model's weights and activations do not fit the device (one line: numbers, fix)."""


def itemsize(dtype) -> int:
    return jnp.dtype(dtype).itemsize


def weight_bytes(cfg: Qwen3Config, dtype, layers: int | None = None) -> int:
    """Bytes of the weights of the first `layers` layers (default all), every expert counted,
    with the embedding, final norm and (untied) lm_head."""
    return cfg.num_params(layers) * itemsize(dtype)


def kv_bytes(cfg: Qwen3Config, layers: int, tokens: int, dtype) -> int:
    """Keys and values of `tokens` positions in `layers` layers (a prefix cache, a KV cache)."""
    return 2 * layers * tokens * cfg.num_kv_heads * cfg.head_dim * itemsize(dtype)


def activation_bytes(cfg: Qwen3Config, rows: int, tokens: int, context: int, dtype) -> int:
    """Live activations of one layer over `rows` x `tokens` positions after `context` cached
    ones (what XLA keeps at once when the layers run under a scan): residual and q/k/v/o, the
    MLP's intermediate (a MoE layer: k routed copies of each token, their gate/up/act and the
    router's float32 probabilities), and the attention scores of the unfused forms."""
    h = cfg.hidden_size
    mlp = 3 * cfg.intermediate_size
    if cfg.is_moe:
        mlp = max(mlp, cfg.num_experts_per_tok * (2 * h + 3 * cfg.moe_intermediate_size)
                  + 2 * cfg.num_experts)
    width = 6 * h + mlp + cfg.num_heads * (context + tokens)
    return rows * tokens * width * itemsize(dtype)


def generation_need(cfg: Qwen3Config, dtype, layers: int | None = None, rows: int = 0,
                    tokens: int = 0, new_tokens: int = 0, prefix: int = 0) -> dict[str, int]:
    """Device bytes of one call ({what: bytes}, for `check_fits`): the weights of the first
    `layers` layers (default all), the shared prefix's cache, and for `rows` rows of up to
    `tokens` prompt tokens one pass's activations; generating `new_tokens` more adds every
    row's KV cache (prompt and new tokens, every layer), the prompt pass's keys and values
    (live beside the cache they are copied into) and a step's float32 logits."""
    computed = cfg.num_layers if layers is None else layers
    need = {"weights": weight_bytes(cfg, dtype, layers)}
    if prefix and computed:
        need["prefix cache"] = kv_bytes(cfg, computed, prefix, dtype)
    if rows and new_tokens:
        need["KV cache"] = kv_bytes(cfg, computed, rows * (tokens + new_tokens), dtype)
        need["prompt KV copy"] = kv_bytes(cfg, computed, rows * tokens, dtype)
        need["logits"] = rows * cfg.vocab_size * 4
    if rows:
        need["activations"] = activation_bytes(cfg, rows, tokens, prefix, dtype)
    return need


def available_bytes(device=None) -> tuple[int, str]:
    """(bytes free for this process's arrays, what that figure is): a CPU's available RAM
    (MemAvailable), an accelerator's `bytes_limit` less `bytes_in_use`."""
    device = device or jax.local_devices()[0]
    if device.platform == "cpu":
        meminfo = Path("/proc/meminfo")
        if meminfo.is_file():
            for line in meminfo.read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available RAM"
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free RAM"
    stats = device.memory_stats() or {}
    limit = stats.get("bytes_limit")
    if not limit:
        return 2**62, f"unknown ({device.device_kind} reports no memory statistics)"
    return (int(limit - stats.get("bytes_in_use", 0)),
            f"bytes_limit - bytes_in_use of the {device.device_kind}")


def check_fits(need: dict[str, int], fixes: str, device=None) -> tuple[int, str]:
    """MemoryFitError (one line naming every figure and `fixes`) unless the sum of `need`
    ({what: bytes}) fits the device. Returns (bytes left over, a one-line summary)."""
    have, what = available_bytes(device)
    total = sum(need.values())
    parts = " + ".join(f"{k} {v / GB:.2f} GB" for k, v in need.items())
    if len(need) > 1:
        parts += f" = {total / GB:.2f} GB"
    if total > have:
        raise MemoryFitError(f"the model needs {parts} but the device has "
                             f"{have / GB:.2f} GB ({what}); {fixes}")
    return have - total, f"memory: {parts} of {have / GB:.2f} GB ({what})"


def fixes(dtype, dtype_flag: str, layer_flag: str | None, batch_flag: str) -> str:
    """What to change when the model does not fit, in the words of a command's flags
    (`layer_flag` None where every layer is loaded whatever the state's layer: decoding)."""
    out = [f"{dtype_flag} bfloat16 (half the float32 bytes)"] if itemsize(dtype) > 2 else []
    if layer_flag:
        out.append(f"an earlier layer's state ({layer_flag}: later layers are not loaded)")
    out += [f"smaller calls ({batch_flag})", "a device with more memory",
            "on a GPU a larger XLA_PYTHON_CLIENT_MEM_FRACTION (JAX takes 75% by default)"]
    return "use " + ", ".join(out)
