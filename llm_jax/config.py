"""Qwen3 dense architecture read from a HuggingFace `config.json`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


class Qwen3ConfigError(ValueError):
    """config.json is missing, is not a Qwen3 dense model, or uses an unsupported feature."""


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    max_position_embeddings: int = 40960

    @classmethod
    def from_dict(cls, d: dict) -> "Qwen3Config":
        arch = d.get("model_type")
        if arch != "qwen3":
            raise Qwen3ConfigError(f"model_type={arch!r}, not 'qwen3': only Qwen3 dense models "
                                   "are supported (Qwen3-MoE and other families are not)")
        if d.get("hidden_act", "silu") != "silu":
            raise Qwen3ConfigError(f"hidden_act={d['hidden_act']!r}; Qwen3 uses silu")
        if d.get("attention_bias", False):
            raise Qwen3ConfigError("attention_bias=true is not supported (Qwen3 has none)")
        rope = d.get("rope_parameters") or {}
        scaling = d.get("rope_scaling") or rope
        if scaling.get("rope_type", scaling.get("type", "default")) not in ("default", None):
            raise Qwen3ConfigError(f"rope scaling {scaling} is not supported; use the default RoPE")
        theta = d.get("rope_theta", rope.get("rope_theta"))
        if theta is None:
            raise Qwen3ConfigError("config.json has neither rope_theta nor "
                                   "rope_parameters.rope_theta")
        heads = d["num_attention_heads"]
        cfg = cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_layers=d["num_hidden_layers"],
            num_heads=heads, num_kv_heads=d.get("num_key_value_heads", heads),
            head_dim=d.get("head_dim") or d["hidden_size"] // heads, rope_theta=float(theta),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=d.get("max_position_embeddings", 40960))
        if cfg.num_heads % cfg.num_kv_heads:
            raise Qwen3ConfigError(f"num_attention_heads={heads} is not a multiple of "
                                   f"num_key_value_heads={cfg.num_kv_heads}")
        return cfg

    @classmethod
    def from_folder(cls, folder: str | Path) -> "Qwen3Config":
        path = Path(folder).expanduser() / "config.json"
        if not path.is_file():
            raise Qwen3ConfigError(f"{path} not found: --weights must be a HuggingFace model "
                                   "folder (config.json + *.safetensors)")
        try:
            d = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise Qwen3ConfigError(f"{path} is not valid JSON ({e})") from None
        try:
            return cls.from_dict(d)
        except KeyError as e:
            raise Qwen3ConfigError(f"{path} lacks required field {e}") from None

    @classmethod
    def shape(cls, name: str) -> "Qwen3Config":
        """The published architecture of a Qwen3 size (for random-weight speed measurements)."""
        if name not in SHAPES:
            raise Qwen3ConfigError(f"unknown Qwen3 shape {name!r}; known: {', '.join(SHAPES)}")
        return SHAPES[name]

    def flops_per_token(self, layers: int, context: float, seq_len: float) -> float:
        """Matmul FLOPs per token of encoding a `seq_len`-token sequence through `layers` layers
        after `context` cached tokens (projections, MLP, causal attention counted once)."""
        h, f, n, k, d = (self.hidden_size, self.intermediate_size, self.num_heads,
                         self.num_kv_heads, self.head_dim)
        dense = 2 * (h * d * (2 * n + 2 * k) + 3 * h * f)
        attn = 4 * n * d * (context + (seq_len + 1) / 2)
        return layers * (dense + attn)

    def num_params(self) -> int:
        h, f, n, k, d = (self.hidden_size, self.intermediate_size, self.num_heads,
                         self.num_kv_heads, self.head_dim)
        per_layer = h * d * (2 * n + 2 * k) + 3 * h * f + 2 * h + 2 * d
        return self.vocab_size * h + self.num_layers * per_layer + h


def _released(hidden, inter, layers, heads, tied) -> Qwen3Config:
    return Qwen3Config(vocab_size=151_936, hidden_size=hidden, intermediate_size=inter,
                       num_layers=layers, num_heads=heads, num_kv_heads=8, head_dim=128,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=tied)


# The config.json values of the released dense checkpoints (Qwen/Qwen3-*B on the HF hub).
SHAPES: dict[str, Qwen3Config] = {
    "qwen3-0.6b": _released(1024, 3072, 28, 16, True),
    "qwen3-1.7b": _released(2048, 6144, 28, 16, True),
    "qwen3-4b": _released(2560, 9728, 36, 32, True),
    "qwen3-8b": _released(4096, 12288, 36, 32, False),
}
