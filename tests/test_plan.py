"""GPU programs accounted for and predicted on this CPU: bench/hlo_cost.py's kernels, bytes and
FLOPs on HLO written by hand, gpu_target's reading of XLA's thunk sequence (CUDA graphs),
bench/gpu_predict.py's fit on rows made from known figures, and `train.py --plan`."""

import json
import re
import subprocess
import sys

import pytest

from command_runner import run_command
from conftest import ROOT, subprocess_env

sys.path.insert(0, str(ROOT / "bench"))

PLUGIN = pytest.mark.skipif(not (ROOT / ".gpu-aot" / "jax_plugins").is_dir(),
                            reason="the CUDA plugin is not installed: python bench/gpu_target.py "
                                   "install (.ci/run does)")

# A loop of 5 steps over a [100, 8] float32 buffer: each step reads one row through a slice,
# writes one row in place, multiplies [16, 32] x [32, 64] in bf16 (65,536 FLOPs) and takes one
# of two branches (1 copy of 32 bytes, or 2); after the loop one copy of the buffer (3,200
# bytes each way).
HLO = """HloModule m

%fused_row (p0: f32[100,8], p1: s32[]) -> f32[1,8] {
  %p0 = f32[100,8]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %ds = f32[1,8]{1,0} dynamic-slice(%p0, %p1, %z), dynamic_slice_sizes={1,8}
}

%fused_put (q0: f32[100,8], q1: f32[1,8], q2: s32[]) -> f32[100,8] {
  %q0 = f32[100,8]{1,0} parameter(0)
  %q1 = f32[1,8]{1,0} parameter(1)
  %q2 = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %dus = f32[100,8]{1,0} dynamic-update-slice(%q0, %q1, %q2, %z)
}

%gemm_computation (a: bf16[16,32], b: bf16[32,64]) -> bf16[16,64] {
  %a = bf16[16,32]{1,0} parameter(0)
  %b = bf16[32,64]{1,0} parameter(1)
  ROOT %d = bf16[16,64]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%two (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %c1 = f32[8]{0} copy(%x)
  ROOT %c2 = f32[8]{0} copy(%c1)
}

%one (y: f32[8]) -> f32[8] {
  %y = f32[8]{0} parameter(0)
  ROOT %c = f32[8]{0} copy(%y)
}

%body (t: (s32[], f32[100,8], bf16[16,32], bf16[32,64], f32[8])) -> (s32[], f32[100,8], bf16[16,32], bf16[32,64], f32[8]) {
  %t = (s32[], f32[100,8]{1,0}, bf16[16,32]{1,0}, bf16[32,64]{1,0}, f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %buf = f32[100,8]{1,0} get-tuple-element(%t), index=1
  %a = bf16[16,32]{1,0} get-tuple-element(%t), index=2
  %b = bf16[32,64]{1,0} get-tuple-element(%t), index=3
  %v = f32[8]{0} get-tuple-element(%t), index=4
  %row = f32[1,8]{1,0} fusion(%buf, %i), kind=kLoop, calls=%fused_row
  %new = f32[100,8]{1,0} fusion(%buf, %row, %i), kind=kLoop, calls=%fused_put
  %mm = bf16[16,64]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm_computation, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %w = f32[8]{0} conditional(%i, %v, %v), branch_computations={%one, %two}
  ROOT %out = (s32[], f32[100,8]{1,0}, bf16[16,32]{1,0}, bf16[32,64]{1,0}, f32[8]{0}) tuple(%i, %new, %a, %b, %w)
}

ENTRY %main (e0: f32[100,8], e1: bf16[16,32], e2: bf16[32,64], e3: f32[8]) -> f32[100,8] {
  %e0 = f32[100,8]{1,0} parameter(0)
  %e1 = bf16[16,32]{1,0} parameter(1)
  %e2 = bf16[32,64]{1,0} parameter(2)
  %e3 = f32[8]{0} parameter(3)
  %z = s32[] constant(0)
  %t = (s32[], f32[100,8]{1,0}, bf16[16,32]{1,0}, bf16[32,64]{1,0}, f32[8]{0}) tuple(%z, %e0, %e1, %e2, %e3)
  %l = (s32[], f32[100,8]{1,0}, bf16[16,32]{1,0}, bf16[32,64]{1,0}, f32[8]{0}) while(%t), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  %r = f32[100,8]{1,0} get-tuple-element(%l), index=1
  ROOT %c = f32[100,8]{1,0} copy(%r)
}
"""


def test_hlo_cost_counts_kinds_bytes_flops_and_branches():
    """A loop iteration: 2 fusions, 1 GEMM, the conditional and its heaviest branch's 2 copies
    (6; 5 at the lightest); a slice read counts the row, an in-place update the update, the
    GEMM 2 * 16 * 64 * 32 FLOPs in bf16; a run: 5 iterations and the last copy."""
    import hlo_cost

    prog = hlo_cost.parse(HLO)
    (loop,) = hlo_cost.loops(prog)
    assert loop["trip_count"] == 5 and loop["exact"]
    assert (loop["kernels"], loop["kernels_max"], loop["kernels_min"]) == (6, 6, 5)
    assert loop["by_kind"] == {"copy": 2, "fusion": 2, "gemm": 1, "conditional": 1}
    # the row read (and its index) and written; the update read and written in place; the
    # GEMM's operands and result; two copies of 32 bytes each way
    step_bytes = (32 + 4 + 32) + (32 + 4 + 32) + (1024 + 4096 + 2048) + 2 * 2 * 32
    assert loop["bytes"] == step_bytes and loop["flops"] == 2 * 16 * 64 * 32
    gemm = next(k for k in hlo_cost.launches(prog, loop["body"]) if k.kind == "gemm")
    assert gemm.math == "bf16"
    run = hlo_cost.summary(hlo_cost.launches(prog, prog.entry))
    assert run["kernels"] == 5 * 6 + 1 and run["bytes"] == 5 * step_bytes + 2 * 3200
    # an even share of the two branches: 1.5 copies an iteration
    half = hlo_cost.summary(hlo_cost.launches(prog, loop["body"], lambda i, s: [0.5, 0.5]))
    assert half["by_kind"]["copy"] == 1.5
    # without a known trip count: counted once, its condition too, and said to be inexact
    unknown = HLO.replace(', backend_config={"known_trip_count":{"n":"5"}}', "")
    unknown = unknown.replace("ENTRY %main", "%cond (k: (s32[], f32[100,8], bf16[16,32], "
                              "bf16[32,64], f32[8])) -> pred[] {\n  %k = (s32[], f32[100,8]{1,0}"
                              ", bf16[16,32]{1,0}, bf16[32,64]{1,0}, f32[8]{0}) parameter(0)\n"
                              "  ROOT %p = pred[] fusion(%k), kind=kLoop, calls=%one\n}\n\n"
                              "ENTRY %main")
    prog = hlo_cost.parse(unknown)
    (loop,) = hlo_cost.loops(prog)
    assert loop["exact"] and loop["trip_count"] is None  # (an iteration is known)
    inexact = []
    run = hlo_cost.launches(prog, prog.entry, hlo_cost.heaviest, inexact)
    assert inexact == ["l"] and hlo_cost.summary(run)["kernels"] == 1 + 6 + 1


def test_hlo_cost_names_where_copies_come_from():
    """A copy of a loop-carried element is named by its slot; another by the innermost frame
    of ours in the stack tables XLA prints."""
    import hlo_cost

    text = HLO.replace("%w = f32[8]{0} conditional(%i, %v, %v), branch_computations={%one, %two}",
                       "%w = f32[8]{0} copy(%v)\n  %u = f32[1,8]{1,0} copy(%row), "
                       "metadata={op_name=\"x\" stack_frame_id=2}")
    text += ("\nFileNames\n1 \"/site-packages/jax/core.py\"\n2 \"/repo/fused/rl/acting.py\"\n\n"
             "FunctionNames\n1 \"bind\"\n2 \"act\"\n\nFileLocations\n"
             "1 {file_name_id=2 function_name_id=2 line=7 end_line=7 column=1 end_column=2}\n"
             "2 {file_name_id=1 function_name_id=1 line=9 end_line=9 column=1 end_column=2}\n\n"
             "StackFrames\n1 {file_location_id=1 parent_frame_id=1}\n"
             "2 {file_location_id=2 parent_frame_id=2}\n")
    prog = hlo_cost.parse(text)
    (loop,) = hlo_cost.loops(prog)
    got = hlo_cost.copy_sources(prog, loop["body"], lambda f: "/fused/" in f)
    assert got == {"carried[4] f32[8]": 1, "/repo/fused/rl/acting.py:act:7": 1}


def test_thunk_summary_reads_command_buffers(tmp_path):
    """XLA's thunk sequence (as `xla_dump_to` writes it): a loop run from the host around a
    graph, or the whole program one graph with the loop inside."""
    import gpu_target

    host = """000: kCopy         [source | next=001 (1)] kCopy
001: kWhile        [prev=000 (1) | next=010 (1)]
condition:
    004: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1]
  body:
    000: kCommandBuffer [source | sink]
        005: kCustomKernel [source | next=006 (1)] gemm_fusion_dot grid: [1024, 1, 1]
        006: kCustomKernel [prev=005 (1) | sink] loop_add_fusion grid: [128, 1, 1]
010: kCustomKernel [prev=003 (1) | sink] input_reduce_fusion_1 grid: [1, 1, 1]
"""
    graph = "000: kCommandBuffer [source | sink]\n" + "".join(
        "    " + line + "\n" for line in host.replace("    000: kCommandBuffer [source | sink]\n",
                                                      "").splitlines())
    for name, text in (("host", host), ("graph", graph)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "m.thunk_sequence_after_thunk_passes.txt").write_text(text)
    assert gpu_target.thunk_summary(str(tmp_path / "host")) == {
        "command_buffers": 1, "launches_outside": 3, "while_host": 1, "while_in_graph": 0,
        "conditional_host": 0, "conditional_in_graph": 0, "top_level": 3}
    assert gpu_target.thunk_summary(str(tmp_path / "graph")) == {
        "command_buffers": 1, "launches_outside": 0, "while_host": 0, "while_in_graph": 1,
        "conditional_host": 0, "conditional_in_graph": 0, "top_level": 1}


def test_predictor_recovers_a_known_fit_and_leaves_rows_out():
    """Rows whose rates a known fit made (launch-, bandwidth- and FLOP-bound programs) are fitted
    back to within 1% and each left-out row is predicted within 2%; a kernel takes the longest
    of its three times."""
    import gpu_predict

    true = gpu_predict.Fit(3e-6, 0.6, 0.5)
    profiles = {  # [kind, bytes, flops, math, launches]
        "launches": [["fusion", 1e3, 0, None, 1000]],
        "bytes": [["gemm", 3e9, 1e9, "bf16", 10], ["fusion", 1e3, 0, None, 100]],
        "flops": [["gemm", 1e8, 4e14, "bf16", 5], ["fusion", 1e5, 0, None, 50]],
        "mixed": [["fusion", 2e8, 0, None, 30], ["gemm", 1e7, 2e13, "tf32", 20]],
        "small": [["copy", 1e4, 0, None, 7], ["gemm", 1e9, 1e13, "bf16", 3]],
    }
    rows = {n: {"profile": p, "profile_units": 1000.0, "unit": "steps"}
            for n, p in profiles.items()}
    measured = [{"program": n, "target": "h200", "source": "-", "commit": "-",
                 "rate": 1000.0 / gpu_predict.seconds(p, "h200", true)}
                for n, p in profiles.items()]
    pairs = gpu_predict.pairs_of(measured, rows)
    fit = gpu_predict.fit_rows(pairs)
    for m, r in pairs:
        assert gpu_predict.rate(r, "h200", fit) == pytest.approx(m["rate"], rel=0.01)
    assert all(abs(t["error_left_out"]) < 0.02 for t in gpu_predict.leave_one_out(pairs))
    one = [["gemm", 4.8e12, 0, None, 1]]  # 1 s at the data sheet's 4.8 TB/s, 2 s at half of it
    assert gpu_predict.seconds(one, "h200", gpu_predict.Fit(1e-6, 0.5, 1.0)) == pytest.approx(2)
    assert gpu_predict.bound_by(profiles["launches"], "h200", true) == {
        "launches": 1.0, "bytes": 0.0, "flops": 0.0}


def test_plan_refuses_bad_cards_in_one_line():
    """`--plan` without a card, or with one we do not describe: one line naming the choices,
    before anything compiles (in process: bench/plan.py; and through train.py)."""
    import plan

    for argv, says in ((["smoke", "--plan"], "--plan needs a card: h100 or h200"),
                       (["smoke", "--plan", "h300"], "--plan h300: not a card we describe; "
                                                     "one of h100, h200"),
                       (["--plan=a100", "smoke"], "--plan a100: not a card")):
        with pytest.raises(SystemExit, match=says):
            plan.split_plan(argv)
    assert plan.split_plan(["smoke", "--plan", "h100", "--seed", "3"]) == (
        "h100", ["smoke", "--seed", "3"])
    fitted = {"fitted_rows": 6, "max_abs_error_left_out": 0.554, "median_abs_error_left_out": 0.14,
              "rows": [{"program": "x"}]}
    assert plan.predicted_note(fitted) == (
        "(predicted, not measured: a kernel-time model fitted on 6 H200 runs; each, left out of "
        "the fit, was predicted within 55% (median 14%); bench/gpu_predict.py)")
    p = run_command([sys.executable, "train.py", "smoke", "--plan", "h300"], cwd=ROOT,
                    env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and p.stderr.strip().splitlines() == [
        "error: --plan h300: not a card we describe; one of h100, h200"]


@PLUGIN
def test_loops_go_into_cuda_graphs_when_asked():
    """A small program (a scan whose outputs are stacked at the loop's counter: a dynamic-slice
    copy; a GEMM and a cuDNN convolution an iteration; then a scan of nothing stacked) compiled
    here for an H200 through `loop_jit`, as our commands compile their loops: XLA's default runs
    both loops from the host; `loops` puts the second inside a graph and leaves the stacking one
    on the host, its body a graph; `unrolled` makes the whole program one graph with both loops
    inside. Each setting compiles the same kernels (its loops' kernels by kind). On this CPU
    `loop_jit` passes XLA no option at all. The kernel accounting sees the first loop's 5
    trips."""
    code = """
import json, sys, tempfile
sys.path.insert(0, "bench")
import gpu_target, hlo_cost
dev = gpu_target.use("h200")
import jax, jax.numpy as jnp
from llm_jax.graphs import loop_jit
def f(x, w, k):
    def body(x, i):
        y = jnp.tanh(x @ w) + jnp.sin(x) * i
        y = y + jax.lax.conv(y[None, None], k, (1, 1), "SAME")[0, 0]
        return y / (1 + jnp.abs(y).sum()), x
    x, xs = jax.lax.scan(body, x, jnp.arange(5.0))
    x, _ = jax.lax.scan(lambda c, _: (c * 1.01 + jnp.sin(c), None), x, None, length=7)
    return x, xs
shapes = (jax.ShapeDtypeStruct((64, 256), jnp.float32),
          jax.ShapeDtypeStruct((256, 256), jnp.float32),
          jax.ShapeDtypeStruct((1, 1, 3, 3), jnp.float32))
args = gpu_target.abstract(shapes, dev)
out = {}
with gpu_target.as_gpu():
    for name in ("default", "loops", "unrolled"):
        with tempfile.TemporaryDirectory() as d:
            c = loop_jit(f, name, compiler_options={"xla_dump_to": d}).lower(*args).compile()
            out[name] = gpu_target.thunk_summary(d)
            out["kernels_" + name] = [(lp["trip_count"], lp["by_kind"])
                                      for lp in hlo_cost.loops(hlo_cost.parse(c.as_text()))]
out["loops_hlo"] = hlo_cost.loops(hlo_cost.parse(c.as_text()))
out["cpu_options"] = loop_jit(f, "unrolled").lower(*shapes)._lowering._compiler_options_kvs
print(json.dumps(out))
"""
    env = subprocess_env()
    env.pop("XLA_FLAGS", None)  # (the tests' --xla_backend_optimization_level=0 skips the passes)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["default"]["while_host"] == 2 and out["default"]["while_in_graph"] == 0
    assert out["loops"]["while_host"] == 1 and out["loops"]["while_in_graph"] == 1
    assert out["loops"]["command_buffers"] >= 1 and out["loops"]["launches_outside"] <= 1
    assert out["unrolled"]["top_level"] == 1 and out["unrolled"]["while_in_graph"] == 2
    assert out["unrolled"]["while_host"] == 0 and out["unrolled"]["launches_outside"] == 0
    assert out["cpu_options"] == []
    assert out["kernels_default"] == out["kernels_loops"] == out["kernels_unrolled"]
    stacked = [lp for lp in out["loops_hlo"] if lp["trip_count"] == 5]
    assert len(stacked) == 1 and stacked[0]["by_kind"].get("gemm") == 1
    assert stacked[0]["by_kind"].get("conv") == 1


def test_graph_settings_and_the_plan_line(monkeypatch):
    """The three settings' XLA options (hand-written here), a bad one refused on every backend,
    `--cuda-graphs` parsed into a run's config (the same three names as llm_jax's), and the
    plan's line from a thunk summary."""
    import typing

    import plan

    from fused.commands.train import load_config
    from fused.runs.settings import CudaGraphs
    from llm_jax.graphs import GRAPHS, compiler_options, loop_jit

    captured = ("FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONVOLUTION,WHILE,CONDITIONAL,"
                "DYNAMIC_SLICE_FUSION")
    assert compiler_options("default") == {}
    assert compiler_options("loops") == {"xla_gpu_enable_command_buffer": captured,
                                         "xla_gpu_graph_min_graph_size": 1,
                                         "xla_gpu_command_buffer_unroll_loops": False}
    assert compiler_options("unrolled")["xla_gpu_command_buffer_unroll_loops"] is True
    with pytest.raises(ValueError, match="cuda graphs 'all': one of loops, unrolled, default"):
        loop_jit(lambda x: x, "all")
    assert typing.get_args(typing.get_args(CudaGraphs)[0]) == GRAPHS
    assert load_config(["smoke"])[0].cuda_graphs == "loops"
    assert load_config(["smoke", "--cuda-graphs", "unrolled"])[0].cuda_graphs == "unrolled"
    # label.py label's batches (an imagination's decode loop inside) compile through loop_jit
    import types

    import fused.data.labelling as labelling
    from fused.commands.label import parse

    _, lc = parse(["label", "--data", "d", "--cuda-graphs", "unrolled"])
    asked = []
    monkeypatch.setattr(labelling, "loop_jit", lambda fn, graphs: asked.append(graphs) or fn)
    fake = types.SimpleNamespace(tokenizer=None, frozen=None, batching=lambda n: types.
                                 SimpleNamespace(microbatch=n))
    labelling.BatchEncoder(fake, lc, num_devices=1)
    assert asked == ["unrolled"]
    t = {"command_buffers": 13, "launches_outside": 5, "while_host": 5, "while_in_graph": 32,
         "conditional_host": 1, "conditional_in_graph": 3, "top_level": 2}
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    assert plan.graphs_line("loops", t) == (
        "  CUDA graphs (--cuda-graphs loops): 13 graphs, 32 loops inside them, 5 from the "
        "host, 5 launches alone (the prediction assumes XLA's default launching, as the runs "
        "fitted)")
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    assert "not read (XLA_FLAGS' --xla_backend_optimization_level=0 skips" in (
        plan.graphs_line("loops", t))


def test_a_refused_graph_is_one_line(monkeypatch):
    """A GPU's driver refusing the CUDA graph a `--cuda-graphs` setting asked for (as one
    refused `unrolled`'s, at the program's first call) ends every command in one line naming the
    settings to use; any other error keeps its traceback."""
    import jax

    import llm_jax.__main__ as llm_cli
    from fused.commands import label, offline, play, process, train

    said = ("INTERNAL: Failed to create a child graph node: CUDA_ERROR_NOT_SUPPORTED: "
            "operation not supported\n(in jit_chunk)")

    def fails(error):
        def main():
            raise error
        return main

    with pytest.raises(SystemExit) as e:
        process.ends_in_one_line(fails(jax.errors.JaxRuntimeError(said)))()
    line = str(e.value.code)
    assert line.count("\n") == 0 and line.startswith("error: the GPU's driver refused a CUDA "
                                                    "graph of this program (INTERNAL: Failed")
    assert line.endswith("; run it with --cuda-graphs loops or --cuda-graphs default")
    other = jax.errors.JaxRuntimeError("INTERNAL: CUDA_ERROR_OUT_OF_MEMORY: out of memory")
    with pytest.raises(jax.errors.JaxRuntimeError, match="OUT_OF_MEMORY"):
        process.ends_in_one_line(fails(other))()
    wrapped = process.ends_in_one_line(fails(other)).__code__
    assert all(m.main.__code__ is wrapped for m in (train, label, offline, play))
    monkeypatch.setattr(llm_cli, "run_generate", lambda cmd: fails(
        jax.errors.JaxRuntimeError(said))())  # (python -m llm_jax: its decode loop's graphs)
    with pytest.raises(SystemExit) as e:
        llm_cli.main(["generate", "--weights", "w", "--prompt", "hi", "--max-new-tokens", "2",
                      "--out", "g.json"])
    assert str(e.value.code) == line


@PLUGIN
@pytest.mark.slow
def test_train_plan_prints_a_predicted_plan(tmp_path):
    """`train.py smoke --plan h200` compiles the smoke run for an H200 here (~80 s on 2 cores)
    and prints that it fits, its kernels a step and its predicted speed, marked as predicted;
    nothing is trained (no run folder)."""
    runs = tmp_path / "runs"
    p = run_command([sys.executable, "train.py", "smoke", "--out-dir", str(runs), "--plan",
                     "h200"], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True,
                    timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    assert "plan for one NVIDIA H200 (h200)" in out and ": fits in the 75%" in out
    assert "a rollout step with its resets" in out and "an update epoch" in out
    # (the suite's flags skip the passes that form the graphs)
    assert "  CUDA graphs (--cuda-graphs loops): not read (XLA_FLAGS' " in out
    assert "env steps/s" in out and re.search(r"\(predicted, not measured: a kernel-time model "
                                               r"fitted on \d+ H200 runs; each, left out", out)
    assert not runs.exists()
