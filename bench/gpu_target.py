"""Compile for a GPU on a machine without one: XLA:GPU's own program and buffer assignment for an
H100 or H200, from jax's compile-only devices (PJRT's deviceless topology), so a GPU program's
memory and kernels are read here before device time is spent on them.

    python bench/gpu_target.py install     the CUDA plugin for this jax in .gpu-aot/ (~130 MB;
                                           apart from .venv, whose processes then never load it)
    python bench/ppo_sps.py --target h200 ...    (bench/peer_ppo.py, bench/decode_sps.py --shapes)
    python bench/gpu_target.py report --target h200   kernels, bytes, FLOPs and memory of each of
                                           our GPU programs (bench/gpu_report.py)

`use(name)` must run before jax picks its backends; it returns the compile-only device. While
tracing for it, `as_gpu()` makes `jax.default_backend()` answer "gpu", so code that picks a form
by backend (the CNN's lax.conv, attention's cuDNN / Pallas form) traces the GPU's form. Nothing
runs: compiled programs have no device to run on."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / ".gpu-aot"

# XLA's GpuTargetConfigProto: what the compiler would query from the device. Hopper SXM's
# figures (compute capability 9.0, 132 SMs, 228 KB of shared memory an SM, 50 MB of L2) and the
# H100's memory as XLA's deviceless examples give them (84.93 GB; our H100 run's memory check
# read 63.76 GB at JAX's 0.75: 85.0); the H200's 143,771 MiB as nvidia-smi reports it (from
# memory, not read on the lent machine); bandwidths from NVIDIA's data sheets; the runtime that
# of the GPU image (CUDA 13, cuDNN 9), and its driver's CUDA version (580: 13.0): without one XLA
# takes the driver as too old for CUDA graphs of loops, conditionals and library calls and
# leaves them out of the command buffers it forms.
_COMMON = """
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  driver_version: "13.0.0"
  runtime_version: "13.0.0"
  compile_time_toolkit_version: "13.0.0"
"""
TARGETS = {  # name: (device kind, memory in bytes, bandwidth in B/s)
    "h100": ("NVIDIA H100 80GB HBM3", 84_929_347_584, 3.35e12),
    "h200": ("NVIDIA H200", 150_754_820_096, 4.8e12),
}
# Dense tensor-core peaks by a matmul's input type (NVIDIA's data sheets, SXM; the same for both
# cards: the H200 is an H100 with more and faster memory), FLOP/s; "tf32": float32 matmuls at
# XLA's default precision; "f32": the CUDA cores.
PEAK_FLOPS = {name: {"bf16": 989.4e12, "tf32": 494.7e12, "fp8": 1978.9e12, "int8": 1978.9e12,
                     "f32": 66.9e12, "f64": 66.9e12} for name in TARGETS}


def target_config(name: str) -> str:
    kind, memory, bandwidth = TARGETS[name]
    return (f"gpu_device_info {{{_COMMON}\n  memory_bandwidth: {int(bandwidth)}\n"
            f"  device_memory_size: {memory}\n}}\nplatform_name: \"CUDA\"\n"
            f"dnn_version_info {{ major: 9 minor: 8 }}\n"
            f"runtime_version {{ major: 13 minor: 0 }}\ndevice_description_str: \"{kind}\"\n")


def install() -> None:
    """The CUDA 13 plugin of this jaxlib's version into .gpu-aot/, once (no CUDA libraries:
    compiling needs none)."""
    import shutil

    import jaxlib

    v = jaxlib.__version__
    if (SITE / f"jax_cuda13_plugin-{v}.dist-info").is_dir():
        return  # installed for this jaxlib
    tmp = SITE.with_name(SITE.name + ".tmp")  # whole or not at all: an interrupted install
    shutil.rmtree(tmp, ignore_errors=True)  # leaves no half plugin for `use` to find
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(tmp), f"jax-cuda13-plugin=={v}", f"jax-cuda13-pjrt=={v}"], check=True)
    shutil.rmtree(SITE, ignore_errors=True)  # another jaxlib's
    tmp.rename(SITE)


def use(name: str):
    """The compile-only device of target `name` (h100, h200); call before jax's backends start."""
    if name not in TARGETS:
        raise SystemExit(f"error: --target {name!r}: one of {', '.join(TARGETS)}")
    if not (SITE / "jax_plugins").is_dir():
        raise SystemExit("error: --target needs the CUDA plugin: run `python bench/gpu_target.py "
                         "install` (into .gpu-aot/, ~130 MB) first")
    os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"  # no CUDA libraries here, none needed
    sys.path.insert(0, str(SITE))
    import jax
    from jax.experimental import topologies

    jax.config.update("jax_platforms", "cpu")  # the plugin registers; no CUDA client starts
    jax.config.update("jax_enable_compilation_cache", False)  # nothing here runs these
    topo = topologies.get_topology_desc("cuda", "cuda", target_config=target_config(name),
                                        topology="1x1x1")
    return topo.devices[0]


@contextlib.contextmanager
def as_gpu():
    """Trace as on a GPU: `jax.default_backend()` answers "gpu" inside."""
    import jax

    real = jax.default_backend
    jax.default_backend = lambda: "gpu"
    try:
        yield
    finally:
        jax.default_backend = real


def abstract(tree, device):
    """`tree`'s arrays (or shapes) as shapes placed on `device`, for `jit(...).lower`."""
    import jax

    s = jax.sharding.SingleDeviceSharding(device)
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree)


def memory(compiled, target: str | None = None) -> dict:
    """XLA's buffer assignment of `compiled` in GB (arguments, outputs, temporaries, aliased)
    and, for a target, its peak (arguments + outputs + temporaries - aliased), the peak's share
    of the card's memory and whether it fits what a run may take of it
    (XLA_PYTHON_CLIENT_MEM_FRACTION: 0.75 by default, 0.92 in bench/gpu_check.py)."""
    m = compiled.memory_analysis()
    if m is None:
        return {}
    row = {f"{k}_gb": getattr(m, f"{k}_size_in_bytes") / 1e9
           for k in ("argument", "output", "temp", "alias")}
    if target is not None:
        peak = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
                - m.alias_size_in_bytes)
        card = TARGETS[target][1]
        row.update(target=target, peak_gb=peak / 1e9,
                   peak_of_card=round(peak / card, 3),
                   fits_at_fraction={str(f): peak <= f * card for f in (0.75, 0.92)})
    return row


def thunk_summary(dump_dir: str) -> dict:
    """How XLA:GPU runs a compiled program, from its thunk sequence after the thunk passes
    (compiled with `xla_dump_to=dump_dir`; the biggest module there; XLA_FLAGS'
    --xla_backend_optimization_level=0 skips the passes): `command_buffers` (CUDA graphs
    formed), `launches_outside` (kernels, copies and library calls launched one by one), loops
    and conditionals run from the host (`while_host`, `conditional_host`: each iteration or
    branch a host round trip) or inside a graph (`while_in_graph`, `conditional_in_graph`), and
    the thunks at the top level (`top_level`: 1 when the whole program is one graph)."""
    files = sorted(Path(dump_dir).glob("*thunk_sequence_after_thunk_passes.txt"),
                   key=lambda f: f.stat().st_size)
    # (XLA writes that file only when its passes changed the sequence: else the one before)
    files = files or sorted(Path(dump_dir).glob("*thunk_sequence.txt"),
                            key=lambda f: f.stat().st_size)
    if not files:
        return {"error": "XLA wrote no thunk sequence"}
    out = dict.fromkeys(("command_buffers", "launches_outside", "while_host", "while_in_graph",
                         "conditional_host", "conditional_in_graph", "top_level"), 0)
    stack: list[tuple[int, str]] = []  # (indent, kind) of the thunks enclosing this one
    for line in files[-1].read_text().splitlines():
        m = re.match(r"^( *)\d+: (k\w+)", line)
        if not m:
            continue
        indent, kind = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        in_graph = any(k == "kCommandBuffer" for _, k in stack)
        out["top_level"] += not stack
        if kind == "kCommandBuffer":
            out["command_buffers"] += 1
        elif kind in ("kWhile", "kConditional"):
            key = "while" if kind == "kWhile" else "conditional"
            out[f"{key}_{'in_graph' if in_graph else 'host'}"] += 1
        elif not in_graph and kind not in ("kSequential", "kDynamicSliceFusion"):
            out["launches_outside"] += 1
        stack.append((indent, kind))
    return out


_NOT_KERNELS = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
                "opt-barrier", "partition-id", "replica-id"}


def loop_kernels(hlo: str) -> list[dict]:
    """The kernels one iteration of each while loop launches, from the compiled program's text
    (`compiled.as_text()`): every instruction of its body but the bookkeeping that launches
    nothing (tuples, bitcasts, constants, ...), by opcode, a call's body inline, a loop nested in
    it counted times its trip count (`exact`: False where XLA does not know one, counted once,
    or where a conditional counts as one kernel); with the loop's own trip count where known.
    The loop's condition, run each iteration too, is not counted. A decode loop's body of `steps_per_check` iterations is one token's
    step."""
    comps: dict[str, list[str]] = {}
    cur = None
    for line in hlo.splitlines():
        m = re.match(r"^(?:ENTRY )?%(\S+) .*\{$", line)
        if m:
            cur = comps.setdefault(m.group(1), [])
        elif line.strip() == "}":
            cur = None
        elif cur is not None:
            cur.append(line)

    def trip(line):
        m = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
        return int(m.group(1)) if m else None

    def count(body: str) -> tuple[dict, bool]:
        ops: dict[str, int] = {}
        exact = True
        for x in comps.get(body, []):
            m = re.match(r"\s*(?:ROOT )?%\S+ = .*?\s([a-z][\w-]*)\(", x)  # shape, opcode(
            if m is None or m.group(1) in _NOT_KERNELS:
                continue
            if m.group(1) == "while":
                inner, inner_exact = count(re.search(r"body=%([^,\s]+)", x).group(1))
                n = trip(x)
                exact = exact and inner_exact and n is not None
                for k, v in inner.items():
                    ops[k] = ops.get(k, 0) + v * (n or 1)
            elif m.group(1) == "call" and "to_apply=" in x:  # its body, inline
                inner, inner_exact = count(re.search(r"to_apply=%([^,\s]+)", x).group(1))
                exact = exact and inner_exact
                for k, v in inner.items():
                    ops[k] = ops.get(k, 0) + v
            else:  # (a conditional counts as one, its branches not: `exact` then False)
                exact = exact and m.group(1) != "conditional"
                ops[m.group(1)] = ops.get(m.group(1), 0) + 1
        return ops, exact

    out = []
    for lines in comps.values():
        for line in lines:
            if " while(" in line:
                ops, exact = count(re.search(r"body=%([^,\s]+)", line).group(1))
                out.append({"kernels": sum(ops.values()), "by_op": ops, "exact": exact,
                            "trip_count": trip(line)})
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["report"]:  # kernel accounting of our programs (bench/gpu_report.py)
        sys.path.insert(0, str(ROOT / "bench"))
        import gpu_report

        sys.exit(gpu_report.main(sys.argv[2:]))
    if sys.argv[1:] != ["install"]:
        sys.exit(f"usage: python {sys.argv[0]} install | report --target h100|h200 [...]")
    try:
        install()
    except KeyboardInterrupt:
        sys.exit(f"interrupted: nothing installed in {SITE}; run it again")
    except subprocess.CalledProcessError as e:
        sys.exit(f"error: pip exited {e.returncode} (its message above); nothing installed in "
                 f"{SITE}")
    print(f"the CUDA plugin is in {SITE}: --target h100|h200 compiles for that GPU here")
