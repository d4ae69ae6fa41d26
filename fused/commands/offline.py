"""Offline RL on label.py datasets, and unbiased evaluation of any run's policy.

    python offline.py awr|bc [PRESET] --data D [--labels NAME] --out-dir DIR --run-name NAME
    python offline.py eval --run R --episodes N --seed K      (train.py run folders too)
    python offline.py study --data D --labels NAME            plain vs augmented, 3 seeds each
    python offline.py probe --run R                           LLM-reliance probes

`awr` / `bc` train the online agent's own networks (plain, or LLM-augmented on the label set
NAME) in jitted chunks of minibatch updates sampled on the device, with train.py's run folder,
checkpoints, exact resume (`--resume RUN`), metrics, curve and wandb. `eval` plays N whole
episodes from fixed seeds and writes R/eval.json. `python offline.py awr --help` lists every flag.
"""

from __future__ import annotations

import dataclasses
import sys

from rich.console import Console

from fused.commands import process
from fused.commands.offline_eval import EvalConfig, evaluate
from fused.commands.offline_probe import ProbeConfig, run_probe
from fused.commands.offline_study import StudyConfig, run_study
from fused.commands.offline_train import (PRESETS, RESUME_FIXED, OfflineConfig, build, train,
                                          validate)
from fused.errors import ConfigError
from fused.runs import config_io
from fused.runs.files import require_writable
from fused.runs.interrupts import exit_now
from fused.runs.run_dir import RunDir, default_name
from fused.runs.invocation import command

DESCRIPTIONS = {"awr": "Advantage-weighted regression on a dataset.",
                "bc": "Behaviour cloning on a dataset.",
                "eval": "Play N whole episodes from fixed seeds with a run's policy.",
                "study": "Plain vs LLM-augmented AWR (and BC), several seeds each, evaluated "
                         "alike: one comparison table.",
                "probe": "Value and action changes of a run's policy on edited states, under "
                         "real, ablated and counterfactual hidden states."}


def resume_arg(argv: list[str]) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith("--resume="):
            return a.split("=", 1)[1]
        if a == "--resume" and i + 1 < len(argv):
            return argv[i + 1]
    return None


def parse_train(cmd: str, argv: list[str]):
    """The config (the command sets `algo`) and, when resuming, what the flags changed."""
    resume = resume_arg(argv)
    if resume is None:
        cfg = config_io.parse(OfflineConfig, PRESETS, "cpu", argv, DESCRIPTIONS[cmd],
                              f"{command('offline.py')} {cmd}")
        return dataclasses.replace(cfg, algo=cmd), {}
    cfg, changed = config_io.resume(OfflineConfig, RunDir.reopen(resume).config_path, argv,
                                    PRESETS, RESUME_FIXED)
    if cfg.algo != cmd:
        raise ConfigError(f"--resume {resume} is an `{cfg.algo}` run; resume it with "
                          f"`{command('offline.py')} {cfg.algo} --resume {resume}`")
    return cfg, changed


def evaluation(cmd: str, rest: list[str], prog: str, console):
    """eval, probe or study; Ctrl-C is one line (exit 130): their results are written whole,
    each when it is done, so what had finished is kept (a study's rerun skips it)."""
    Config, go = {"eval": (EvalConfig, evaluate), "probe": (ProbeConfig, run_probe),
                  "study": (StudyConfig, run_study)}[cmd]
    cfg = config_io.cli(Config, rest, DESCRIPTIONS[cmd], f"{prog} {cmd}")
    process.setup_compilation_cache()
    try:
        return go(cfg, console)
    except KeyboardInterrupt:
        console.print("\ninterrupted: what had finished is kept; run the same command again")
        exit_now(130)  # a compilation may still run in another thread


@process.ends_in_one_line
def main(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else argv
    console = Console(soft_wrap=True)
    process.one_line_warnings()
    process.log_to(console)
    prog = command("offline.py")
    process.subcommands(prog, DESCRIPTIONS, argv)
    cmd, rest = argv[0], argv[1:]
    try:
        if cmd in ("eval", "probe", "study"):
            return evaluation(cmd, rest, prog, console)
        cfg, changed = parse_train(cmd, rest)
        validate(cfg)
        require_writable(cfg.resume or cfg.out_dir, "--resume" if cfg.resume else "--out-dir")
        process.setup_compilation_cache()
        run = (RunDir.reopen(cfg.resume) if cfg.resume else RunDir.create(
            cfg.out_dir, cfg.run_name or default_name(
                "offline", cfg.algo, cfg.labels or "plain", f"s{cfg.seed}")))
        run.check_total(cfg.num_updates, f"--num-updates {cfg.num_updates:,}")
        off = build(cfg)  # reads the dataset: its problems are one-line errors here
    except ConfigError as e:
        sys.exit(f"error: {e}")
    for k, (old, new) in changed.items():
        console.print(f"resume: {k} {old!r} -> {new!r}")
    return train(off, run, console)


cli = process.console_script(main)  # craftax-offline


if __name__ == "__main__":
    main()
