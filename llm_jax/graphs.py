"""CUDA graphs for the programs built around loops (a PPO or AWR chunk's rollout and updates, an
evaluation's or a dataset's blocks of env steps, a decode loop): `loop_jit` is `jax.jit` with
XLA:GPU's command buffers set for the program when the backend is an NVIDIA GPU, and `jax.jit`
unchanged anywhere else (a CPU, a TPU, an AMD GPU). Here rather than in `fused` because the
decode loop, the lowest program that needs it, lives in llm_jax.

XLA:GPU forms command buffers (CUDA graphs: a sequence of kernels launched as one) by default,
but only of straight-line sequences of several kernels: each loop iteration and each branch of a
conditional is then a round trip to the host, and a loop's body (a Craftax step vmapped over the
envs: docs/BENCHMARKS.md counts its kernels) is launched graph by graph, kernel by kernel. The
settings:

  loops     loops and conditionals inside the graphs too (XLA's WHILE and CONDITIONAL commands),
            sequences of any length; a loop whose body reads or writes at its counter (a scan's
            stacked inputs and outputs: dynamic slices) stays a loop run from the host, its body
            graphs launched once an iteration. A graph holds at most the program's own kernels.
  unrolled  as `loops`, and such a loop unrolled into the graph (collectives and host callbacks
            still split a program); a graph then holds each iteration's kernels (trip count x
            body): far larger.
  default   XLA's own choice.

Only the launching changes: each setting compiles the program's own kernels (tests/test_plan.py
compares them on a small program). What a setting forms can be read without a GPU from XLA's
thunk sequence (`bench/gpu_target.py`'s `thunk_summary` of a program compiled for a GPU on a
CPU, as `train.py --plan` prints it); how fast each runs, and whether the numbers are equal bit
for bit, only on a GPU (`bench/ppo_sps.py --graphs`)."""

from __future__ import annotations

from typing import Literal, get_args

import jax

Graphs = Literal["loops", "unrolled", "default"]
GRAPHS: tuple[str, ...] = get_args(Graphs)

# The library calls and kernels XLA captures by default, with cuDNN's convolutions (Craftax's
# step has some) and its dynamic-slice copies, loops and conditionals; a graph of any length
# (XLA's default minimum leaves short bodies with no graph at all).
_CAPTURED = ("FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONVOLUTION,WHILE,CONDITIONAL,"
             "DYNAMIC_SLICE_FUSION")


def compiler_options(graphs: Graphs) -> dict:
    """XLA:GPU options of a setting (the module docstring); {} for `default`. For a GPU compile
    only."""
    if graphs not in GRAPHS:
        raise ValueError(f"cuda graphs {graphs!r}: one of {', '.join(GRAPHS)}")
    if graphs == "default":
        return {}
    return {"xla_gpu_enable_command_buffer": _CAPTURED, "xla_gpu_graph_min_graph_size": 1,
            "xla_gpu_command_buffer_unroll_loops": graphs == "unrolled"}


def loop_jit(fn, graphs: Graphs = "loops", **jit_kwargs):
    """`jax.jit(fn, **jit_kwargs)`, with `graphs`' options when the default backend is an
    NVIDIA GPU (asked when called: a command calls it after its devices are known; an AMD GPU
    gets `jax.jit` unchanged, as these options are not tried there)."""
    compiler_options(graphs)  # (a bad setting is an error on every backend)
    if jax.default_backend() in ("gpu", "cuda") and not _rocm():
        opts = compiler_options(graphs)
        if opts:
            jit_kwargs["compiler_options"] = {**opts, **jit_kwargs.get("compiler_options", {})}
    return jax.jit(fn, **jit_kwargs)


def refused(error: BaseException) -> str | None:
    """The one line a command ends in where a GPU's driver refused a CUDA graph XLA built for a
    setting (a driver refused `unrolled`'s graph of a PPO chunk:
    `CUDA_ERROR_NOT_SUPPORTED: Failed to create a child graph node`); None for any other error.
    """
    text = str(error)
    if "CUDA_ERROR_NOT_SUPPORTED" not in text or "graph" not in text.lower():
        return None
    said = " ".join(text.split())[:240]
    return (f"the GPU's driver refused a CUDA graph of this program ({said}); run it with "
            "--cuda-graphs loops or --cuda-graphs default")


def _rocm() -> bool:
    import jax.extend

    try:
        return "rocm" in jax.extend.backend.get_backend().platform_version.lower()
    except Exception:  # (no backend to ask: as on a compile-only device)
        return False
