"""AWR update throughput, our jitted chunk vs the same update in PyTorch, one process:
`python bench/offline_sps.py --out F.json` (torch comes with the test extras).

Both sides: the online actor-critic (separate tanh MLPs, `--width` x `--layers`, obs of the
env's size), AWR loss (centred advantage, exp(A / 10) clipped at 20, critic 0.5 (R - V)^2), Adam,
global-norm clipping, minibatches of `--batch` rows sampled from `--rows` rows held in memory
(ours: on the device, sampled inside the chunk; torch: a tensor indexed per step). Rows:
`awr_jax`, `awr_torch` (samples/s, median of repeats after a warm-up; `gflops`: the update's
matmul FLOPs per second, `of_peak`: that over the machine's f32 matmul peak), `matmul_peak`
(GFLOP/s of a 2,048-square f32 matmul, XLA and torch, the best of repeats: what this CPU can
do), `machine`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import tyro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fused.commands.process import setup_compilation_cache  # noqa: E402
from fused.runs.files import atomic_write_json  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Args:
    env: str = "Craftax-Classic-Symbolic-v1"
    """Env whose observation size the network takes."""
    width: int = 512
    """MLP width (the prior AWR's)."""
    layers: int = 3
    """Hidden layers of actor and critic."""
    batch: int = 256
    """Rows per update."""
    rows: int = 65536
    """Rows of synthetic data held in memory."""
    updates: int = 200
    """Updates per timed repeat."""
    repeats: int = 5
    """Timed repeats (median)."""
    out: str | None = None
    """Write the rows here as JSON."""


def emit(rows, row):
    rows.append(row)
    print(json.dumps(row), flush=True)


def update_flops(a: Args, obs_dim: int, num_actions: int) -> float:
    """Matmul FLOPs of one AWR update per sample: forward, weight gradients, and input gradients
    of every layer but the first (the data needs none)."""
    def macs(out):
        dims = [obs_dim] + [a.width] * a.layers + [out]
        return [i * o for i, o in zip(dims[:-1], dims[1:])]

    layers = macs(num_actions) + macs(1)
    first = macs(num_actions)[0] + macs(1)[0]
    return 2.0 * (3 * sum(layers) - first)


def peak_row(n: int = 2048, repeats: int = 10) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    x = np.random.default_rng(0).normal(size=(n, n)).astype(np.float32)
    f = jax.jit(lambda a, b: a @ b)
    xj = jnp.asarray(x)
    f(xj, xj).block_until_ready()
    xt = torch.from_numpy(x)
    best = {"jax": 0.0, "torch": 0.0}
    for _ in range(repeats):
        t = time.perf_counter()
        f(xj, xj).block_until_ready()
        best["jax"] = max(best["jax"], 2 * n ** 3 / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        torch.mm(xt, xt)
        best["torch"] = max(best["torch"], 2 * n ** 3 / (time.perf_counter() - t) / 1e9)
    return {"name": "matmul_peak", "n": n, "gflops_jax": best["jax"],
            "gflops_torch": best["torch"], "gflops": max(best.values())}


def jax_row(a: Args, obs_dim: int, num_actions: int, data) -> dict:
    import jax
    import jax.numpy as jnp
    import optax

    from fused.rl.awr import AWRSettings, make_offline_train
    from fused.rl.networks import ActorCritic

    net = ActorCritic(num_actions, a.width, a.layers)
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(3e-4))
    trainer = make_offline_train(net, AWRSettings("awr", 10.0, 20.0, 1.0), tx, a.batch,
                                 a.updates, 10 ** 9, lambda rows, d, n: rows["obs"])
    dev = jax.device_put({"rows": data, "valid_index": jnp.arange(a.rows, dtype=jnp.int32),
                          "num_valid": jnp.int32(a.rows)})
    state = jax.jit(trainer.init)(jax.random.PRNGKey(0), jnp.zeros((1, obs_dim)))
    chunk = jax.jit(trainer.chunk, donate_argnums=0)
    t = time.perf_counter()
    state, m = jax.block_until_ready(chunk(state, dev))
    compile_s = time.perf_counter() - t
    times = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        state, m = jax.block_until_ready(chunk(state, dev))
        times.append(time.perf_counter() - t)
    dt = statistics.median(times)
    return {"name": "awr_jax", "samples_per_s": a.batch * a.updates / dt, "compile_s": compile_s,
            "final_loss": float(m["loss"][-1])}


def torch_row(a: Args, obs_dim: int, num_actions: int, data) -> dict:
    import torch

    torch.set_num_threads(os.cpu_count() or 1)

    def mlp(out):
        layers, d = [], obs_dim
        for _ in range(a.layers):
            layers += [torch.nn.Linear(d, a.width), torch.nn.Tanh()]
            d = a.width
        return torch.nn.Sequential(*layers, torch.nn.Linear(d, out))

    actor, critic = mlp(num_actions), mlp(1)
    params = list(actor.parameters()) + list(critic.parameters())
    opt = torch.optim.Adam(params, lr=3e-4)
    obs = torch.from_numpy(data["obs"])
    action = torch.from_numpy(data["action"]).long()
    rtg = torch.from_numpy(data["rtg"])
    gen = torch.Generator().manual_seed(0)

    def update():
        idx = torch.randint(0, a.rows, (a.batch,), generator=gen)
        x, act, r = obs[idx], action[idx], rtg[idx]
        logits, value = actor(x), critic(x)[:, 0]
        adv = (r - value).detach()
        w = torch.clamp(torch.exp((adv - adv.mean()) / 10.0), max=20.0)
        logp = torch.log_softmax(logits, -1).gather(1, act[:, None])[:, 0]
        loss = -(w * logp).mean() + 0.5 * ((r - value) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss

    for _ in range(20):
        update()
    times = []
    for _ in range(a.repeats):
        t = time.perf_counter()
        for _ in range(a.updates):
            loss = update()
        times.append(time.perf_counter() - t)
    dt = statistics.median(times)
    return {"name": "awr_torch", "samples_per_s": a.batch * a.updates / dt,
            "final_loss": float(loss), "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def main(a: Args) -> list[dict]:
    import numpy as np

    from fused.envspec import spec

    setup_compilation_cache()
    s = spec(a.env)
    rng = np.random.default_rng(0)
    data = {"obs": (rng.random((a.rows, s.obs_dim)) < 0.05).astype(np.float32),
            "action": rng.integers(0, s.num_actions, a.rows).astype(np.int32),
            "rtg": rng.normal(size=a.rows).astype(np.float32)}
    rows: list[dict] = []
    common = {"env": a.env, "obs_dim": s.obs_dim, "width": a.width, "layers": a.layers,
              "batch": a.batch}
    emit(rows, dict(jax_row(a, s.obs_dim, s.num_actions, data), **common))
    time.sleep(1.0)
    emit(rows, dict(torch_row(a, s.obs_dim, s.num_actions, data), **common))
    emit(rows, peak_row())
    flops = update_flops(a, s.obs_dim, s.num_actions)
    for r in rows[:2]:
        r["gflops"] = r["samples_per_s"] * flops / 1e9
        r["of_peak"] = r["gflops"] / rows[2]["gflops"]
    ratio = rows[0]["samples_per_s"] / rows[1]["samples_per_s"]
    rows[0]["vs_torch"] = ratio
    print(f"jax / torch = {ratio:.2f}x; of this CPU's matmul peak ({rows[2]['gflops']:.0f} "
          f"GFLOP/s): jax {rows[0]['of_peak']:.0%}, torch {rows[1]['of_peak']:.0%}", flush=True)
    import jax

    emit(rows, {"name": "machine", "devices": str(jax.devices()), "cpu_count": os.cpu_count()})
    if a.out:
        atomic_write_json(a.out, rows)
    return rows


if __name__ == "__main__":
    main(tyro.cli(Args))
