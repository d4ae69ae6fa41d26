"""Env steps/s of plain PPO vs LLM-augmented PPO (jax backend, in the jitted chunk) vs the vLLM
fallback (host render + HTTP), plus device vs host rendering, in ONE process on one machine.

    python bench/fused_sps.py --out docs/bench_fused_sps.json [--vllm] [--env ...]

Both LLM backends use the same tiny random Qwen3 checkpoint (head_dim 64), written with HF
transformers into a temporary folder (needs the test extras: torch, transformers). Every
configuration is compiled first (compile time reported apart), warmed up, then timed over whole
chunks with block_until_ready. Plain PPO and fused with skip_n 0 (never), whose ratio is a
target, are timed chunk for chunk in turn. Also reports the LLM FLOPs per env step from the mean
rendered length, and the steps/s the LLM alone would allow at the matmul FLOP/s measured here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from fused.commands.process import setup_compilation_cache  # noqa: E402
from llm_jax.graphs import Graphs  # noqa: E402
from fused.runs.files import atomic_write_json  # noqa: E402
from llm_jax.model import resolve_form  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Args:
    out: str | None = None
    """Write the rows here as JSON."""
    env: str = "Craftax-Classic-Symbolic-v1"
    """Environment."""
    num_envs: int = 128
    """Parallel envs."""
    num_steps: int = 50
    """Rollout length per update (50: a multiple of skip_n 1, 5, 25, so every chunk holds the
    same number of periodic LLM calls; skip_n 100 is timed over an even number of chunks)."""
    width: int = 256
    """Actor/critic MLP width (the prior used 512)."""
    skip_n: tuple[int, ...] = (1, 5, 25, 100, 0)
    """LLM call intervals to measure (0 = never)."""
    updates: int = 2
    """Updates per timed chunk."""
    repeats: int = 5
    """Timed chunks per configuration; fewer once --min-seconds have been spent."""
    min_seconds: float = 10.0
    """Stop repeating a configuration after this much timed time."""
    vllm: bool = False
    """Also measure the vLLM fallback (starts a server from scripts/vllm_server.sh)."""
    vllm_skip_n: tuple[int, ...] = (25,)
    """skip_n values for the vLLM fallback."""
    render_states: int = 512
    """States for the renderer comparison."""
    model: str = "tiny"
    """`tiny` (a tiny random checkpoint written with HF transformers, served by vLLM too) or a
    released Qwen3 shape with random weights made on the device: qwen3-0.6b, qwen3-4b, ... (jax
    backend only)."""
    layer: int | None = None
    """LLM layer (None = last)."""
    dtype: str = "float32"
    """LLM compute dtype: float32 or bfloat16."""
    microbatch: int = 0
    """Envs per LLM microbatch (0 = sized by fused.llm.batching, as in training)."""
    encode_lengths: tuple[int, ...] = ()
    """--llm.encode-lengths of the fused rows (none: the default's)."""
    refresh_batch: tuple[int, ...] = (0,)
    """Envs per refresh call (0 = sized from the env count, as in training); several values
    time each fused row once per value, in this one run."""
    plain: bool = True
    """Also time plain PPO."""
    pair_rounds: int = 20
    """With plain PPO and skip_n 0 both asked for: chunks of each, timed alternately."""
    refresh_on_reset: bool = True
    """Re-encode envs whose episode ended (as in training); off isolates the periodic calls."""
    attention: tuple[str, ...] = ("auto",)
    """Attention forms of the fused rows, each timed in turn (--llm.attention): auto (what
    training uses: row on CPU, the Pallas kernel on an NVIDIA GPU in bf16) or one of row /
    blocked / cudnn / pallas."""
    graphs: Graphs = "loops"
    """The chunks' CUDA graphs setting on a GPU (`--cuda-graphs`, llm_jax/graphs.py)."""
    trace: str | None = None
    """Write a profiler trace (Chrome trace JSON, gzipped) of one more chunk of the first fused
    row with LLM calls here, after its timed chunks (`bench/trace_report.py` groups its device
    time by llm / env / update)."""


def build_checkpoint(folder: Path) -> None:
    from qwen_fixtures import build_tiny_qwen3

    build_tiny_qwen3(folder, tied=True, head_dim=64, hidden=128, heads=2, kv_heads=1, layers=2,
                     vocab=151_936, intermediate=384, seed=0)


def train_cfg(a: Args, llm=None):
    from fused.commands.train import TrainConfig, WandbConfig
    from fused.llm.config import LLMConfig
    from fused.rl.config import EnvConfig, PolicyConfig, PPOConfig

    return TrainConfig(env=EnvConfig(name=a.env, num_envs=a.num_envs, reset_pool=8),
                       ppo=PPOConfig(num_steps=a.num_steps, num_minibatches=4, update_epochs=2),
                       policy=PolicyConfig(layer_width=a.width),
                       llm=llm or LLMConfig(), total_timesteps=a.num_envs * a.num_steps * 1000,
                       updates_per_chunk=a.updates, wandb=WandbConfig(mode="disabled"), plot=False,
                       cuda_graphs=a.graphs)


class Timed:
    """One configuration compiled (compile time apart) and warmed up, then timed chunk by chunk
    with block_until_ready."""

    def __init__(self, cfg):
        import jax
        import numpy as np

        from fused.commands.train import build, validate
        from fused.rl.sharding import jit_init
        from llm_jax.graphs import loop_jit

        validate(cfg)
        self.cfg, self.online = cfg, build(cfg)
        tr, frozen = self.online.trainer, self.online.frozen
        self.llm = getattr(self.online.agent.inputs, "encoder", None)
        self.state = jax.block_until_ready(jit_init(tr)(jax.random.PRNGKey(0), frozen))
        t = time.perf_counter()
        # (as train.py compiles it, its CUDA graphs setting included)
        self.length = np.int32(cfg.num_updates)
        self.compiled = loop_jit(tr.chunk, cfg.cuda_graphs).lower(self.state, frozen,
                                                                  self.length).compile()
        self.compile_s = time.perf_counter() - t
        self.state, _ = jax.block_until_ready(self.compiled(self.state, frozen, self.length))
        self.host0 = self.host_seconds()
        self.times, self.metrics = [], []

    def host_seconds(self) -> float:
        return getattr(self.llm, "seconds", 0.0)  # host time spent (vLLM: the server's calls)

    def chunk(self) -> None:
        import jax

        t = time.perf_counter()
        self.state, m = jax.block_until_ready(self.compiled(self.state, self.online.frozen,
                                                            self.length))
        self.times.append(time.perf_counter() - t)
        self.metrics.append(jax.device_get(m))

    def trace(self, path: str) -> dict:
        """One more chunk under the profiler, its trace copied to `path`."""
        import shutil

        import jax

        with tempfile.TemporaryDirectory() as tmp:
            jax.profiler.start_trace(tmp, create_perfetto_trace=True)
            try:
                self.state, _ = jax.block_until_ready(self.compiled(
                    self.state, self.online.frozen, self.length))
            finally:
                jax.profiler.stop_trace()
            found = sorted(Path(tmp).rglob("perfetto_trace.json.gz"))
            if not found:
                return {"trace_error": "the profiler wrote no trace"}
            shutil.copy(found[-1], path)
        return {"trace": path,
                "trace_steps": self.cfg.steps_per_update * self.cfg.updates_per_chunk,
                "trace_bytes": Path(path).stat().st_size}

    def row(self, a: Args, name: str, skip_n: int | None, **extra) -> dict:
        """Rates are totals over the timed chunks."""
        dt = sum(self.times)
        row = {"name": name, "env": a.env, "num_envs": a.num_envs, "skip_n": skip_n,
               "steps_per_s": len(self.times) * a.updates * self.cfg.steps_per_update / dt,
               "compile_s": self.compile_s, "chunk_seconds": [round(x, 3) for x in self.times],
               "seconds": dt, **extra}
        if self.llm is not None:
            for k in ("calls", "refreshed", "tokens"):  # totals over the timed chunks
                row[f"llm_{k}"] = float(sum(x["ppo"][f"llm/{k}"].sum() for x in self.metrics))
            if self.llm.backend == "vllm":
                row["llm_host_share"] = (self.host_seconds() - self.host0) / dt
        return row


def time_config(a: Args, cfg, name: str, skip_n: int | None = None, trace: str | None = None,
                **extra) -> dict:
    # Up to `repeats` chunks (fewer once `min_seconds` have been spent), always a whole number of
    # LLM-call periods (lcm(skip_n, steps per chunk) env steps), so that the timed chunks hold
    # exactly the average number of periodic calls.
    run = Timed(cfg)
    steps = a.updates * cfg.ppo.num_steps
    period = math.lcm(skip_n, steps) // steps if skip_n else 1
    while (not run.times or len(run.times) % period
           or (len(run.times) < a.repeats and sum(run.times) < a.min_seconds)):
        run.chunk()
    if trace:
        extra = dict(extra, **run.trace(trace))
    return run.row(a, name, skip_n, **extra)


def time_pair(a: Args, cfgs: list, rounds: int) -> list[Timed]:
    """Configurations without periodic LLM calls, timed chunk for chunk in turn (A, B, A, B...)
    so that a slow spell of the machine falls on all of them alike: their ratio is fair."""
    runs = [Timed(cfg) for cfg in cfgs]
    for _ in range(rounds):
        for run in runs:
            run.chunk()
    return runs


def matmul_flops(dtype: str) -> float:
    """FLOP/s of a large matmul in `dtype` on random data here: the practical compute ceiling."""
    import jax
    import jax.numpy as jnp

    n = 8192 if jax.default_backend() == "gpu" else 2048
    x = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dtype)
    f = jax.jit(lambda a: a @ a)
    jax.block_until_ready(f(x))
    t = time.perf_counter()
    for _ in range(10):
        jax.block_until_ready(f(x))
    return 10 * 2 * n ** 3 / (time.perf_counter() - t)


def render_rows(a: Args, weights: str) -> list[dict]:
    import jax
    import numpy as np

    from fused.rl.envs import rollout_observations
    from fused.text.format import get_layout, render_text
    from fused.text.render import make_renderer, render_tokens
    from llm_jax.tokenizer import load_tokenizer

    tok = load_tokenizer(weights)  # weights None: the packaged Qwen3 tokenizer
    r = make_renderer(a.env, tok)
    obs_host = rollout_observations(a.env, a.render_states, 0, 16)
    obs = jax.device_put(obs_host)  # in training the observations are already on the device
    f = jax.jit(lambda o: render_tokens(r, o))
    jax.block_until_ready(f(obs))
    layout = get_layout(a.env)
    # Both sides: best of `rounds` timed passes over the same states, interleaved, so that a
    # slow spell of this noisy machine does not land on one side only.
    device, host, rounds = 0.0, 0.0, 3
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(20):
            jax.block_until_ready(f(obs))
        device = max(device, 20 * len(obs) / (time.perf_counter() - t))
        t = time.perf_counter()
        lengths = [len(tok.encode(render_text(layout, o))) for o in obs_host]
        host = max(host, len(obs_host) / (time.perf_counter() - t))
    rows = [{"name": "render_device", "env": a.env, "states_per_s": device},
            {"name": "render_host_plus_tokenizer", "env": a.env, "states_per_s": host,
             "timing": f"best of {rounds} interleaved passes over {len(obs)} states, each side",
             "mean_tokens": float(np.mean(lengths)), "max_tokens": int(max(lengths)),
             "l_max": r.max_tokens}]
    print(json.dumps(rows[0]), json.dumps(rows[1]), f"ratio {device / host:.0f}x", flush=True)
    return rows


def main(a: Args) -> list[dict]:
    import jax
    import jax.numpy as jnp

    from fused.llm.config import LLMConfig
    from fused.text.prompt import prompt_parts
    from llm_jax.config import Qwen3Config
    from llm_jax.tokenizer import load_tokenizer

    if a.render_states < 1:  # (the LLM rows' mean prompt length is measured on these states)
        raise SystemExit(f"error: --render-states {a.render_states}: at least 1")
    setup_compilation_cache()
    if a.model == "tiny":
        weights = Path(tempfile.mkdtemp(prefix="fused-bench-")) / "tiny-qwen3"
        build_checkpoint(weights)
        qcfg, weights = Qwen3Config.from_folder(weights), str(weights)
        model_kw = {"weights": weights}
    else:
        if a.vllm:
            raise SystemExit("--vllm needs --model tiny (a checkpoint the server can load)")
        qcfg, weights = Qwen3Config.shape(a.model), None
        model_kw = {"random_model": a.model}
    layer = qcfg.num_layers if a.layer is None else a.layer
    rows = render_rows(a, weights)
    mean_tokens = rows[1]["mean_tokens"]

    def llm_cfg(skip, form="auto", refresh=0):
        return LLMConfig(backend="jax", skip_n=skip, post_norm=True, layer=a.layer, dtype=a.dtype,
                         microbatch=a.microbatch, refresh_batch=refresh,
                         encode_lengths=a.encode_lengths,
                         refresh_on_reset=a.refresh_on_reset,
                         attention=form, **model_kw)

    def fused_extra(form="auto", refresh=0):
        return {"backend": "jax", "model": a.model, "layer": layer, "dtype": a.dtype,
                "encode_lengths": list(a.encode_lengths),
                "refresh_on_reset": a.refresh_on_reset, "refresh_batch": refresh or "auto",
                # the LLM calls all run after the cached prompt prefix
                "attention": resolve_form(form, jnp.dtype(a.dtype), prefix=True)}

    never = None
    if a.plain and 0 in a.skip_n:  # the pair whose ratio is a target: timed chunk for chunk
        plain_run, never_run = time_pair(a, [train_cfg(a), train_cfg(a, llm_cfg(0))],
                                         a.pair_rounds)
        timing = {"timing": "chunks alternating with the other of plain PPO / fused never"}
        rows.append(plain_run.row(a, "ppo", None, backend="none", **timing))
        print(json.dumps(rows[-1]), flush=True)
        never = never_run.row(a, "fused", 0, **fused_extra(), **timing)
    elif a.plain:
        rows.append(time_config(a, train_cfg(a), "ppo", skip_n=None, backend="none"))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[-1]["steps_per_s"] if a.plain else None
    peak = matmul_flops(a.dtype)
    parts = prompt_parts(load_tokenizer(weights), a.env)
    seq = mean_tokens + len(parts.tail)
    per_token = qcfg.flops_per_token(layer, len(parts.prefix), seq)
    per_seq = seq * per_token
    # Without calls no attention runs: skip_n 0 once, whatever the forms.
    traced = False
    for skip, form, rb in [(s, f, r) for s in a.skip_n
                           for f in (a.attention if s else a.attention[:1])
                           for r in (a.refresh_batch if s else a.refresh_batch[:1])]:
        if skip == 0 and never is not None:  # timed above, in turn with plain PPO
            row = never
        else:
            trace = a.trace if skip and not traced else None
            traced |= trace is not None
            row = time_config(a, train_cfg(a, llm_cfg(skip, form, rb)), "fused", skip_n=skip,
                              trace=trace, **fused_extra(form, rb))
        if base:
            row["vs_ppo"] = row["steps_per_s"] / base
        if skip:
            row["llm_flops_per_step"] = per_seq / skip
            row["llm_flop_bound_steps_per_s"] = peak * skip / per_seq
            row["fraction_of_flop_bound"] = row["steps_per_s"] / row["llm_flop_bound_steps_per_s"]
            # LLM FLOPs actually executed (full calls + refreshes, from the token count) / time.
            row["llm_mfu"] = row["llm_tokens"] * per_token / row["seconds"] / peak
        rows.append(row)
        print(json.dumps(row), flush=True)  # each row once whole (bench/gpu_check.py reads them)
        if a.out:  # after every row: a run cut short keeps what it measured
            atomic_write_json(a.out, rows)
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
                print(json.dumps(row), flush=True)
        finally:
            os.killpg(proc.pid, 15)
    rows.append({"name": "machine", "graphs": a.graphs, "matmul_flops_per_s": peak,
                 "matmul_dtype": a.dtype,
                 "devices": str(jax.devices()),
                 "cpu_count": os.cpu_count(), "prefix_tokens": len(parts.prefix),
                 "tail_tokens": len(parts.tail), "model": qcfg.__dict__})
    print(json.dumps(rows[-1]), flush=True)
    if a.out:
        atomic_write_json(a.out, rows)
        print(f"wrote {a.out}")
    return rows


if __name__ == "__main__":
    main(tyro.cli(Args))
