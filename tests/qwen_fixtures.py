"""Tiny random Qwen3 checkpoints built with HF transformers (torch CPU), saved as safetensors."""

from __future__ import annotations

from pathlib import Path


def build_tiny_qwen3(folder: Path, *, tied: bool = True, head_dim: int = 16, hidden: int = 48,
                     heads: int = 4, kv_heads: int = 2, layers: int = 3, vocab: int = 320,
                     intermediate: int | None = None,
                     seed: int = 0, rope_layout: str = "top", shard: bool = False,
                     tokenizer: bool = False):
    """A random Qwen3 whose heads*head_dim != hidden and whose norm weights are random. With
    `tokenizer`, the Qwen3 tokenizer saved beside it as the installed transformers saves one."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden + 8,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, head_dim=head_dim, tie_word_embeddings=tied,
                      max_position_embeddings=4096, rms_norm_eps=1e-6)
    model = randomized(Qwen3ForCausalLM(cfg).eval())
    save_text_model(model, folder, shard, rope_layout)
    if tokenizer:
        save_tokenizer(folder)
    return model


def randomized(model, router_scale: float = 1.0):
    """`model` with every parameter drawn anew (torch's generator, in parameter order): norm
    weights 1 + 0.5 N(0, 1), a MoE router's 0.08 `router_scale` N(0, 1), the rest 0.08 N(0, 1)."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(0.08 * router_scale * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    return model


def save_text_model(model, folder: Path, shard: bool, rope_layout: str) -> None:
    """save_pretrained (in 200 KB shards with `shard`), the rope theta moved to the config's top
    level (`rope_layout` "top", as older checkpoints have it) or into `rope_parameters`."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, max_shard_size="200KB" if shard else "5GB")
    conf = json.loads((folder / "config.json").read_text())
    theta = conf.pop("rope_theta", None) or (conf.get("rope_parameters") or {}).get("rope_theta")
    conf.pop("rope_parameters", None)
    if rope_layout == "top":
        conf["rope_theta"] = theta
    else:
        conf["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    (folder / "config.json").write_text(json.dumps(conf, indent=1))


def save_tokenizer(folder: Path) -> None:
    """The packaged Qwen3 tokenizer saved into `folder` by transformers' own save_pretrained
    (transformers 5: tokenizer.json, tokenizer_config.json, the template in chat_template.jinja)."""
    from transformers import AutoTokenizer

    from llm_jax.tokenizer import packaged_tokenizer_dir

    AutoTokenizer.from_pretrained(str(packaged_tokenizer_dir())).save_pretrained(str(folder))


def build_tiny_qwen3_moe(folder: Path, *, experts: int = 8, top_k: int = 2, norm_topk: bool = True,
                         sparse_step: int = 1, mlp_only: tuple[int, ...] = (), layers: int = 3,
                         hidden: int = 48, head_dim: int = 16, heads: int = 4, kv_heads: int = 2,
                         expert_width: int = 24, intermediate: int = 40, vocab: int = 320,
                         tied: bool = False, seed: int = 0, shard: bool = False,
                         rope_layout: str = "top", router_scale: float = 1.0):
    """A random Qwen3 MoE saved by transformers' own save_pretrained (per-expert tensors,
    `num_local_experts` in config.json), random norm weights. `router_scale` multiplies the
    router's weights (larger: peakier routing, so top-k choices are far from ties)."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         moe_intermediate_size=expert_width, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim, num_experts=experts, num_experts_per_tok=top_k,
                         norm_topk_prob=norm_topk, decoder_sparse_step=sparse_step,
                         mlp_only_layers=list(mlp_only), tie_word_embeddings=tied,
                         max_position_embeddings=4096, rms_norm_eps=1e-6,
                         rope_parameters={"rope_type": "default", "rope_theta": 10_000.0 + seed})
    model = randomized(Qwen3MoeForCausalLM(cfg).eval(), router_scale)
    save_text_model(model, folder, shard, rope_layout)
    return model


def build_tiny_qwen3_vl(folder: Path, *, merge: int = 2, deepstack: tuple[int, ...] = (0, 2),
                        depth: int = 3, layers: int = 3, hidden: int = 48, head_dim: int = 16,
                        heads: int = 4, kv_heads: int = 2, vision_hidden: int = 32,
                        vision_heads: int = 4, patch: int = 16, positions: int = 64,
                        section: tuple[int, int, int] = (4, 2, 2), tied: bool = True,
                        vocab: int = 320, seed: int = 0, experts: int = 0, top_k: int = 2,
                        expert_width: int = 20, mlp_only: tuple[int, ...] = (),
                        router_scale: float = 1.0):
    """A random Qwen3-VL saved by transformers' save_pretrained, random norm weights, with a
    preprocessor_config.json of Qwen3-VL's processor settings at this patch / merge size.
    Image tokens are the last ids of a small vocabulary, Qwen's own in a full one. With
    `experts`, a Qwen3-VL-MoE (stacked expert tensors; `router_scale` multiplies the router's
    weights: peakier routing, top-k choices far from ties)."""
    import json

    import torch
    from transformers import (Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLMoeConfig,
                              Qwen3VLMoeForConditionalGeneration)

    torch.manual_seed(seed)
    moe = dict(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=expert_width,
               decoder_sparse_step=1, mlp_only_layers=list(mlp_only)) if experts else {}
    config, model_class = ((Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration) if experts
                           else (Qwen3VLConfig, Qwen3VLForConditionalGeneration))
    rope = dict(rope_type="default", rope_theta=5e6, mrope_section=list(section),
                mrope_interleaved=True)
    cfg = config(
        text_config=dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden + 8,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, head_dim=head_dim, rope_parameters=rope,
                         tie_word_embeddings=tied, rms_norm_eps=1e-6, **moe),
        vision_config=dict(depth=depth, hidden_size=vision_hidden,
                           intermediate_size=2 * vision_hidden + 8, num_heads=vision_heads,
                           out_hidden_size=hidden, num_position_embeddings=positions,
                           deepstack_visual_indexes=list(deepstack), patch_size=patch,
                           spatial_merge_size=merge, temporal_patch_size=2),
        tie_word_embeddings=tied,
        **({} if vocab > 151_656 else dict(  # Qwen's own ids where the vocabulary has them
            image_token_id=vocab - 4, video_token_id=vocab - 3, vision_start_token_id=vocab - 2,
            vision_end_token_id=vocab - 1)))
    model = model_class(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # norms and biases
                p.copy_((1.0 if "norm" in name and "weight" in name else 0.0)
                        + 0.3 * torch.randn_like(p))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(0.08 * router_scale * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    settings = vl_processor_settings(patch, merge)
    (folder / "preprocessor_config.json").write_text(json.dumps(settings))
    return model


def vl_processor_settings(patch: int = 16, merge: int = 2) -> dict:
    """Qwen3-VL's released preprocessor_config.json values, at this patch / merge size."""
    return {"patch_size": patch, "temporal_patch_size": 2, "merge_size": merge,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "size": {"shortest_edge": 65536, "longest_edge": 16777216}}


def hf_vl_processor(patch: int = 16, merge: int = 2):
    """HF's Qwen2-VL image processor with Qwen3-VL's settings (the PIL backend: the one HF uses
    where torchvision is not installed, as here)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil)

    s = vl_processor_settings(patch, merge)
    return Qwen2VLImageProcessorPil(**{k: v for k, v in s.items()})
