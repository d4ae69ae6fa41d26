"""Qwen3 architecture (dense, and mixture-of-experts as `Qwen3MoeConfig` defines it) read from a
HuggingFace `config.json`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path


class Qwen3ConfigError(ValueError):
    """config.json is missing, is not a Qwen3 (dense or MoE) model, or uses an unsupported
    feature."""


# config.json fields of MoE families we do not implement: present and non-zero means "not Qwen3
# MoE" (Qwen2-MoE's shared expert, DeepSeek's shared/routed split, grouped routing).
UNSUPPORTED_MOE_FIELDS = ("shared_expert_intermediate_size", "n_shared_experts",
                          "num_shared_experts", "n_group", "topk_group", "first_k_dense_replace")


@dataclasses.dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int
    """Rows of the embedding (and of the untied lm_head)."""
    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of a dense SwiGLU MLP (every layer of a dense model; a MoE model's dense layers)."""
    num_layers: int
    """Decoder blocks (`num_hidden_layers`)."""
    num_heads: int
    """Query heads."""
    num_kv_heads: int
    """Key/value heads (GQA: a divisor of num_heads)."""
    head_dim: int
    """Width of one head (128 in the released models, not hidden / heads)."""
    rope_theta: float
    """RoPE base, read from config.json (top-level or `rope_parameters`)."""
    rms_norm_eps: float
    """Epsilon of every RMSNorm."""
    tie_word_embeddings: bool
    """Logits from the embedding (True) or from a separate lm_head."""
    max_position_embeddings: int = 40960
    """Longest context (prompt + generated tokens)."""
    num_experts: int = 0
    """Experts per sparse MLP; 0 = a dense model (every layer a SwiGLU of intermediate_size).
    HF writes it as `num_experts` (released checkpoints) or `num_local_experts` (transformers 5)."""
    num_experts_per_tok: int = 0
    """Experts each token is routed to (top-k of the router's softmax)."""
    moe_intermediate_size: int = 0
    """Width of one expert's SwiGLU."""
    norm_topk_prob: bool = False
    """Renormalise the k chosen probabilities to sum to 1 (HF's class default False; the
    released Qwen3 MoE checkpoints set True: always read from config.json)."""
    decoder_sparse_step: int = 1
    """Layer i is sparse when (i + 1) % decoder_sparse_step == 0 (and not in mlp_only_layers)."""
    mlp_only_layers: tuple[int, ...] = ()
    """Layers that keep a dense MLP whatever decoder_sparse_step says."""

    @classmethod
    def from_dict(cls, d: dict) -> "Qwen3Config":
        arch = d.get("model_type")
        if arch not in ("qwen3", "qwen3_moe"):
            raise Qwen3ConfigError(f"model_type={arch!r}, not 'qwen3' or 'qwen3_moe': only Qwen3 "
                                   "dense and Qwen3 MoE models are supported")
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
        moe = _moe_fields(d) if arch == "qwen3_moe" else {}
        cfg = cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"], num_layers=d["num_hidden_layers"],
            num_heads=heads, num_kv_heads=d.get("num_key_value_heads", heads),
            head_dim=d.get("head_dim") or d["hidden_size"] // heads, rope_theta=float(theta),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=d.get("max_position_embeddings", 40960), **moe)
        if cfg.num_heads % cfg.num_kv_heads:
            raise Qwen3ConfigError(f"num_attention_heads={heads} is not a multiple of "
                                   f"num_key_value_heads={cfg.num_kv_heads}")
        cfg.check_moe()
        return cfg

    @classmethod
    def from_folder(cls, folder: str | Path) -> "Qwen3Config":
        path = Path(folder).expanduser() / "config.json"
        if not path.is_file():
            raise Qwen3ConfigError(f"{path} not found: the weights must be a HuggingFace Qwen3 "
                                   "model folder (config.json + *.safetensors) or a hub id")
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

    def check_moe(self) -> None:
        """Qwen3ConfigError (one line) for MoE settings no model can have."""
        if not self.num_experts:
            return
        e, k = self.num_experts, self.num_experts_per_tok
        if not 1 <= k <= e:
            raise Qwen3ConfigError(f"num_experts_per_tok={k} must lie in 1..num_experts={e}")
        if self.moe_intermediate_size < 1:
            raise Qwen3ConfigError(f"moe_intermediate_size={self.moe_intermediate_size} must be "
                                   ">= 1")
        if self.decoder_sparse_step < 1:
            raise Qwen3ConfigError(f"decoder_sparse_step={self.decoder_sparse_step} must be >= 1")
        bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_layers]
        if bad:
            raise Qwen3ConfigError(f"mlp_only_layers holds {bad}, outside the layers "
                                   f"0..{self.num_layers - 1}")
        if not all(self.sparse_layers) and self.intermediate_size < 1:
            raise Qwen3ConfigError(f"intermediate_size={self.intermediate_size} but layers "
                                   f"{self.dense_layers} are dense; give their MLP width")

    @property
    def sparse_layers(self) -> tuple[bool, ...]:
        """Per layer: a mixture-of-experts MLP (True) or a dense one, by HF's rule."""
        only = set(self.mlp_only_layers)
        return tuple(self.num_experts > 0 and i not in only
                     and (i + 1) % self.decoder_sparse_step == 0
                     for i in range(self.num_layers))

    @property
    def dense_layers(self) -> tuple[int, ...]:
        """Indices of the layers with a dense MLP."""
        return tuple(i for i, s in enumerate(self.sparse_layers) if not s)

    @property
    def is_moe(self) -> bool:
        return any(self.sparse_layers)

    def mlp_params(self, layers: int) -> tuple[int, int]:
        """(weights, weights a token uses) of the MLPs of the first `layers` layers."""
        h = self.hidden_size
        total = active = 0
        for sparse in self.sparse_layers[:layers]:
            if sparse:
                expert = 3 * h * self.moe_intermediate_size
                total += self.num_experts * (expert + h)
                active += self.num_experts_per_tok * expert + self.num_experts * h
            else:
                total += 3 * h * self.intermediate_size
                active += 3 * h * self.intermediate_size
        return total, active

    def flops_per_token(self, layers: int, context: float, seq_len: float) -> float:
        """Matmul FLOPs per token of encoding a `seq_len`-token sequence through `layers` layers
        after `context` cached tokens (projections, the MLP or the experts a token is routed to
        and its router, causal attention counted once)."""
        h, n, k, d = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        attn = layers * (2 * h * d * (2 * n + 2 * k) + 4 * n * d * (context + (seq_len + 1) / 2))
        return attn + 2 * self.mlp_params(layers)[1]

    def num_params(self, layers: int | None = None) -> int:
        """Parameters of the embedding, final norm, lm_head (untied), and the first `layers`
        layers (default all), every expert counted."""
        n_layers = self.num_layers if layers is None else layers
        h, n, k, d = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        attn = h * d * (2 * n + 2 * k) + 2 * h + 2 * d
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return embed + n_layers * attn + self.mlp_params(n_layers)[0] + h

    def block_params(self, layers: int, active: bool = False) -> int:
        """Matmul weights of the first `layers` blocks (no norms, no embedding): every expert's,
        or (`active`) only those one token uses (k experts and the router)."""
        h, n, k, d = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        return layers * h * d * (2 * n + 2 * k) + self.mlp_params(layers)[int(active)]

    def active_params(self, layers: int | None = None) -> int:
        """As `num_params`, with only the experts one token uses (and the embedding once)."""
        n_layers = self.num_layers if layers is None else layers
        h, n, k, d = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        attn = h * d * (2 * n + 2 * k) + 2 * h + 2 * d
        return self.vocab_size * h + n_layers * attn + self.mlp_params(n_layers)[1] + h


def _moe_fields(d: dict) -> dict:
    """The Qwen3 MoE fields of a `qwen3_moe` config.json, HF's class defaults where absent
    (norm_topk_prob False: the released checkpoints write True)."""
    shared = [f for f in UNSUPPORTED_MOE_FIELDS if d.get(f)]
    if shared:
        raise Qwen3ConfigError(f"config.json sets {', '.join(f'{f}={d[f]}' for f in shared)}: "
                               "shared experts and grouped routing are not Qwen3 MoE and are not "
                               "supported")
    if d.get("use_sliding_window"):
        raise Qwen3ConfigError("use_sliding_window=true is not supported (Qwen3 MoE attends to "
                               "the whole context)")
    experts = d.get("num_experts", d.get("num_local_experts", 128))
    return dict(num_experts=int(experts), num_experts_per_tok=int(d.get("num_experts_per_tok", 8)),
                moe_intermediate_size=int(d.get("moe_intermediate_size", 768)),
                norm_topk_prob=bool(d.get("norm_topk_prob", False)),
                decoder_sparse_step=int(d.get("decoder_sparse_step", 1)),
                mlp_only_layers=tuple(int(i) for i in d.get("mlp_only_layers") or ()))


def _released(hidden, inter, layers, heads, tied) -> Qwen3Config:
    return Qwen3Config(vocab_size=151_936, hidden_size=hidden, intermediate_size=inter,
                       num_layers=layers, num_heads=heads, num_kv_heads=8, head_dim=128,
                       rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=tied)


# The config.json values of the released checkpoints (Qwen/Qwen3-*B on the HF hub).
SHAPES: dict[str, Qwen3Config] = {
    "qwen3-0.6b": _released(1024, 3072, 28, 16, True),
    "qwen3-1.7b": _released(2048, 6144, 28, 16, True),
    "qwen3-4b": _released(2560, 9728, 36, 32, True),
    "qwen3-8b": _released(4096, 12288, 36, 32, False),
    # Qwen/Qwen3-30B-A3B: every layer sparse (decoder_sparse_step 1, mlp_only_layers []),
    # intermediate_size 6144 unused; max_position_embeddings 40960.
    "qwen3-30b-a3b": Qwen3Config(
        vocab_size=151_936, hidden_size=2048, intermediate_size=6144, num_layers=48,
        num_heads=32, num_kv_heads=4, head_dim=128, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=False, max_position_embeddings=40960, num_experts=128,
        num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True),
}
# Tiny shapes with the real vocabulary (real prompt tokens embed), for smoke runs of the
# benchmarks and the built-in random models (`--llm.random-model tiny | tiny-moe`): no meaning.
SHAPES["qwen3-tiny"] = Qwen3Config(
    vocab_size=151_936, hidden_size=128, intermediate_size=384, num_layers=2, num_heads=2,
    num_kv_heads=1, head_dim=64, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True)
# a dense layer, then a layer of 8 experts, top 2
SHAPES["qwen3-tiny-moe"] = dataclasses.replace(
    SHAPES["qwen3-tiny"], tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=96, norm_topk_prob=True, mlp_only_layers=(0,))


DTYPES = ("float32", "bfloat16")


def checkpoint_dtype(folder: str | Path | None) -> str | None:
    """The dtype the checkpoint's config.json names (`torch_dtype`, or transformers 5's
    `dtype`), or None where it names none."""
    path = None if folder is None else Path(folder).expanduser() / "config.json"
    if path is None or not path.is_file():
        return None
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    value = d.get("dtype") or d.get("torch_dtype")
    return str(value).removeprefix("torch.") if value else None


def resolve_dtype(requested: str, folder: str | Path | None, platform: str) -> tuple[str, str]:
    """(compute dtype, why): `auto` is float32 on CPU (where bfloat16 is emulated and slower)
    and on an accelerator the checkpoint's own dtype (bfloat16 for a random model, and for a
    float16 checkpoint: float16 is not a compute dtype here), as HF's `torch_dtype="auto"` and
    vLLM's `dtype=auto` take it; an explicit float32 or bfloat16 as given."""
    if requested != "auto":
        return requested, "given"
    if platform == "cpu":
        return "float32", "auto: float32 on CPU"
    found = checkpoint_dtype(folder)
    if found in DTYPES:
        return found, f"auto: the checkpoint's {found}"
    return "bfloat16", (f"auto: bfloat16 ({found} checkpoint)" if found
                        else "auto: bfloat16 on " + platform)
