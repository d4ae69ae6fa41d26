"""Frames to pooled Qwen3-VL states: our encoder (`fused.llm.vl.VLEncoder.fn`: the
processor on the device, the tower, the text pass, every:8 pooling, one jitted function) vs
HF transformers (its Qwen2-VL image processor, PIL backend, then the model's forward), the
same random-weight checkpoint and Craftax-Classic frames, in one process.

    python bench/vl_encode.py --out docs/bench_vl_encode.json
    python bench/vl_encode.py --shape qwen3-vl-4b --frames 1024 --out r.json   # a GPU row

Rows: name (jax | hf_torch), model, params, batch (frames), tokens (per frame's prompt),
frames_per_s, compile_s (ours), vs_hf (ours, median over rounds of HF's time / ours). Both
sides take uint8 frames and return the last layer's states, pooled over every 8th image token;
timed in alternating rounds (`bench/llm_encode.py`'s `interleaved`).

With --shape, a released shape with random weights made on the device (no checkpoint, no HF):
--frames Craftax-Pixels frames (130 x 110: 72 image tokens) through the tower and the text
model in one jitted call (micro-batches of --microbatch under `lax.map`), in --dtype; the row
`vl_gpu` gives frames_per_s, flops_per_frame (tower + text, matmuls and attention) and mfu
against a large matmul measured in the same process.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from llm_encode import interleaved, run_rows  # noqa: E402

ENV = "Craftax-Classic-Pixels-v1"
MODELS = {
    # name: build_tiny_qwen3_vl keywords (vocabulary: Qwen's 151,680, its tokenizer's ids)
    "tiny": {},
    # 97M parameters in all (78M of them the embedding): text 512 wide, 6 layers; tower 6 deep
    "vl-100m": dict(layers=6, hidden=512, head_dim=64, heads=8, kv_heads=4, depth=6,
                    vision_hidden=256, vision_heads=4, deepstack=(1, 3), section=(16, 8, 8)),
}


@dataclasses.dataclass(frozen=True)
class Args:
    models: tuple[str, ...] = ("tiny", "vl-100m")
    """Random-weight models (see MODELS)."""
    batches: tuple[int, ...] = (1, 8, 64)
    """Frames per call."""
    repeats: int = 3
    """Timed rounds (median)."""
    out: str | None = None
    """JSON rows output."""
    shape: str | None = None
    """A released shape with random weights instead of the HF comparison (see SHAPES)."""
    frames: int = 1024
    """With --shape: frames per call."""
    microbatch: int = 128
    """With --shape: frames per micro-batch inside the call."""
    dtype: str = "bfloat16"
    """With --shape: weights and compute dtype."""


# Released Qwen3-VL shapes (config.json fields; Qwen3-VL-4B-Instruct's), and the tiny one the
# CPU smoke run of the GPU check uses.
SHAPES = {
    "qwen3-vl-4b": {
        "text": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, intermediate_size=9728,
                     vocab_size=151_936, rope_theta=5_000_000.0,
                     max_position_embeddings=262_144, rms_norm_eps=1e-6,
                     mrope_section=[24, 20, 20]),
        "vision": dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                       out_hidden_size=2560, num_position_embeddings=2304,
                       deepstack_visual_indexes=[5, 11, 17])},
    "tiny": {
        "text": dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, intermediate_size=96,
                     vocab_size=151_936, rope_theta=5_000_000.0, max_position_embeddings=4096,
                     rms_norm_eps=1e-6, mrope_section=[4, 2, 2]),
        "vision": dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4,
                       out_hidden_size=48, num_position_embeddings=64,
                       deepstack_visual_indexes=[0])},
}


def shape_folder(name: str) -> Path:
    """A folder holding only the config.json of shape `name` (the packaged tokenizer serves)."""
    import json

    s = SHAPES[name]
    rope = dict(rope_type="default", rope_theta=s["text"]["rope_theta"],
                mrope_section=s["text"]["mrope_section"], mrope_interleaved=True)
    text = dict({k: v for k, v in s["text"].items() if k not in ("rope_theta", "mrope_section")},
                model_type="qwen3_vl_text", hidden_act="silu", rope_parameters=rope,
                attention_bias=False)
    vision = dict(s["vision"], patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                  in_channels=3, hidden_act="gelu_pytorch_tanh")
    folder = Path(tempfile.mkdtemp(prefix=f"bench-vl-{name}-"))
    (folder / "config.json").write_text(json.dumps(dict(
        model_type="qwen3_vl", text_config=text, vision_config=vision, tie_word_embeddings=True,
        image_token_id=151655, vision_start_token_id=151652, vision_end_token_id=151653)))
    return folder


def frames(n: int) -> np.ndarray:
    """n Classic frames (uint8, as datasets store them) along a random walk."""
    import jax
    from craftax.craftax_env import make_craftax_env_from_name

    env = make_craftax_env_from_name(ENV, auto_reset=True)
    p = env.default_params
    obs, state = env.reset(jax.random.PRNGKey(0), p)
    step = jax.jit(env.step)
    out = []
    for i in range(n):
        out.append(np.round(np.asarray(obs) * 255).astype(np.uint8))
        obs, state, *_ = step(jax.random.PRNGKey(i + 1), state, i % 6, p)
    return np.stack(out)


def rows(args: Args, emit) -> None:
    import jax
    import torch

    from fused.llm.config import LLMConfig
    from fused.llm.vl import VLEncoder
    from qwen_fixtures import build_tiny_qwen3_vl, hf_vl_processor

    torch.set_num_threads(os.cpu_count())
    shots = frames(max(args.batches))
    for name in args.models:
        folder = Path(tempfile.mkdtemp(prefix=f"bench-vl-{name}-"))
        model = build_tiny_qwen3_vl(folder, vocab=151_680, **MODELS[name]).eval()
        params = sum(p.numel() for p in model.parameters())
        proc = hf_vl_processor()
        for b in args.batches:
            lab = VLEncoder(LLMConfig(weights=str(folder), pool="every:8", dtype="float32",
                                      post_norm=True),  # HF's last hidden state is normed
                            ENV, b)
            encode = jax.jit(lab.fn)
            x = shots[:b].reshape(b, -1).astype(np.float32) / 255.0
            ids = torch.tensor(np.repeat(lab.ids[None], b, 0), dtype=torch.long)
            img = ids == 151655
            t0 = time.perf_counter()
            ours_out = np.asarray(encode(lab.params, x))
            compile_s = time.perf_counter() - t0

            def ours():
                return np.asarray(encode(lab.params, x))

            def hf():
                pix = proc(images=list(shots[:b]), return_tensors="pt")
                with torch.no_grad():
                    h = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                              mm_token_type_ids=img.long(), **pix,
                              output_hidden_states=True).hidden_states[-1]
                keep = img & ((torch.cumsum(img, 1) - 1) % 8 == 0)
                return ((h * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)).numpy()

            ref = hf()
            err = float(np.abs(ours_out - ref).max() / (np.abs(ref).max() + 1e-9))
            mine, theirs = interleaved([ours, hf], args.repeats)
            base = {"model": name, "params": params, "batch": b, "tokens": int(lab.ids.size)}
            emit(dict(base, name="jax", frames_per_s=b / statistics.median(mine),
                      compile_s=compile_s, rel_err_vs_hf=err,
                      vs_hf=statistics.median(h / o for o, h in zip(mine, theirs)),
                      rounds=args.repeats))
            emit(dict(base, name="hf_torch", frames_per_s=b / statistics.median(theirs)))


def gpu_rows(args: Args, emit) -> None:
    """One call of --frames Craftax-Pixels frames through a random-weight --shape."""
    import jax
    import jax.numpy as jnp

    from fused.llm.config import LLMConfig
    from fused.llm.vl import VLEncoder
    from fused_sps import matmul_flops
    from llm_jax.vision import vision_flops
    from llm_jax.vl_config import VLConfig
    from llm_jax.vl_loader import random_vl_params

    if args.frames % args.microbatch:
        raise SystemExit(f"--microbatch {args.microbatch} must divide --frames {args.frames}")
    env = "Craftax-Pixels-v1"
    folder = shape_folder(args.shape)
    cfg = VLConfig.from_folder(folder)
    params = random_vl_params(cfg, 0, jnp.dtype(args.dtype))
    enc = VLEncoder(LLMConfig(weights=str(folder), pool="every:8", dtype=args.dtype), env,
                    args.microbatch, params=params)
    mb = args.microbatch

    @jax.jit
    def encode(p, x):
        return jax.lax.map(lambda f: enc.fn(p, f), x.reshape(-1, mb, x.shape[-1])).reshape(
            x.shape[0], -1)

    h, w, _ = enc.image
    x = jax.random.uniform(jax.random.PRNGKey(1), (args.frames, h * w * 3))
    t0 = time.perf_counter()
    jax.block_until_ready(encode(params, x))
    compile_s = time.perf_counter() - t0
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(encode(params, x))
        times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    # each frame's row computes the prompt after the text before the image (computed once a
    # call, as a prefix cache)
    tokens, before = enc.row_tokens, enc.prefix_len
    patches = enc.per_image * cfg.vision.spatial_merge_size ** 2
    flops = (vision_flops(cfg.vision, patches)
             + tokens * cfg.text.flops_per_token(enc.layer, before, tokens))
    peak = matmul_flops(args.dtype)
    emit({"name": "vl_gpu", "model": args.shape, "device": str(jax.devices()[0]),
          "dtype": args.dtype, "frames": args.frames, "microbatch": mb, "tokens": tokens,
          "prefix_tokens": before,
          "image_tokens": enc.per_image, "frames_per_s": args.frames / dt, "seconds": dt,
          "compile_s": compile_s, "flops_per_frame": flops, "matmul_flops_per_s": peak,
          "mfu": args.frames * flops / dt / peak,
          "finite": bool(np.isfinite(np.asarray(out, np.float32)).all()), "rounds": args.repeats})


def main(args: Args):
    run_rows(args.out, lambda emit: (gpu_rows if args.shape else rows)(args, emit))


if __name__ == "__main__":
    main(tyro.cli(Args))
