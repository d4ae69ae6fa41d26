"""The commands (train, label, offline, play). Importing this package sets what XLA's CPU
compiler must not do in a command's process, before any backend starts (Craftax makes arrays as
it is imported): XLA's YNNPACK reduce fusions, on by default in jax 0.10, are off
(`--xla_cpu_experimental_ynn_fusion_type=-reduce`; matmuls keep theirs). Under vmap they summed
rows wrongly past the eighth of a batch: Craftax-Classic's terrain noise came out wrong for
every env after the eighth of a vmapped reset (a world unlike Craftax's own; tests/test_envs.py
checks the worlds against one env's reset and the noise against numpy), and a reset of 1,024
envs took ~100x longer (docs/BENCHMARKS.md). XLA_FLAGS that name the option keep theirs."""

import os

YNN_REDUCE_OFF = "--xla_cpu_experimental_ynn_fusion_type=-reduce"

if "xla_cpu_experimental_ynn_fusion_type" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(
        f for f in (os.environ.get("XLA_FLAGS", "").strip(), YNN_REDUCE_OFF) if f)
