"""Trajectory datasets and LLM labels: `python label.py generate|label|returns ...`.

    python label.py generate [PRESET] --out D --policy random|RUN_DIR --env.name E \\
        --num-envs N --steps S --seed K          roll out a policy, write shards of episodes
    python label.py label --data D --name LABELS --llm.weights DIR --llm.layer L \\
        [--llm.skip-n K]                         hidden states of every (K-th) observation
    python label.py returns --data D --gamma G  returns-to-go across ordered shards
    python label.py verify --data D              every shard against the manifest (a table)

Every command resumes: run it again after a kill and it finishes, writing the same bytes; run
again over a damaged shard, it redoes that shard and keeps the rest.
Several hosts: set JAX's cluster variables (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID) and start the same command on each; process i takes its share of the work.
`python label.py generate --help` (and label, returns) lists every flag.
"""

from __future__ import annotations

import dataclasses
import errno
import shlex
import sys

import jax
from rich.console import Console
from rich.table import Table

from fused.commands import process
from fused.errors import ConfigError
from fused.data.config import (GENERATE_PRESETS, GenerateConfig, LabelConfig, ReturnsConfig,
                               validate_generate, validate_label, validate_returns)
from fused.data.generate import generate
from fused.data.labelling import label
from fused.data.returns import compute_returns
from fused.data.store import Dataset
from fused.data.verify import verify_dataset
from fused.runs import config_io
from fused.runs.files import require_writable
from fused.runs.interrupts import interrupts_exit
from fused.runs.invocation import command

DESCRIPTIONS = {"generate": "Roll out a policy and write a trajectory dataset.",
                "label": "Write an LLM's hidden states of a dataset's observations.",
                "returns": "Write returns-to-go of a dataset's rows.",
                "verify": "Check every shard of a dataset against its manifest (a table)."}


@dataclasses.dataclass(frozen=True)
class VerifyConfig:
    data: str
    """Dataset folder."""


def parse(argv: list[str]):
    prog = command("label.py")
    process.subcommands(prog, DESCRIPTIONS, argv)
    cmd, rest = argv[0], argv[1:]
    if cmd == "generate":
        cfg = config_io.parse(GenerateConfig, GENERATE_PRESETS, "cpu", rest, DESCRIPTIONS[cmd],
                              f"{prog} generate")
        if not cfg.out:
            policy = "random" if cfg.policy == "random" else cfg.policy.rstrip("/").split("/")[-1]
            cfg = dataclasses.replace(cfg, out=f"datasets/{cfg.env.name}-{policy}-s{cfg.seed}")
        return cmd, cfg
    cls = {"label": LabelConfig, "returns": ReturnsConfig, "verify": VerifyConfig}[cmd]
    return cmd, config_io.cli(cls, rest, DESCRIPTIONS[cmd], f"{prog} {cmd}")


@process.ends_in_one_line
def main(argv: list[str] | None = None):
    console = Console(soft_wrap=True)
    argv = sys.argv[1:] if argv is None else argv
    cmd, cfg = parse(argv)
    process.one_line_warnings()
    process.log_to(console)
    try:
        if cmd == "verify":
            sys.exit(verify(cfg, console))
        again = f"{command('label.py')} " + shlex.join(argv)
        with interrupts_exit(console, again):
            return run(cmd, cfg, console, again)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    except OSError as e:
        if e.errno == errno.ENOSPC:
            sys.exit(f"error: disk full writing {e.filename or 'the dataset'}: free space and "
                     "run the same command again (committed shards are kept; nothing "
                     "half-written counts)")
        if e.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            sys.exit(f"error: cannot write {e.filename or 'the dataset'} ({e.strerror}); fix "
                     "the permissions and run the same command again (committed shards are "
                     "kept)")
        raise


cli = process.console_script(main)  # craftax-label


def run(cmd: str, cfg, console: Console, again: str):
    process.setup_compilation_cache()
    process.join_cluster()
    devices = getattr(cfg, "num_devices", None) or jax.local_device_count()
    if devices > jax.local_device_count():
        raise ConfigError(f"num_devices={devices} but this process sees "
                          f"{jax.local_device_count()} devices")
    if cmd == "generate":
        validate_generate(cfg, devices)
        require_writable(cfg.out, "--out")
        return generate(cfg, console)
    ds = Dataset(cfg.data)
    card, _ = ds.card(), ds.manifest()  # a missing or broken dataset: one line, before work
    require_writable(cfg.data, "--data")
    if cmd == "label":
        validate_label(cfg, card["env"], devices)
        return label(cfg, console, devices, again)
    validate_returns(cfg)
    return compute_returns(cfg, console)


def verify(cfg: VerifyConfig, console: Console) -> int:
    """Prints the table; exit status 0 when every shard is good, 1 otherwise."""
    ds = Dataset(cfg.data)
    findings, commands = verify_dataset(ds)
    table = Table(title=str(ds.root))
    for col in ("part", "set", "shard", "rows", "status"):
        table.add_column(col)
    for f in findings:
        table.add_row(f.kind, f.set_name or "", f.shard, f"{f.rows:,}",
                      "ok" if f.problem is None else f"[red]{f.problem}[/]")
    console.print(table)
    bad = sum(f.problem is not None for f in findings)
    if not bad:
        console.print(f"ok: {len(findings)} shards verified")
        return 0
    console.print(f"{bad} of {len(findings)} shards bad; to repair: " + "; ".join(commands))
    return 1


if __name__ == "__main__":
    main()
