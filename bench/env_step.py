"""Craftax's step and ours (`fused.envs`, `--impls fast`) side by side: env steps/s on this
machine, and the kernels a step launches compiled for a GPU, attributed to the game's functions.

    python bench/env_step.py --out rows.json                      steps/s here (CPU)
    python bench/env_step.py --target h200 --out kernels.json     kernels of a step, by part

Each row times (or compiles) one program: a `lax.scan` of `--scan-steps` steps of `jax.vmap` of
`CraftaxEnv.step` (what PPO's rollout, evaluation and `label.py generate` step) over `num_envs`
envs, random actions, no resets (ended episodes step on, as Craftax computes them all the same).
steps/s: the median of `--repeats` timed scans after a compile and `--warmup` scans, the impls
timed in turns (and the best scan, and steps per CPU-second of this process, all threads: other
processes on the machine slow some scans). Kernels
(`--target`, XLA:GPU without a device, bench/gpu_target.py): one iteration of that scan, counted
and attributed by `bench/kernel_attribution.py` (the function under `craftax_step` each kernel's
HLO metadata names; the observation; copies by why XLA made them)."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import tyro

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fused.runs.files import atomic_write_json  # noqa: E402

import gpu_target  # noqa: E402
import kernel_attribution  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Args:
    envs: tuple[str, ...] = ("Craftax-Classic-Symbolic-v1", "Craftax-Symbolic-v1")
    """Games to measure."""
    impls: tuple[str, ...] = ("craftax", "fast")
    """Step implementations (fused.envs.IMPLS); rows after the first carry their ratio to it."""
    env_counts: tuple[int, ...] = (64, 1024)
    """Envs stepped together (vmapped)."""
    scan_steps: int = 64
    """Steps per timed scan (with --target: per compiled scan, 8 is plenty)."""
    repeats: int = 5
    """Timed scans of each impl, in turns (median reported, and the best)."""
    warmup: int = 2
    """Untimed scans after the compile."""
    target: str | None = None
    """Compile for this GPU (h100, h200) instead of timing: kernels per step, by part."""
    out: str | None = None
    """Write the rows as a JSON list here."""


# The parts of a step, by the function `craftax_step` calls (Craftax's names and ours map to one
# part name), scoped (`kernel_attribution.scoped`) so each kernel's op_name names its part.
PARTS = {
    "change_floor": "floors (change_floor)",
    "do_crafting": "craft", "craft": "craft",
    "do_action": "do (mine, attack, eat, drink)", "do": "do (mine, attack, eat, drink)",
    "place_block": "place", "place": "place",
    "shoot_projectile": "shoot, cast", "cast_spell": "shoot, cast",
    "drink_potion": "potions, books, enchant", "read_book": "potions, books, enchant",
    "enchant": "potions, books, enchant",
    "boss_logic": "boss", "level_up_attributes": "attributes",
    "move_player": "movement", "move": "movement",
    "update_mobs": "mobs and projectiles (update_mobs)",
    "spawn_mobs": "mob spawns (spawn_mobs)",
    "update_plants": "plants", "grow_plants": "plants",
    "update_player_intrinsics": "intrinsics, health, inventory caps",
    "cap_inventory": "intrinsics, health, inventory caps",
    "update_health": "intrinsics, health, inventory caps",
    "clip_inventory_and_intrinsics": "intrinsics, health, inventory caps",
    "calculate_inventory_achievements": "achievements",
    "calculate_light_level": "light (calculate_light_level)",
    "array": "the maps written (Grid.array)",
}
STEP_MODULES = {  # module: its functions that craftax_step calls (scoped)
    "craftax.craftax_classic.game_logic": (
        "do_crafting", "do_action", "place_block", "move_player", "update_mobs", "spawn_mobs",
        "update_plants", "update_player_intrinsics", "cap_inventory", "update_health",
        "calculate_light_level"),
    "craftax.craftax.game_logic": (
        "change_floor", "do_crafting", "do_action", "place_block", "shoot_projectile",
        "cast_spell", "drink_potion", "read_book", "enchant", "boss_logic",
        "level_up_attributes", "move_player", "update_mobs", "spawn_mobs", "update_plants",
        "update_player_intrinsics", "clip_inventory_and_intrinsics",
        "calculate_inventory_achievements", "calculate_light_level"),
    "fused.envs.classic_step": (
        "craft", "do", "place", "move", "update_mobs", "spawn_mobs", "grow_plants",
        "update_player_intrinsics", "cap_inventory", "calculate_light_level", "craftax_step"),
    "fused.envs.full_step": (
        "change_floor", "do_crafting", "do_action", "place_block", "shoot_projectile",
        "cast_spell", "drink_potion", "read_book", "enchant", "boss_logic",
        "level_up_attributes", "move_player", "update_mobs", "spawn_mobs", "update_plants",
        "update_player_intrinsics", "clip_inventory_and_intrinsics",
        "calculate_inventory_achievements", "calculate_light_level", "craftax_step"),
    "craftax.craftax_classic.envs.craftax_symbolic_env": ("craftax_step",),
    "craftax.craftax_classic.envs.craftax_pixels_env": ("craftax_step",),
    "craftax.craftax.envs.craftax_symbolic_env": ("craftax_step",),
    "craftax.craftax.envs.craftax_pixels_env": ("craftax_step",),
}


def scope_steps() -> None:
    """Name every part of both implementations' steps in their kernels' op_names (once)."""
    import importlib

    from fused.envs.grid import Grid

    if getattr(scope_steps, "done", False):
        return
    for module, names in STEP_MODULES.items():
        kernel_attribution.scoped(importlib.import_module(module), names)
    kernel_attribution.scoped(Grid, ["array"])
    scope_steps.done = True


def part(where: tuple[str, ...]) -> str | None:
    """The part of the step a kernel's scopes (outermost first) name, or None (the loop's)."""
    if "craftax_step" in where:
        inner = where[where.index("craftax_step") + 1:]
        return next((PARTS[x] for x in inner if x in PARTS), "craftax_step itself (reward, time)")
    if "get_obs" in where:
        return "observation"
    if "step_env" in where:
        return "done, info (step_env)"
    return None


def step_program(env_name: str, impl: str, n: int, steps: int):
    """(run((obs, state), key) -> ((obs, state), ends), init(key) -> (obs, state)): `steps`
    vmapped steps."""
    import jax

    from fused.envspec import spec
    from fused.rl.env_api import strong_types
    from fused.rl.envs import CraftaxEnv

    scope_steps()
    env = CraftaxEnv(spec(env_name), impl=impl)
    kernel_attribution.scoped(env._env, ["step_env", "get_obs"])

    def body(carry, k):  # the observation is carried: computed, as a rollout stores it
        ka, ks = jax.random.split(k)
        a = jax.random.randint(ka, (n,), 0, env.num_actions)
        res = jax.vmap(env.step)(jax.random.split(ks, n), carry[1], a)
        return (res.obs, res.state), (res.terminated | res.truncated).sum()

    def run(carry, k):
        return jax.lax.scan(body, carry, jax.random.split(k, steps))

    def init(k):
        return strong_types(jax.vmap(env.reset)(jax.random.split(k, n)))

    return run, init


def kernel_row(args: Args, device, env_name: str, impl: str, n: int) -> dict:
    import jax
    import jax.numpy as jnp

    run, init = step_program(env_name, impl, n, min(args.scan_steps, 8))
    with gpu_target.as_gpu():
        state = gpu_target.abstract(jax.eval_shape(init, jax.random.PRNGKey(0)), device)
        key = gpu_target.abstract(jax.ShapeDtypeStruct((2,), jnp.uint32), device)
        t = time.perf_counter()
        hlo = jax.jit(run).lower(state, key).compile().as_text()
    kernels = kernel_attribution.attribute(hlo)
    total = sum(k.count for k in kernels)
    assert total == gpu_target.loop_kernels(hlo)[-1]["kernels"], "attribution lost kernels"
    table = kernel_attribution.table(kernels, part)
    return {"name": "kernels", "env": env_name, "impl": impl, "num_envs": n,
            "target": args.target, "kernels": total,
            "fusions": sum(k.count for k in kernels if k.opcode == "fusion"),
            "copies": sum(k.count for k in kernels if k.opcode == "copy"),
            "nested_loops": sum(1 for k in kernels if k.within) > 0,
            "compile_s": time.perf_counter() - t, "parts": table}


def speed_rows(args: Args, env_name: str, n: int) -> list[dict]:
    """Every impl compiled, then timed in turns (impl A's scan, B's, A's, ...): a machine whose
    load moves (other processes) slows both alike."""
    import jax

    progs = {}
    for impl in args.impls:
        run, init = step_program(env_name, impl, n, args.scan_steps)
        state = jax.block_until_ready(jax.jit(init)(jax.random.PRNGKey(0)))
        t = time.perf_counter()
        compiled = jax.jit(run).lower(state, jax.random.PRNGKey(1)).compile()
        compile_s = time.perf_counter() - t
        for i in range(args.warmup):
            state, _ = compiled(state, jax.random.PRNGKey(100 + i))
        progs[impl] = {"run": compiled, "state": state, "compile_s": compile_s, "times": [],
                       "cpu": [], "ends": 0}
    for i in range(args.repeats):
        for p in progs.values():
            t, c = time.perf_counter(), time.process_time()
            p["state"], done = jax.block_until_ready(p["run"](p["state"],
                                                               jax.random.PRNGKey(200 + i)))
            p["times"].append(time.perf_counter() - t)
            p["cpu"].append(time.process_time() - c)
            p["ends"] += int(done.sum())
    return [{"name": "env_step", "env": env_name, "impl": impl, "num_envs": n,
             "steps_per_s": args.scan_steps * n / statistics.median(p["times"]),
             "best_steps_per_s": args.scan_steps * n / min(p["times"]),
             "cpu_steps_per_s": args.scan_steps * n / statistics.median(p["cpu"]),
             "compile_s": p["compile_s"], "episode_ends": p["ends"]}
            for impl, p in progs.items()]


def main(args: Args) -> list[dict]:
    device = gpu_target.use(args.target) if args.target else None
    import jax

    if device is None:
        from fused.commands.process import setup_compilation_cache

        setup_compilation_cache()
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cpus, jax {jax.__version__}, target {args.target or 'none'}",
          flush=True)
    rows = []
    for env_name in args.envs:
        for n in args.env_counts:
            found = (speed_rows(args, env_name, n) if device is None else
                     [kernel_row(args, device, env_name, impl, n) for impl in args.impls])
            key = "kernels" if device is not None else "steps_per_s"
            for row in found:
                if row is not found[0]:
                    row[f"vs_{found[0]['impl']}"] = row[key] / found[0][key]
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "parts"}), flush=True)
                for p in row.get("parts", []):
                    print("   ", json.dumps(p), flush=True)
    if args.out:
        atomic_write_json(args.out, rows)
    return rows


if __name__ == "__main__":
    main(tyro.cli(Args))
