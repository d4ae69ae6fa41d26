"""The GPU check's CPU side: `bench/trace_report.py` on a hand-made GPU trace (figures computed
by hand) and on a real CPU trace, and `scripts/gpu_check.sh --cpu-smoke` (every step of the GPU
check at tiny shapes), so neither rots between GPU sessions."""

import gzip
import json
import subprocess
import sys

import pytest

from conftest import ROOT, subprocess_env

sys.path.insert(0, str(ROOT / "bench"))

from trace_report import main as trace_report_main, report  # noqa: E402


def gpu_trace() -> list[dict]:
    """One GPU, a compute stream with four kernels (llm, env, update, llm) and the lanes a
    kernel must not be counted from twice: XLA Ops (the same ops again) and XLA Modules (a
    program spanning all)."""
    meta = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "pid": 1, "tid": 7, "name": "thread_name",
             "args": {"name": "Stream #7(Compute)"}},
            {"ph": "M", "pid": 1, "tid": 8, "name": "thread_name", "args": {"name": "XLA Ops"}},
            {"ph": "M", "pid": 1, "tid": 9, "name": "thread_name",
             "args": {"name": "XLA Modules"}},
            {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}}]

    def k(ts, dur, op, scope, tid=7):
        return {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": f"kernel_{op}",
                "args": {"hlo_op": op, "tf_op": f"jit(chunk)/while/body/{scope}/dot_general"}}

    kernels = [k(0, 10, "fusion.1", "llm"), k(15, 5, "fusion.2", "env"),
               k(20, 20, "gemm.3", "update"), k(50, 10, "fusion.1", "llm")]
    return (meta + kernels + [dict(e, tid=8) for e in kernels]
            + [{"ph": "X", "pid": 1, "tid": 9, "ts": 0, "dur": 60, "name": "jit_chunk"},
               {"ph": "X", "pid": 2, "tid": 3, "ts": 0, "dur": 99, "name": "host work"}])


def test_trace_report_figures_by_hand():
    """Kernels of the stream lane only; busy 45 us of a 60 us span; gaps 5 (fusion.1 ->
    fusion.2) and 10 (gemm.3 -> fusion.1); per step over 2 steps: 2 kernels, 30 us, against a
    1 us bound (1e6 bytes at 1e12 B/s); by scope llm 20, update 20, env 5; top op fusion.1
    (2 x 10 us)."""
    r = report(gpu_trace(), steps=2, bytes_per_step=1e6, bandwidth=1e12)
    assert (r["device_events"], r["lanes"], r["busy_us"], r["span_us"]) == (4, 1, 45, 60)
    assert r["kernels_per_step"] == 2 and r["step_us"] == 30
    assert (r["idle_gaps"], r["idle_gaps_us"]) == (2, 15)
    assert r["largest_gaps"][0] == {"us": 10, "after": "gemm.3", "before": "fusion.1"}
    assert r["fraction_of_bandwidth_bound"] == pytest.approx(1 / 30)
    assert {k: v["us"] for k, v in r["by_scope"].items()} == {"llm": 20, "update": 20, "env": 5}
    assert r["top_ops"][0] == {"op": "fusion.1", "count": 2, "total_us": 20, "mean_us": 10,
                               "share_of_busy": pytest.approx(20 / 45)}


def test_trace_report_reads_a_cpu_trace_folder(tmp_path, capsys):
    """A real trace of a jitted function on this CPU (the folder jax.profiler writes): XLA's op
    events are found, the bookkeeping is not; --json writes the figures."""
    import jax
    import jax.numpy as jnp

    f = jax.jit(lambda x: jnp.tanh(x @ x).sum())
    x = jnp.ones((128, 128))
    f(x).block_until_ready()
    jax.profiler.start_trace(str(tmp_path / "prof"), create_perfetto_trace=True)
    for _ in range(3):
        f(x).block_until_ready()
    jax.profiler.stop_trace()
    r = trace_report_main([str(tmp_path / "prof"), "--steps", "3", "--json",
                           str(tmp_path / "r.json")])
    assert r["device_events"] >= 3 and r["kernels_per_step"] >= 1
    assert not any(o["op"].startswith(("Thunk", "ThreadpoolListener")) for o in r["top_ops"])
    assert json.loads((tmp_path / "r.json").read_text())["device_events"] == r["device_events"]
    assert "top ops" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no \\*.trace.json.gz"):
        trace_report_main([str(tmp_path / "empty")])  # a folder without a trace: one line


def test_decode_figures_are_none_where_noise_outweighs_the_steps():
    """bench/decode_sps.py's decode rate is (n - 1) steps over the n-token call less the 1-token
    call; where that difference is not positive (every row: ours, HF's, vLLM's) there is no
    figure, and a ratio over rounds leaves such rounds out (by hand: 8 x 31 / 0.5 = 496)."""
    from decode_sps import decode_rate, median_ratio

    assert decode_rate(8, 32, 0.25, 0.75) == 496
    assert decode_rate(8, 32, 0.75, 0.75) is None and decode_rate(8, 32, 0.8, 0.75) is None
    assert median_ratio([(2.0, 1.0), (-1.0, 1.0), (3.0, 0.0), (6.0, 2.0)]) == 2.5
    assert median_ratio([(1.0, -1.0)]) is None


@pytest.mark.slow
def test_gpu_check_cpu_smoke_runs_every_step(tmp_path):
    """`scripts/gpu_check.sh --cpu-smoke OUT`: every step of the GPU check at tiny shapes ends
    ok (the public PPO: ok, or skipped where its code or distrax is absent); rows carry the
    figures the GPU run reports; at most 8 files of at most 16 MB come back; both traces are
    read by the report."""
    out = tmp_path / "out"
    p = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), "--cpu-smoke", str(out)],
                       env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    files = list(out.iterdir())
    assert len(files) <= 8 and all(f.stat().st_size <= 16 * 2**20 for f in files), files
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    status = {r["step"]: r["status"] for r in rows if r["name"] == "step"}
    for public in ("ppo_public_1024", "ppo_pixels_public_1024"):
        assert status.pop(public) in ("ok", "skipped"), status
    assert set(status.values()) == {"ok"}, status
    assert {"decode_4b", "fused_0.6b_1024", "moe_30b_encode", "moe_30b_decode", "kernel",
            "ppo_ours_1024", "ppo_graphs_1024", "ppo_pixels_ours_1024", "vl_4b_1024"
            } <= set(status)
    by = {}
    for r in rows:
        by.setdefault((r.get("step"), r["name"]), []).append(r)
    decode = by[("decode_4b", "jax_gpu")]
    assert {r["steps_per_check"] for r in decode} == {1, 4}
    # each row a decode figure, or none where the n-token call was not slower than the 1-token
    # one (tiny shapes on a loaded machine), said so; at least one figure
    figures = [r for r in decode if r["decode_steps_per_s"] is not None]
    assert figures and all(0 < r["fraction_of_bound"] and r["decode_steps_per_s"] > 0
                           for r in figures)
    assert all("not slower" in r["note"] for r in decode if r not in figures)
    fused = by[("fused_0.6b_1024", "fused")][0]
    assert fused["steps_per_s"] > 0 and 0 < fused["fraction_of_flop_bound"]
    parity = by[("moe_30b_encode", "parity")][0]
    assert parity["max_rel_diff_tiled"] < 0.02 and parity["max_rel_diff_ragged"] < 0.02
    assert all(r["rel_err"] < 0.02 and r["finite"] for r in by[("kernel", "kernel")])
    assert by[("ppo_ours_1024", "ppo")][0]["steps_per_s"] > 0
    graphs = by[("ppo_graphs_1024", "ppo")]  # (on a CPU both settings are the same program)
    assert [r["graphs"] for r in graphs] == ["loops", "default"]
    assert graphs[0]["repeatable"] is True and graphs[1]["equal_to_loops"] is True
    assert by[("ppo_pixels_ours_1024", "ppo_cnn")][0]["steps_per_s"] > 0
    vl = by[("vl_4b_1024", "vl_gpu")][0]
    assert vl["finite"] and vl["frames_per_s"] > 0 and 0 < vl["mfu"] < 1
    assert vl["image_tokens"] == 72  # a 130 x 110 frame
    report_ = json.loads((out / "report.json").read_text())
    assert report_["decode"]["device_events"] > 0 and report_["fused"]["device_events"] > 0
    assert "fraction_of_bandwidth_bound" in report_["decode"]
    with gzip.open(out / "trace_decode.json.gz") as f:
        assert json.load(f)["traceEvents"]


def test_gpu_check_parts_pick_their_steps(tmp_path, monkeypatch):
    """`--part N` on a GPU runs that part's steps alone (here with no budget left, so each is
    skipped with a row naming it, and nothing compiles); every GPU step is in one of the five
    parts, and without `--part` every part runs; a step name that does not exist ends in one
    line listing the steps."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_check

    monkeypatch.setattr(gpu_check, "device_bandwidth", lambda: (4.8e12, "test"))
    seen = {}
    for part in (1, 2, 3, 4, 5):
        out = tmp_path / f"p{part}"
        assert gpu_check.main([str(out), "--part", str(part), "--budget", "1"]) == 0
        rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
        seen[part] = [r["step"] for r in rows if r["name"] == "step"]
        assert all(r["status"] == "skipped" for r in rows if r["name"] == "step")
    assert seen[1] == ["decode_4b", "fused_0.6b_1024", "kernel", "fused_4b_l24_128"]
    assert seen[4] == ["ppo_pixels_ours_1024", "ppo_pixels_public_1024",
                       "ppo_pixels_ours_1024_mb32", "ppo_pixels_public_1024_mb32"]
    assert seen[5] == ["vl_4b_1024"]
    gpu_steps = [s.name for s in gpu_check.STEPS if s.gpu is not None]
    assert sorted(sum(seen.values(), [])) == sorted(gpu_steps)
    assert gpu_check.main([str(tmp_path / "all"), "--budget", "1"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "all" / "rows.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["name"] == "step"] == gpu_steps
    with pytest.raises(SystemExit):
        gpu_check.main([str(tmp_path / "x"), "--only", "decode_4b", "nosuch"])


def test_gpu_check_table_is_whole():
    """Every row of the check's table names a script of bench/ with only the runner's
    placeholders ({out}, {bandwidth}) in its argv, under a positive box, in a known part;
    names are unique; each smoke form is of the same script as its GPU form."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_check

    names = [s.name for s in gpu_check.STEPS]
    assert len(set(names)) == len(names)
    for step in gpu_check.STEPS:
        assert step.part in gpu_check.PARTS, step
        for run in (step.gpu, step.smoke):
            if run is None:
                continue
            argv = [x.format(out="OUT", bandwidth=1.0) for x in run.argv]
            assert (ROOT / argv[0]).is_file() and run.box_s > 0, step
        assert step.smoke is None or step.smoke.argv[0] == step.gpu.argv[0], step


def test_gpu_check_keeps_traces_unless_a_limit_is_given(tmp_path):
    """A trace is read into the report either way; with `--max-trace-mb` it is deleted when
    over that size, without one it is kept whatever its size."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu_check

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"name": "trace", "steps": 2}) + "\n")
    trace = tmp_path / "trace_decode.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": gpu_trace()}, f)
    kept = gpu_check.reports(tmp_path, rows, None)
    assert trace.is_file() and kept["decode"]["kernels_per_step"] == 2
    dropped = gpu_check.reports(tmp_path, rows, 10.0)
    assert not trace.exists() and "dropped" in dropped["decode"]
    assert dropped["decode"]["device_events"] == 4


def test_loop_kernels_counts_a_hand_made_program():
    """bench/gpu_target.py's `loop_kernels` on HLO text written by hand: the outer loop (3
    trips) launches 2 fusions and 4 trips of an inner loop's 1 custom-call: 6 kernels an
    iteration, exact; the inner 1; the bookkeeping (parameters, get-tuple-element, tuple,
    constants, bitcasts) none. An inner loop without a known trip count is counted once and
    said to be so, as is a conditional (one kernel, its branches not counted)."""
    from gpu_target import loop_kernels

    def program(inner_trips: str, extra: str = "") -> str:
        return f"""HloModule m

%inner_body (p: (s32[], f32[8])) -> (s32[], f32[8]) {{
  %p = (s32[], f32[8]{{0}}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8]{{0}} get-tuple-element(%p), index=1
  %c = f32[8]{{0}} custom-call(%x), custom_call_target="k"
  ROOT %t = (s32[], f32[8]{{0}}) tuple(%i, %c)
}}

%outer_body (q: (s32[], f32[8])) -> (s32[], f32[8]) {{
  %q = (s32[], f32[8]{{0}}) parameter(0)
  %x = f32[8]{{0}} get-tuple-element(%q), index=1
  %f1 = f32[8]{{0}} fusion(%x), kind=kLoop, calls=%fa
  %b = f32[8]{{0}} bitcast(%f1)
  %one = s32[] constant(1)
  %f2 = f32[8]{{0}} fusion(%b), kind=kInput, calls=%fb{extra}
  %w = (s32[], f32[8]{{0}}) while(%q), condition=%cond, body=%inner_body{inner_trips}
  ROOT %t = (s32[], f32[8]{{0}}) tuple(%one, %f2)
}}

ENTRY %main (a: f32[8]) -> f32[8] {{
  %a = f32[8]{{0}} parameter(0)
  %z = s32[] constant(0)
  %t = (s32[], f32[8]{{0}}) tuple(%z, %a)
  %w = (s32[], f32[8]{{0}}) while(%t), condition=%cond, body=%outer_body, backend_config={{"known_trip_count":{{"n":"3"}}}}
  ROOT %r = f32[8]{{0}} get-tuple-element(%w), index=1
}}
"""
    known = ', backend_config={"known_trip_count":{"n":"4"}}'
    outer, inner = sorted(loop_kernels(program(known)), key=lambda r: -r["kernels"])
    assert outer == {"kernels": 6, "by_op": {"fusion": 2, "custom-call": 4}, "exact": True,
                     "trip_count": 3}
    assert inner == {"kernels": 1, "by_op": {"custom-call": 1}, "exact": True,
                     "trip_count": 4}
    outer = max(loop_kernels(program("")), key=lambda r: r["kernels"])
    assert (outer["kernels"], outer["exact"]) == (3, False)
    cond = "\n  %c = f32[8]{0} conditional(%i, %x, %x), branch_computations={%fa, %fb}"
    outer = max(loop_kernels(program(known, cond)), key=lambda r: r["kernels"])
    assert (outer["kernels"], outer["exact"]) == (7, False)  # one more, branches not counted


@pytest.mark.skipif(not (ROOT / ".gpu-aot" / "jax_plugins").is_dir(),
                    reason="the CUDA plugin is not installed: python bench/gpu_target.py "
                           "install (.ci/run does)")
def test_gpu_target_compiles_for_an_h200_on_this_cpu():
    """XLA:GPU without a device (bench/gpu_target.py): the compile-only device is an H200; its
    buffer assignment of a program with a 160 GB output says so to the byte and that it does
    not fit the card's 150.75 GB; the CNN's convolution traced as on a GPU compiles to cuDNN's,
    and as on this CPU to none (the im2col matmul); a 5-trip fori_loop is found with its trip
    count; the Pallas grouped matmul compiles (Triton to the GPU's code) as one kernel call at
    the largest tile the MoE gives it (128 rows)."""
    code = """
import json, sys
sys.path.insert(0, "bench")
import gpu_target
dev = gpu_target.use("h200")
import jax, jax.numpy as jnp
from fused.rl.networks import Conv
out = {"kind": dev.device_kind}
f = jax.jit(lambda x: jnp.broadcast_to(x.sum(), (200_000, 200_000)))
out["memory"] = gpu_target.memory(f.lower(gpu_target.abstract(
    jax.ShapeDtypeStruct((1024,), jnp.float32), dev)).compile(), "h200")
conv = Conv(8)
x = jnp.zeros((2, 9, 9, 3))
params = gpu_target.abstract(jax.eval_shape(conv.init, jax.random.PRNGKey(0), x), dev)
xs = gpu_target.abstract(x, dev)
with gpu_target.as_gpu():
    out["gpu_conv"] = "__cudnn$conv" in jax.jit(conv.apply).lower(params, xs).compile().as_text()
out["cpu_conv"] = "__cudnn$conv" in jax.jit(conv.apply).lower(params, xs).compile().as_text()
loop = jax.jit(lambda x: jax.lax.fori_loop(0, 5, lambda i, x: jnp.sin(x) @ x, x))
out["loops"] = gpu_target.loop_kernels(loop.lower(gpu_target.abstract(
    jax.ShapeDtypeStruct((64, 64), jnp.float32), dev)).compile().as_text())
from kernels import grouped_matmul
gmm = jax.jit(lambda x, w, g: grouped_matmul(x, w, g, tile=128)).lower(*gpu_target.abstract((
    jax.ShapeDtypeStruct((512, 512), jnp.bfloat16), jax.ShapeDtypeStruct((8, 512, 256),
    jnp.bfloat16), jax.ShapeDtypeStruct((4,), jnp.int32)), dev)).compile().as_text()
out["gmm_triton_calls"] = gmm.count('custom_call_target="__gpu$xla.gpu.triton"')
print(json.dumps(out))
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.splitlines()[-1])
    assert out["kind"] == "NVIDIA H200"
    m = out["memory"]
    assert (m["argument_gb"], m["output_gb"]) == (4096 / 1e9, 200_000 ** 2 * 4 / 1e9)
    assert m["peak_of_card"] > 1 and m["fits_at_fraction"] == {"0.75": False, "0.92": False}
    assert out["gpu_conv"] and not out["cpu_conv"]
    assert [(r["trip_count"], r["kernels"] >= 1) for r in out["loops"]] == [(5, True)]
    assert out["gmm_triton_calls"] == 1  # the grouped matmul compiled by Triton for sm_90


def test_fused_bench_refuses_no_render_states_in_one_line():
    """`bench/fused_sps.py --render-states 0` (the states the LLM rows' mean prompt length is
    measured on): one line before anything is built, not a traceback of numpy's empty max."""
    from fused_sps import Args, main

    with pytest.raises(SystemExit) as e:
        main(Args(render_states=0))
    assert str(e.value) == "error: --render-states 0: at least 1"
