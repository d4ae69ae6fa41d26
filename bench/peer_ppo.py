"""The public Craftax PPO (Craftax_Baselines `ppo.py`, fetched, never committed) timed on any
env at any sizes: `python bench/peer_ppo.py ENV NUM_ENVS [--num-steps 64 --update-epochs 4
--num-minibatches 8 --width 512 --updates 2 6 --repeats 2]`, with its code on the path (the
peer venv of ../shared/peers/setup.sh, or `.peers/craftax_baselines` on the GPU machine; PEER
overrides). Its `make_train` runs unchanged with the prior config's other settings (lr 2e-4,
lambda 0.8, optimistic resets ratio 16); it picks the CNN for pixel envs itself. steps/s from the
difference of two update counts (init and compile excluded), the best of `--repeats` runs each;
one JSON row."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("env")
    ap.add_argument("num_envs", type=int)
    ap.add_argument("--num-steps", type=int, default=64)
    ap.add_argument("--update-epochs", type=int, default=4)
    ap.add_argument("--num-minibatches", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--updates", type=int, nargs=2, default=(2, 6))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--target", choices=("h100", "h200"),
                    help="compile for this GPU on this machine (XLA:GPU without a device, "
                         "bench/gpu_target.py) and print its memory instead of timing")
    a = ap.parse_args(argv)
    device = None
    if a.target:
        sys.path.insert(0, str(ROOT / "bench"))
        import gpu_target

        device = gpu_target.use(a.target)
    peer = os.environ.get("PEER") or next(
        (str(p) for p in (ROOT / ".peers" / "craftax_baselines",
                          Path.home() / ".cache/peers/craftax_baselines")
         if (p / "ppo.py").is_file()), None)
    if peer is None:
        sys.exit("error: the public ppo.py is not here: run scripts/gpu_prepare.sh GIT_DIR "
                 "(.peers/) or ../shared/peers/setup.sh GIT_DIR (~/.cache/peers/), or set PEER")
    sys.path.insert(0, peer)
    import jax
    import jax.core
    import jax.interpreters.xla
    from jax._src import core

    # tensorflow-probability 0.25 (distrax's backend, the newest release) reads aliases that
    # jax >= 0.10 no longer exports (xla's) or deprecated (core's): restored, the same objects
    for module, name in ((jax.interpreters.xla, "pytype_aval_mappings"),
                         (jax.core, "pytype_aval_mappings"), (jax.core, "Tracer")):
        try:
            getattr(module, name)
        except AttributeError:
            setattr(module, name, getattr(core, name))
    from ppo import make_train

    base = dict(ENV_NAME=a.env, NUM_ENVS=a.num_envs, NUM_STEPS=a.num_steps,
                UPDATE_EPOCHS=a.update_epochs, NUM_MINIBATCHES=a.num_minibatches, LR=2e-4,
                GAMMA=0.99, GAE_LAMBDA=0.8, CLIP_EPS=0.2, ENT_COEF=0.01, VF_COEF=0.5,
                MAX_GRAD_NORM=1.0, ANNEAL_LR=True, DEBUG=False, USE_WANDB=False,
                SAVE_POLICY=False, NUM_REPEATS=1, LAYER_SIZE=a.width, USE_OPTIMISTIC_RESETS=True,
                OPTIMISTIC_RESET_RATIO=16, EXPLORATION_UPDATE_EPOCHS=4, ICM_REWARD_COEFF=1.0,
                TRAIN_ICM=False, ICM_LR=3e-4, ICM_FORWARD_LOSS_COEF=1.0,
                ICM_INVERSE_LOSS_COEF=1.0, ICM_LAYER_SIZE=256, ICM_LATENT_SIZE=32,
                E3B_REWARD_COEFF=1.0, USE_E3B=False, E3B_LAMBDA=0.1, SEED=0)
    lo, hi = a.updates
    if device is not None:  # the program of `lo` updates (its memory is any count's)
        import jax.numpy as jnp

        key = gpu_target.abstract(jax.ShapeDtypeStruct((2,), jnp.uint32), device)
        t0 = time.time()
        with gpu_target.as_gpu():
            compiled = jax.jit(make_train(dict(base, TOTAL_TIMESTEPS=lo * a.num_steps
                                               * a.num_envs))).lower(key).compile()
        print(json.dumps({"name": "public_ppo_memory", "env": a.env, "num_envs": a.num_envs,
                          "num_steps": a.num_steps, "update_epochs": a.update_epochs,
                          "num_minibatches": a.num_minibatches, "width": a.width,
                          "backend": a.target, "compile_s": round(time.time() - t0, 1),
                          **gpu_target.memory(compiled, a.target)}))
        return
    times = {}
    for u in (lo, hi):
        cfg = dict(base, TOTAL_TIMESTEPS=u * a.num_steps * a.num_envs)
        t0 = time.time()
        compiled = jax.jit(make_train(cfg)).lower(jax.random.PRNGKey(0)).compile()
        comp = time.time() - t0
        mem = compiled.memory_analysis()
        if mem is not None:  # XLA's buffer assignment: what the program asks of the device
            print(f"updates={u} temporaries {mem.temp_size_in_bytes / 1e9:.2f} GB", flush=True)
        best = float("inf")
        for r in range(a.repeats):
            t0 = time.time()
            jax.block_until_ready(compiled(jax.random.PRNGKey(r)))
            best = min(best, time.time() - t0)
        times[u] = best
        print(f"updates={u} compile {comp:.0f}s run {best:.1f}s", flush=True)
    sps = (hi - lo) * a.num_steps * a.num_envs / (times[hi] - times[lo])
    print(json.dumps({"name": "public_ppo", "env": a.env, "num_envs": a.num_envs,
                      "num_steps": a.num_steps, "update_epochs": a.update_epochs,
                      "num_minibatches": a.num_minibatches, "width": a.width,
                      "device": jax.devices()[0].device_kind, "steps_per_s": sps}))


if __name__ == "__main__":
    main()
