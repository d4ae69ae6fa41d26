"""The commands (train, label, offline, play). Importing this package sets what XLA's CPU
compiler must not do, for every backend not yet started (in a command's process: all of them,
as this package is imported before Craftax, which makes arrays as it is imported): XLA's
YNNPACK reduce fusions, on by default in jax 0.10, are off
(`--xla_cpu_experimental_ynn_fusion_type=-reduce`; matmuls keep theirs). In Craftax-Classic's
terrain noise they summed wrongly past the eighth row of a vmapped batch: every env after the
eighth of a vmapped reset got a world unlike Craftax's own (tests/test_envs.py checks the
worlds against one env's reset and the noise against numpy), and slowly (docs/BENCHMARKS.md,
"Worlds on a CPU"). XLA_FLAGS that name the option keep theirs."""

import os

YNN_REDUCE_OFF = "--xla_cpu_experimental_ynn_fusion_type=-reduce"

if "xla_cpu_experimental_ynn_fusion_type" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(
        f for f in (os.environ.get("XLA_FLAGS", "").strip(), YNN_REDUCE_OFF) if f)
