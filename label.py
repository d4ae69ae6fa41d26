"""Trajectory datasets and LLM labels: `python label.py generate|label|returns ...`.

    python label.py generate [PRESET] --out D --policy random|RUN_DIR --env.name E \\
        --num-envs N --steps S --seed K          roll out a policy, write shards of episodes
    python label.py label --data D --name LABELS --llm.weights DIR --llm.layer L \\
        [--llm.skip-n K]                         hidden states of every (K-th) observation
    python label.py returns --data D --gamma G  returns-to-go across ordered shards

Every command resumes: run it again after a kill and it finishes, writing the same bytes.
Several hosts: set JAX's cluster variables (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID) and start the same command on each; process i takes its share of the work.
`python label.py generate --help` (and label, returns) lists every flag.
"""

from __future__ import annotations

import dataclasses
import errno
import sys

import tyro
from rich.console import Console

from fused.config import ConfigError, EnvSettings
from fused.data.config import (GenerateConfig, LabelConfig, ReturnsConfig, validate_generate,
                               validate_label, validate_returns)
from fused.runs import config_io

GENERATE_PRESETS: dict[str, tuple[str, GenerateConfig]] = {
    "cpu": ("Default: Craftax-Classic-Symbolic, 64 envs x 1,024 steps (65k transitions).",
            GenerateConfig(out="", env=EnvSettings(name="Craftax-Classic-Symbolic-v1",
                                                   reset_pool=8))),
    "smoke": ("Seconds: 8 Classic envs x 64 steps, small shards (tests).",
              GenerateConfig(out="", env=EnvSettings(name="Craftax-Classic-Symbolic-v1",
                                                     reset_pool=2),
                             num_envs=8, steps=64, block_steps=16, shard_rows=128)),
    "symbolic": ("The prior system's shards: Craftax-Symbolic, 128 envs, 8,192-row shards.",
                 GenerateConfig(out="", num_envs=128, steps=64 * 128)),
}
DESCRIPTIONS = {"generate": "Roll out a policy and write a trajectory dataset.",
                "label": "Write an LLM's hidden states of a dataset's observations.",
                "returns": "Write returns-to-go of a dataset's rows."}


def parse(argv: list[str]):
    if not argv or argv[0] not in DESCRIPTIONS:
        sys.exit("usage: python label.py generate|label|returns [--flags] (--help for each)")
    cmd, rest = argv[0], argv[1:]
    if cmd == "generate":
        cfg = config_io.parse(GenerateConfig, GENERATE_PRESETS, "cpu", rest, DESCRIPTIONS[cmd])
        if not cfg.out:
            policy = "random" if cfg.policy == "random" else cfg.policy.rstrip("/").split("/")[-1]
            cfg = dataclasses.replace(cfg, out=f"datasets/{cfg.env.name}-{policy}-s{cfg.seed}")
        return cmd, cfg
    cls = LabelConfig if cmd == "label" else ReturnsConfig
    return cmd, tyro.cli(cls, args=rest, description=DESCRIPTIONS[cmd])


def main(argv: list[str] | None = None):
    console = Console(soft_wrap=True)
    cmd, cfg = parse(sys.argv[1:] if argv is None else argv)
    from fused.runs.cluster import initialize
    from fused.runs.files import setup_compilation_cache

    try:
        setup_compilation_cache()
        initialize()
        import jax

        devices = getattr(cfg, "num_devices", None) or jax.local_device_count()
        if devices > jax.local_device_count():
            raise ConfigError(f"num_devices={devices} but this process sees "
                              f"{jax.local_device_count()} devices")
        if cmd == "generate":
            validate_generate(cfg, devices)
            from fused.data.generate import generate

            return generate(cfg, console)
        if cmd == "label":
            from fused.data.labelling import label
            from fused.data.store import Dataset

            validate_label(cfg, Dataset(cfg.data).card()["env"], devices)
            return label(cfg, console, devices)
        validate_returns(cfg)
        from fused.data.returns import compute_returns

        return compute_returns(cfg, console)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        sys.exit(f"error: disk full writing {e.filename or 'the dataset'}: free space and run the "
                 "same command again (committed shards are kept; nothing half-written counts)")


if __name__ == "__main__":
    main()
