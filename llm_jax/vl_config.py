"""A Qwen3-VL's config (`VLConfig`): its text model (a Qwen3's or Qwen3-MoE's `Qwen3Config`),
its vision tower's and image processor's configs, its special tokens and M-RoPE sections, read
from a model folder's config.json and preprocessor_config.json with every mismatch a one-line
error."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from llm_jax.config import Qwen3Config, Qwen3ConfigError
from llm_jax.vision import ProcessorConfig, VisionConfig, VisionConfigError


# config.json model_type -> its text model's
TEXT_TYPES = {"qwen3_vl": "qwen3", "qwen3_vl_moe": "qwen3_moe"}


@dataclasses.dataclass(frozen=True)
class VLConfig:
    """A Qwen3-VL model folder's settings (Qwen3-VL's released values as defaults)."""

    text: Qwen3Config
    """The text model (a Qwen3, or a Qwen3-MoE for `qwen3_vl_moe`)."""
    vision: VisionConfig
    """The vision tower."""
    processor: ProcessorConfig
    """The image processor (preprocessor_config.json, else the tower's patch sizes)."""
    image_token_id: int = 151655
    """`<|image_pad|>`: one per image token in a prompt."""
    vision_start_token_id: int = 151652
    """`<|vision_start|>`, before each image's tokens."""
    vision_end_token_id: int = 151653
    """`<|vision_end|>`, after them."""
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    """Frequencies of the rotary embedding turned by (t, row, col) positions (`llm_jax.mrope`):
    three numbers summing to head_dim / 2."""

    @classmethod
    def from_dict(cls, d: dict, processor: dict | None = None) -> "VLConfig":
        arch = d.get("model_type")
        if arch not in TEXT_TYPES:
            raise Qwen3ConfigError(f"model_type={arch!r}, not 'qwen3_vl' or 'qwen3_vl_moe' (a "
                                   "Qwen3-VL model)")
        t = dict(d["text_config"])
        # HF's VL-MoE router always renormalises the top-k weights, whatever the config says
        moe = {"norm_topk_prob": True} if arch == "qwen3_vl_moe" else {}
        # transformers 5 writes rope_parameters; released configs (4.57) rope_scaling
        rope = t.get("rope_parameters") or t.get("rope_scaling") or {}
        section = tuple(rope.get("mrope_section", (24, 20, 20)))
        # the text model is Qwen3's; tie_word_embeddings lives at the top level of VL configs
        text = Qwen3Config.from_dict(dict(
            {k: v for k, v in t.items() if k != "rope_scaling"}, model_type=TEXT_TYPES[arch],
            **moe,
            tie_word_embeddings=d.get("tie_word_embeddings", t.get("tie_word_embeddings", False)),
            rope_parameters=dict({k: v for k, v in rope.items()
                                  if k not in ("mrope_section", "mrope_interleaved", "type")},
                                 rope_type="default")))
        if len(section) != 3 or 2 * sum(section) != text.head_dim:
            raise Qwen3ConfigError(f"mrope_section={list(section)} must be 3 numbers summing to "
                                   f"head_dim / 2 = {text.head_dim // 2}")
        vision = VisionConfig.from_dict(d["vision_config"])
        if vision.out_hidden_size != text.hidden_size:
            raise VisionConfigError(f"vision out_hidden_size={vision.out_hidden_size} != the "
                                    f"text hidden_size={text.hidden_size}")
        pc = ProcessorConfig.from_dict(processor or {"patch_size": vision.patch_size,
                                                     "merge_size": vision.spatial_merge_size,
                                                     "temporal_patch_size":
                                                         vision.temporal_patch_size})
        if (pc.patch_size, pc.merge_size, pc.temporal_patch_size) != (
                vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size):
            raise VisionConfigError("preprocessor_config.json's patch / merge / temporal sizes "
                                    "differ from the vision config's")
        return cls(text=text, vision=vision, processor=pc,
                   image_token_id=d.get("image_token_id", 151655),
                   vision_start_token_id=d.get("vision_start_token_id", 151652),
                   vision_end_token_id=d.get("vision_end_token_id", 151653),
                   mrope_section=section)

    @classmethod
    def from_folder(cls, folder: str | Path) -> "VLConfig":
        folder = Path(folder).expanduser()
        path = folder / "config.json"
        if not path.is_file():
            raise Qwen3ConfigError(f"{path} not found: pass a HuggingFace Qwen3-VL model folder")
        pre = folder / "preprocessor_config.json"
        try:
            return cls.from_dict(json.loads(path.read_text()),
                                 json.loads(pre.read_text()) if pre.is_file() else None)
        except KeyError as e:
            raise Qwen3ConfigError(f"{path} lacks required field {e}") from None
