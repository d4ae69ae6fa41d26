"""Shared test setup: two virtual CPU devices (for the sharding tests), fast compilation and the
persistent compilation cache (each config compiles once per machine), subprocess environments,
the vLLM server."""

import gc
import glob
import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Two process-wide settings that cut the suite's time (a `train.py smoke` on a fresh cache, one
# core: 15.2-16.2 s -> 12.7 s with both; docs/BENCHMARKS.md): the garbage collector's first
# threshold raised, here and in the Python processes the tests start (tests/startup/
# sitecustomize.py, on PYTHONPATH), and jemalloc instead of glibc's malloc, whose malloc and free
# were ~11% of such a run (mostly called by XLA's compiler), preloaded into every process started
# from here on: the xdist workers, the commands, the vLLM servers (not this process: without
# `-n`, only the commands the tests start have it). Without libjemalloc (`apt-get install
# libjemalloc2`; .ci/run installs it) the suite runs as before, only slower.
gc.set_threshold(100_000, 10, 10)  # (700, 10, 10) by default
STARTUP = str(ROOT / "tests" / "startup")
if STARTUP not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (STARTUP, os.environ.get("PYTHONPATH")) if p)
JEMALLOC = next(iter(sorted(glob.glob("/usr/lib/*-linux-gnu/libjemalloc.so.2"))), None)
if JEMALLOC and "malloc" not in os.environ.get("LD_PRELOAD", ""):  # (none preloaded already)
    os.environ["LD_PRELOAD"] = " ".join(
        p for p in (os.environ.get("LD_PRELOAD"), JEMALLOC) if p)
# CPython's arena allocator swapped for one that keeps a few freed blocks (tests/startup/
# arena_allocator.py: less tracing time), in this process and, through $FUSED_TEST_ARENA, in every
# Python process started from here on (built once, with the system's C compiler; without one the
# suite runs as before, only slower).
if "arena_allocator" not in sys.modules:
    _spec = importlib.util.spec_from_file_location(
        "arena_allocator", ROOT / "tests" / "startup" / "arena_allocator.py")
    sys.modules["arena_allocator"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["arena_allocator"])
if "FUSED_TEST_ARENA" not in os.environ:
    os.environ["FUSED_TEST_ARENA"] = sys.modules["arena_allocator"].build() or "0"
if os.environ["FUSED_TEST_ARENA"] != "0":
    sys.modules["arena_allocator"].keep(os.environ["FUSED_TEST_ARENA"])
# One thread for OpenBLAS (numpy's, and scipy's, which jaxlib's CPU LAPACK calls: the orthogonal
# initialiser's QR) and for torch's OpenMP (the HF references), in every process started from
# here on: their idle threads spin after each call, on cores the other test worker and the
# commands are waiting for (a cached `train.py smoke`: ~1 of its ~8 CPU s; the fast lane's CPU
# seconds: -6% with both, commit fdb0ac8).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
CACHE = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".jax_cache"))
TWO_DEVICES = "--xla_force_host_platform_device_count=2"
# The suite is compile-bound (an empty cache in CI): LLVM's optimisation of the CPU code costs
# more than it saves on these tiny configs (about 0.7x the suite's time without it). It reaches
# child processes too; every comparison in the tests is within one setting or to a tolerance.
# XLA's newer CPU fusion emitters compile these programs about 2x slower than the classic ones
# (an LLM-augmented `train.py smoke`: 69 s vs 41 s on one core, its chunk 28 s vs 13 s), and
# code generation split into parallel parts costs 5-8% more on a core already busy. XLA checks
# its own passes' output with its HLO verifier after each pass that changed the program; that
# check, not needed to compile, was 5-12% of compiling here, in runs paired on the two cores (a
# `train.py smoke`: 10.3-10.9 s -> 9.5-10.1 s; the README walkthrough test's commands: 104.3 ->
# 99.5 s and 107.4 -> 101.5 s, the test 5 s shorter); the optimised program is the same (a
# vmapped Craftax-Classic reset and step: the same HLO text).
FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
                "--xla_cpu_parallel_codegen_split_count=1",
                "--xla_disable_hlo_passes=hlo-verifier")
# Programs that compile in under a second go into the persistent cache too (the commands'
# default keeps only longer ones): a suite run compiled ~10,000 of them, 440 s in all, 157 s of
# it the same program again (in another process, or by a new jit wrapper in the same one); the
# fast lane 207 s -> 192 s.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
_flags = os.environ.get("XLA_FLAGS", "").split()
for _flag in FAST_COMPILE:
    if not any(f.startswith(_flag.split("=")[0] + "=") for f in _flags):
        _flags.append(_flag)
os.environ["XLA_FLAGS"] = " ".join(_flags + ([TWO_DEVICES] if TWO_DEVICES not in _flags else []))
sys.path.insert(0, str(ROOT))

import signal  # noqa: E402

import pytest  # noqa: E402

from fused.commands.process import setup_compilation_cache  # noqa: E402

setup_compilation_cache()


# Modules in the order of their total time on 2 cores (a suite run, 2026-11-29), longest first
# (with pyproject's --no-loadscope-reorder, xdist hands modules out in this order, each to the
# worker that comes free first): a long module started last would run alone at the end while
# the other worker idles (test_fast_step.py, left out of this list, did: ~2.5 minutes on one
# core); the modules not named (each under half a minute) fill the end.
FIRST = ("test_readme.py", "test_vl.py", "test_label.py", "test_fast_step.py",
         "test_policy_variants.py", "test_pixels.py", "test_player.py", "test_cli_resume.py",
         "test_human.py", "test_gpu_check.py", "test_faults.py", "test_fused_llm.py",
         "test_imagine.py", "test_moe_commands.py", "test_vllm_parity.py", "test_offline.py",
         "test_sharding.py", "test_moe.py", "test_render.py", "test_readme_pixels.py",
         "test_decode.py", "test_kernels.py", "test_envs.py", "test_encoders.py", "test_plan.py",
         "test_llm_io.py", "test_decode_vllm.py", "test_video.py", "test_llm_model.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


def console_script(name: str) -> str:
    """The path of a console script `pip install -e .` put beside python (`craftax-train`).
    test_readme checks their --help and hints; four tests run one command each through theirs
    (train: test_cli_resume's resume, label: test_label's generate with epsilon, offline:
    test_policy_variants' eval of a GRU run, play: test_player's recorded play) and check it
    exits 0 once done: pip's wrapper exits with what the entry point returns, and `main`'s
    result made a finished command exit 1."""
    exe = Path(sys.executable).parent / name
    assert exe.is_file(), f"{exe}: `pip install -e .` puts the console scripts beside python"
    return str(exe)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick), for a
    jax.distributed coordinator the test starts: a fixed port fails the test wherever another
    run or service holds it."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env() -> dict:
    """Environment for child processes: same cache, repo importable, one CPU device."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((str(ROOT), STARTUP)),
               JAX_COMPILATION_CACHE_DIR=CACHE)
    flags = [f for f in env["XLA_FLAGS"].split() if f != TWO_DEVICES]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    else:  # XLA reads a blank XLA_FLAGS as a file name and aborts
        env.pop("XLA_FLAGS")
    return env


# The tiny test models need little: vLLM's CPU backend otherwise reserves 25% of RAM and refuses
# to start when that is not free (a test worker beside it holding its compiled programs).
os.environ.setdefault("VLLM_MEM_FRACTION", "0.1")
# ... and without compiling the model (torch.compile): 20 s instead of 38 s to start on a cold
# cache, three servers a run; parity is about the numbers, which eager mode computes too.
os.environ.setdefault("VLLM_ENFORCE_EAGER", "1")
# $VLLM_VENV as scripts/vllm_server.sh reads it (a venv elsewhere), else the repository's own.
VLLM_VENV = Path(os.environ.get("VLLM_VENV", ROOT / ".vllm-venv")) / "bin" / "python"


def serve(model_dir: Path, port_base: int, mode: str = "serve"):
    """Generator for a fixture: a real vLLM server (scripts/vllm_server.sh MODE) on the model in
    `model_dir`, yielding its client; skipped without the vLLM venv (a failure in CI)."""
    pytest.importorskip("torch")
    if not VLLM_VENV.exists():
        if os.environ.get("CI"):
            pytest.fail("CI must run `scripts/vllm_server.sh install` before the tests")
        pytest.skip("vLLM venv absent: run scripts/vllm_server.sh install")
    from llm_jax.vllm_client import VLLMError, launch_server

    try:
        proc, client = launch_server(ROOT / "scripts/vllm_server.sh", model_dir,
                                     port_base + os.getpid() % 200, mode=mode)
    except VLLMError as e:
        pytest.fail(str(e))
    try:
        client.timeout = 300
        yield client
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")  # (a server stops with its module, not idling through the rest)
def vllm_server(tmp_path_factory):
    from qwen_fixtures import build_tiny_qwen3

    folder = tmp_path_factory.mktemp("vllm-model")
    build_tiny_qwen3(folder, tied=True, head_dim=64, hidden=128, heads=4, kv_heads=2, layers=2,
                     vocab=151_680, seed=3)
    for client in serve(folder, 8700):
        yield folder, client


@pytest.fixture(scope="module")
def vllm_generate_server(tmp_path_factory):
    """A real vLLM generation server (`scripts/vllm_server.sh serve-generate`, float32) on a tiny
    random Qwen3 with head_dim 64 (vLLM's CPU attention has no 16) and the Qwen3 tokenizer's
    vocabulary. Yields (model folder, client)."""
    from qwen_fixtures import build_tiny_qwen3

    folder = tmp_path_factory.mktemp("vllm-generate-model")
    build_tiny_qwen3(folder, tied=True, head_dim=64, hidden=128, heads=4, kv_heads=2, layers=2,
                     vocab=151_680, seed=5)
    for client in serve(folder, 8500, mode="serve-generate"):
        yield folder, client


STAGING = "{staging}"  # in `session_once`'s argv: the folder the command writes into


def session_once(tmp_path_factory, name: str, argv: list[str], output: str = "",
                 env: dict | None = None) -> Path:
    """`python *argv` once for the whole session (in a process of its own, as a user runs it),
    shared by the xdist workers: the first to ask runs it under a file lock, the others wait
    for it and read the same folder. The command writes into the folder `STAGING` stands for in
    `argv`, renamed into place whole when it ends well (or not there: a later test runs it
    again); returned is `output` inside it (say a run's name), the console output kept beside
    it (`<output>.stdout`), or with no `output` the folder itself. A test that writes into it
    copies it first (`shutil.copytree`)."""
    import shutil

    from command_runner import run_command
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # (each worker's is a folder of the session's)
        base = base.parent
    done, lock = base / f"shared-{name}", base / f"shared-{name}.lock"
    with FileLock(str(lock)):
        if not done.is_dir():
            staging = base / f"shared-{name}.staging"
            shutil.rmtree(staging, ignore_errors=True)  # (an earlier try's, cut off)
            p = run_command([sys.executable, *(a.replace(STAGING, str(staging)) for a in argv)],
                            env=env or subprocess_env(), capture_output=True, text=True,
                            timeout=900)
            assert p.returncode == 0, p.stderr[-3000:]
            if output:  # (beside the output, inside the folder renamed into place)
                (staging / f"{output}.stdout").write_text(p.stdout)
            os.replace(staging, done)
    return done / output


def shared_run(tmp_path_factory, name: str, args: list[str], env: dict | None = None) -> Path:
    """`train.py *args` once for the whole session (`session_once`): the run's folder, its
    console output beside it (`<run>.stdout`); `env` the command's (default: one device)."""
    return session_once(tmp_path_factory, name, [str(ROOT / "train.py"), *args, "--out-dir",
                                                 STAGING, "--run-name", "r"], "r", env)


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> Path:
    """One plain `train.py smoke` run for the session (`shared_run`). It replaces five identical
    runs (test_faults', test_cli_resume's, test_label's, test_offline's probe's and the README
    walkthrough's; ~10-14 s each on a fresh cache, mostly tracing and compiling)."""
    return shared_run(tmp_path_factory, "smoke", ["smoke"])


# Two encoding lengths (512 and the prompt bound) instead of the default's 9 (Classic) or 11
# (Symbolic), for the tests whose text encoder compiles (`--llm.encode-lengths`; each length is
# compiled at every call site of a fused program; imagination's three lengths and a VL model's
# one are unchanged). An observation after the cached prompt prefix is 137-454 tokens on Classic
# (a batch of 8 rows almost never fits 256) and 338-819 on Symbolic (measured on random play), so
# the shorter lengths were compile time nearly never used (an LLM-augmented `train.py smoke` on
# the tiny MoE: 29 s -> 23 s without them). Not 256 alone: labelling's batches with a row past 256
# tokens then ran at the bound, 1,013 (a label test 41 s -> 131 s). tests/test_fused_llm.py's
# shared encoder keeps the default.
LENGTHS = ("--llm.encode-lengths", "512")
ENCODE_LENGTHS = (512,)  # the same, for an LLMConfig built here

# The LLM-augmented smoke run of test_fused_llm's CLI test and test_label's hidden states: two
# updates (one chunk) rather than the preset's six; at O0 its running, the LLM's encodes, was
# about half of its CPU seconds
LLM_SMOKE = ["smoke", "--llm.backend", "jax", "--llm.skip-n", "3", "--llm.projection", "layernorm",
             "--total-timesteps", "128", *LENGTHS]


@pytest.fixture(scope="session")
def llm_smoke_run(tmp_path_factory) -> Path:
    """`train.py smoke` with the tiny random Qwen3 in the loop (`LLM_SMOKE`), once for the
    session (`shared_run`): test_fused_llm checks the run, test_label generates from it."""
    return shared_run(tmp_path_factory, "llm-smoke", LLM_SMOKE)
