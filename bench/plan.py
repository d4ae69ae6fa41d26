"""`train.py PRESET [flags] --plan h100|h200`: the run's chunk compiled here for that GPU (no GPU
needed, nothing runs), then whether it fits the card's memory, the kernels a rollout step and an
update launch, and its predicted steps/s and wall time from the fit of bench/gpu_predict.py
(docs/gpu/predictor.json), marked as predicted with the fit's left-out error."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import gpu_target  # noqa: E402

FIT = ROOT / "docs/gpu/predictor.json"


def split_plan(argv: list[str]) -> tuple[str, list[str]]:
    """(the card after --plan, the other arguments); one line naming the fix when it is not a
    card we describe."""
    rest, target = [], None
    it = iter(argv)
    for a in it:
        if a == "--plan":
            target = next(it, None)
            if target is None or target.startswith("-"):
                raise SystemExit(f"error: --plan needs a card: {' or '.join(gpu_target.TARGETS)}")
        elif a.startswith("--plan="):
            target = a.split("=", 1)[1]
        else:
            rest.append(a)
    if target not in gpu_target.TARGETS:
        raise SystemExit(f"error: --plan {target}: not a card we describe; one of "
                         f"{', '.join(gpu_target.TARGETS)}")
    return target, rest


def load_fit(path: Path = FIT) -> dict:
    if not path.is_file():
        raise SystemExit(f"error: no predictor fit at {path}: write it with `python "
                         "bench/gpu_predict.py --out docs/gpu/predictor.json`")
    return json.loads(path.read_text())


def plan_lines(cfg, target: str, device, fitted: dict) -> list[str]:
    """The plan of training config `cfg` on one `target` card, as printed lines."""
    import gpu_predict
    import gpu_report
    import hlo_cost

    m = cfg.llm
    llm = m.active_backend == "jax" and not m.constant_hidden
    if llm and m.attention == "auto":  # what a GPU picks after the prompt prefix ("auto" here
        # would take the blocked form: cuDNN's probe fails without a device)
        cfg = dataclasses.replace(cfg, llm=dataclasses.replace(m, attention="pallas"))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as dump:
        compiled = gpu_report.compile_train(cfg, device, {"xla_dump_to": dump})
        graphs = gpu_target.thunk_summary(dump)
    compile_s = time.perf_counter() - t0
    prog = hlo_cost.parse(compiled.as_text())
    # an LLM's calls at their interval, refreshes and lengths as measured at 1,024 envs
    weights = gpu_report.fused_weights(m.skip_n, 0.22, 4, 2) if llm else hlo_cost.heaviest
    p, e, b = cfg.ppo.num_steps, cfg.ppo.update_epochs, cfg.ppo.num_minibatches
    named = gpu_report.ppo_loops(p, e, b)(hlo_cost.loops(prog, weights))
    run = hlo_cost.launches(prog, prog.entry, weights)
    fit = gpu_predict.Fit(**fitted["fit"])
    update_s = gpu_predict.seconds(gpu_report.profile(run), target, fit) / cfg.updates_per_chunk
    sps = cfg.steps_per_update / update_s
    mem = gpu_target.memory(compiled, target)
    kind = gpu_target.TARGETS[target][0]
    fits = mem["fits_at_fraction"]["0.75"]
    step, epoch = named.get("rollout step"), named.get("update epoch")
    hours = cfg.num_updates * update_s / 3600
    bound = gpu_predict.bound_by(gpu_report.profile(run), target, fit)
    lines = [
        f"plan for one {kind} ({target}): compiled here in {compile_s:.0f} s, nothing run",
        f"  {cfg.env.name}: {cfg.env.num_envs:,} envs x {p} steps, {e} epochs x {b} "
        f"minibatches, {cfg.num_updates:,} updates ({cfg.num_updates * cfg.steps_per_update:,} "
        "env steps)" + (f", an LLM every {m.skip_n} steps" if llm else ""),
        f"  memory: peak {mem['peak_gb']:.1f} GB of the card's "
        f"{gpu_target.TARGETS[target][1] / 1e9:.1f} ({mem['peak_of_card']:.0%}): "
        + ("fits" if fits else "does NOT fit")
        + " in the 75% JAX takes by default",
    ]
    if step:
        lines.append(f"  kernels: {step['kernels']:,.0f} a rollout step with its resets "
                     f"({step['kernels_min']:,.0f} without), "
                     + (f"{epoch['kernels']:,.0f} an update epoch, " if epoch else "")
                     + f"{sum(run.values()) / cfg.updates_per_chunk:,.0f} an update")
    lines.append(graphs_line(cfg.cuda_graphs, graphs))
    lines += [
        f"  predicted: {sps:,.0f} env steps/s ({update_s:.3f} s an update), "
        f"{hours:,.2f} h for the run (compilation apart); the time set by launches "
        f"{bound['launches']:.0%}, bytes {bound['bytes']:.0%}, FLOPs {bound['flops']:.0%}",
        f"  {predicted_note(fitted)}",
    ]
    return lines


def graphs_line(setting: str, t: dict) -> str:
    """How the chunk's kernels launch (`thunk_summary` of its compile), in a line."""
    head = f"  CUDA graphs (--cuda-graphs {setting}): "
    if "--xla_backend_optimization_level=0" in os.environ.get("XLA_FLAGS", ""):
        return head + "not read (XLA_FLAGS' --xla_backend_optimization_level=0 skips the passes "
        "that form them)"
    if "error" in t:
        return head + t["error"]
    return head + (f"{t['command_buffers']:,} graphs, {t['while_in_graph']:,} loops inside them, "
                   f"{t['while_host']:,} from the host, {t['launches_outside']:,} launches alone "
                   "(the prediction assumes XLA's default launching, as the runs fitted)")


def predicted_note(fitted: dict) -> str:
    """What a plan's figures are: predictions, with the fit's size and its left-out errors."""
    return (f"(predicted, not measured: a kernel-time model fitted on {fitted['fitted_rows']} "
            f"H200 runs; each, left out of the fit, was predicted within "
            f"{fitted['max_abs_error_left_out']:.0%} (median "
            f"{fitted['median_abs_error_left_out']:.0%}); bench/gpu_predict.py)")


def main(argv: list[str]) -> None:
    """`train.py ... --plan CARD`: print the plan; bad input is one line."""
    target, rest = split_plan(argv)
    fitted = load_fit()
    device = gpu_target.use(target)  # before anything starts jax's backends
    from fused.commands.train import load_config, validate
    from fused.errors import ConfigError

    try:
        cfg, _ = load_config(rest)
        validate(cfg)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    for line in plan_lines(cfg, target, device, fitted):
        print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
