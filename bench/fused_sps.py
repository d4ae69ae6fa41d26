"""Env steps/s of plain PPO vs LLM-augmented PPO (jax backend, in the jitted chunk) vs the vLLM
fallback (host render + HTTP), plus device vs host rendering, in ONE process on one machine.

    python bench/fused_sps.py --out docs/bench_fused_sps.json [--vllm] [--env ...]

Both LLM backends use the same tiny random Qwen3 checkpoint (head_dim 64), written with HF
transformers into a temporary folder (needs the test extras: torch, transformers). Every
configuration is compiled first (compile time reported apart), warmed up, then timed over whole
chunks with block_until_ready. Also reports the LLM FLOPs per env step from the mean rendered
length, and the steps/s the LLM alone would allow at the matmul FLOP/s measured here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


@dataclasses.dataclass(frozen=True)
class Args:
    out: str | None = None
    """Write the rows here as JSON."""
    env: str = "Craftax-Classic-Symbolic-v1"
    """Environment."""
    num_envs: int = 128
    """Parallel envs."""
    num_steps: int = 32
    """Rollout length per update."""
    skip_n: tuple[int, ...] = (1, 5, 25, 100, 0)
    """LLM call intervals to measure (0 = never)."""
    updates: int = 2
    """Updates per timed chunk."""
    vllm: bool = False
    """Also measure the vLLM fallback (starts a server from scripts/vllm_server.sh)."""
    vllm_skip_n: tuple[int, ...] = (25,)
    """skip_n values for the vLLM fallback."""
    render_states: int = 512
    """States for the renderer comparison."""


def build_checkpoint(folder: Path) -> None:
    from qwen_fixtures import build_tiny_qwen3

    build_tiny_qwen3(folder, tied=True, head_dim=64, hidden=128, heads=2, kv_heads=1, layers=2,
                     vocab=151_936, intermediate=384, seed=0)


def train_cfg(a: Args, llm=None):
    from fused.config import EnvConfig, LLMConfig, PPOConfig, TrainConfig, WandbConfig

    return TrainConfig(env=EnvConfig(name=a.env, num_envs=a.num_envs, reset_pool=8),
                       ppo=PPOConfig(num_steps=a.num_steps, layer_width=256, num_minibatches=4,
                                     update_epochs=2),
                       llm=llm or LLMConfig(), total_timesteps=a.num_envs * a.num_steps * 1000,
                       updates_per_chunk=a.updates, wandb=WandbConfig(mode="disabled"), plot=False)


def time_config(a: Args, cfg, name: str, **extra) -> dict:
    import jax

    from fused.config import validate
    from fused.train import make_train

    validate(cfg)
    tr = make_train(cfg)
    state = jax.block_until_ready(jax.jit(tr.init)(jax.random.PRNGKey(0), tr.frozen))
    t = time.perf_counter()
    compiled = jax.jit(tr.chunk).lower(state, tr.frozen).compile()
    compile_s = time.perf_counter() - t
    state, _ = jax.block_until_ready(compiled(state, tr.frozen))  # warm-up
    host0 = tr.llm.host.seconds if tr.llm is not None and tr.llm.host is not None else 0.0
    t = time.perf_counter()
    state, m = jax.block_until_ready(compiled(state, tr.frozen))
    dt = time.perf_counter() - t
    row = {"name": name, "env": a.env, "num_envs": a.num_envs,
           "steps_per_s": a.updates * cfg.steps_per_update / dt, "compile_s": compile_s,
           "seconds": dt, **extra}
    if tr.llm is not None:
        m = jax.device_get(m)["ppo"]
        row["llm_calls"] = float(m["llm/calls"].sum())
        row["llm_refreshed"] = float(m["llm/refreshed"].sum())
        row["llm_tokens"] = float(m["llm/tokens"].sum())
        if tr.llm.host is not None:
            row["llm_host_share"] = (tr.llm.host.seconds - host0) / dt
    print(json.dumps(row), flush=True)
    return row


def matmul_flops() -> float:
    """FLOP/s of a large float32 matmul here: the practical compute ceiling."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((2048, 2048), jnp.float32)
    f = jax.jit(lambda a: a @ a)
    jax.block_until_ready(f(x))
    t = time.perf_counter()
    for _ in range(5):
        jax.block_until_ready(f(x))
    return 5 * 2 * 2048 ** 3 / (time.perf_counter() - t)


def llm_flops_per_sequence(qcfg, layers: int, prefix: int, tokens: float) -> float:
    """Matmul FLOPs to encode `tokens` new tokens after a cached `prefix` (per sequence)."""
    h, f, n, k, d = (qcfg.hidden_size, qcfg.intermediate_size, qcfg.num_heads,
                     qcfg.num_kv_heads, qcfg.head_dim)
    dense = 2 * tokens * (h * d * (2 * n + 2 * k) + 3 * h * f)
    attn = 4 * n * d * (tokens * prefix + tokens * (tokens + 1) / 2)
    return layers * (dense + attn)


def render_rows(a: Args, weights: str) -> list[dict]:
    import jax
    import numpy as np

    from fused.render import make_renderer, render_tokens, rollout_observations
    from fused.text_format import get_layout, render_text
    from llm_jax.tokenizer import load_tokenizer

    tok = load_tokenizer(weights)
    r = make_renderer(a.env, tok)
    obs_host = rollout_observations(a.env, a.render_states, 0, 16)
    obs = jax.device_put(obs_host)  # in training the observations are already on the device
    f = jax.jit(lambda o: render_tokens(r, o))
    jax.block_until_ready(f(obs))
    t = time.perf_counter()
    reps = 20
    for _ in range(reps):
        jax.block_until_ready(f(obs))
    device = reps * len(obs) / (time.perf_counter() - t)
    layout = get_layout(a.env)
    t = time.perf_counter()
    lengths = [len(tok.encode(render_text(layout, o))) for o in obs_host]
    host = len(obs_host) / (time.perf_counter() - t)
    rows = [{"name": "render_device", "env": a.env, "states_per_s": device},
            {"name": "render_host_plus_tokenizer", "env": a.env, "states_per_s": host,
             "mean_tokens": float(np.mean(lengths)), "max_tokens": int(max(lengths)),
             "l_max": r.max_tokens}]
    print(json.dumps(rows[0]), json.dumps(rows[1]), f"ratio {device / host:.0f}x", flush=True)
    return rows


def main(a: Args) -> list[dict]:
    import jax

    from fused.config import LLMConfig
    from llm_jax.config import Qwen3Config

    jax.config.update("jax_compilation_cache_dir", os.environ.get(
        "JAX_COMPILATION_CACHE_DIR", os.path.expanduser("~/.cache/craftax-fused/jax")))
    tmp = Path(tempfile.mkdtemp(prefix="fused-bench-"))
    weights = tmp / "tiny-qwen3"
    build_checkpoint(weights)
    qcfg = Qwen3Config.from_folder(weights)
    rows = render_rows(a, str(weights))
    mean_tokens = rows[1]["mean_tokens"]
    rows.append(time_config(a, train_cfg(a), "ppo", skip_n=None, backend="none"))
    base = rows[-1]["steps_per_s"]
    peak = matmul_flops()
    from fused.prompt import prompt_parts
    from llm_jax.tokenizer import load_tokenizer

    parts = prompt_parts(load_tokenizer(weights), a.env)
    per_seq = llm_flops_per_sequence(qcfg, qcfg.num_layers, len(parts.prefix),
                                     mean_tokens + len(parts.tail))
    for skip in a.skip_n:
        llm = LLMConfig(backend="jax", weights=str(weights), skip_n=skip, post_norm=True)
        row = time_config(a, train_cfg(a, llm), "fused", skip_n=skip, backend="jax")
        row["vs_ppo"] = row["steps_per_s"] / base
        if skip:
            row["llm_flops_per_step"] = per_seq / skip
            row["llm_flop_bound_steps_per_s"] = peak * skip / per_seq
        rows.append(row)
    if a.vllm:
        from llm_jax.vllm_client import launch_server

        proc, client = launch_server(ROOT / "scripts/vllm_server.sh", weights,
                                     8600 + os.getpid() % 300)
        url = client.url
        try:
            for skip in a.vllm_skip_n:
                llm = LLMConfig(backend="vllm", weights=str(weights), url=url, skip_n=skip)
                row = time_config(a, train_cfg(a, llm), "vllm_fallback", skip_n=skip,
                                  backend="vllm")
                fused = [r for r in rows if r["name"] == "fused" and r["skip_n"] == skip]
                if fused:
                    fused[0]["vs_vllm"] = fused[0]["steps_per_s"] / row["steps_per_s"]
                rows.append(row)
        finally:
            os.killpg(proc.pid, 15)
    rows.append({"name": "machine", "matmul_flops_per_s": peak, "devices": str(jax.devices()),
                 "cpu_count": os.cpu_count(), "prefix_tokens": len(parts.prefix),
                 "tail_tokens": len(parts.tail), "model": qcfg.__dict__})
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
        print(f"wrote {a.out}")
    return rows


if __name__ == "__main__":
    main(tyro.cli(Args))
