"""Frames to pooled Qwen3-VL states: our label path (`fused.llm.vl.VLLabeller`: the
processor on the device, the tower, the text pass, every:8 pooling, one jitted function) vs
HF transformers (its Qwen2-VL image processor, PIL backend, then the model's forward), the
same random-weight checkpoint and Craftax-Classic frames, in one process.

    python bench/vl_encode.py --out docs/bench_vl_encode.json

Rows: name (jax | hf_torch), model, params, batch (frames), tokens (per frame's prompt),
frames_per_s, compile_s (ours), vs_hf (ours, median over rounds of HF's time / ours). Both
sides take uint8 frames and return the last layer's states, pooled over every 8th image token;
timed in alternating rounds (`bench/llm_encode.py`'s `interleaved`).
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
    import torch

    from fused.llm.config import LLMConfig
    from fused.llm.vl import VLLabeller
    from qwen_fixtures import build_tiny_qwen3_vl, hf_vl_processor

    torch.set_num_threads(os.cpu_count())
    shots = frames(max(args.batches))
    for name in args.models:
        folder = Path(tempfile.mkdtemp(prefix=f"bench-vl-{name}-"))
        model = build_tiny_qwen3_vl(folder, vocab=151_680, **MODELS[name]).eval()
        params = sum(p.numel() for p in model.parameters())
        proc = hf_vl_processor()
        for b in args.batches:
            lab = VLLabeller(LLMConfig(weights=str(folder), pool="every:8", dtype="float32",
                                       post_norm=True),  # HF's last hidden state is normed
                             ENV, b)
            x = shots[:b].reshape(b, -1).astype(np.float32) / 255.0
            ids = torch.tensor(np.repeat(lab.ids[None], b, 0), dtype=torch.long)
            img = ids == 151655
            t0 = time.perf_counter()
            ours_out = np.asarray(lab.fn(lab.params, x))
            compile_s = time.perf_counter() - t0

            def ours():
                return np.asarray(lab.fn(lab.params, x))

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


def main(args: Args):
    run_rows(args.out, lambda emit: rows(args, emit))


if __name__ == "__main__":
    main(tyro.cli(Args))
