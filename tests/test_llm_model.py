"""Qwen3 in JAX vs HF transformers (torch CPU) on tiny random checkpoints the tests build."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from llm_jax.loader import load_params  # noqa: E402
from llm_jax.model import AttentionConfig, encode, prefill  # noqa: E402
from qwen_fixtures import build_tiny_qwen3  # noqa: E402

B, T = 3, 13
LENGTHS = np.array([13, 8, 3])


@pytest.fixture(scope="session", params=["tied-top", "untied-nested-sharded"])
def tiny(request, tmp_path_factory):
    tied = request.param.startswith("tied")
    folder = tmp_path_factory.mktemp(request.param)
    model = build_tiny_qwen3(folder, tied=tied, rope_layout="top" if tied else "nested",
                             shard="sharded" in request.param, seed=1 if tied else 2)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 320, (B, T))
    mask = np.arange(T)[None] < LENGTHS[:, None]
    with torch.no_grad():
        out = model.model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
                          output_hidden_states=True)
    ref = [h.numpy() for h in out.hidden_states]
    return folder, tokens, ref


# (form, query block): the row form with blocks of 4 (13 tokens span several blocks and a ragged
# last one) and of 16 (the whole sequence is one block: its batched branch).
# The blocked form is the accelerators' float32 form: on CPU it is checked in the slow lane.
# The Pallas kernel (kernels/prefix_attention.py) runs interpreted on CPU, blocks of 4.
FORMS = [("row", 4), ("row", 16), pytest.param(("blocked", 4), marks=pytest.mark.slow),
         pytest.param(("pallas", 4), marks=pytest.mark.slow)  # the kernel alone: test_kernels
         ] + ([("cudnn", 4)] if jax.default_backend() == "gpu" else [])


@pytest.fixture(params=FORMS,
                ids=["row-4", "row-16", "blocked-4", "pallas-4", "cudnn-4"][:len(FORMS)])
def attn(request):
    """Every attention form this machine can run (CPU traces "row" by default; a GPU in bf16
    "cudnn", or the kernel after a prefix, and "blocked" in float32), with small query blocks
    so every code path of each runs."""
    form, block = request.param
    return AttentionConfig(form, query_block=block, row_query_block=block,
                           kernel_blocks=(block, block))


def fp32_only(attn):
    if attn.form == "cudnn":
        pytest.skip("cuDNN attention runs in bf16/fp16 only (float32 uses the blocked form)")


@pytest.fixture(autouse=True)
def full_fp32_matmuls():
    """GPUs run float32 matmuls in TF32 unless told otherwise (6.5e-4 off HF's float32 on an
    H100); the 1e-5 claims are about float32 arithmetic. No effect on CPU."""
    with jax.default_matmul_precision("highest"):
        yield


def valid_rows(x):
    return [x[b, : LENGTHS[b]] for b in range(B)]


def test_every_layer_matches_hf_fp32(tiny, attn):
    fp32_only(attn)
    folder, tokens, ref = tiny
    cfg, params = load_params(folder)
    assert cfg.num_heads * cfg.head_dim != cfg.hidden_size
    n = cfg.num_layers
    for layer in range(n + 1):
        # HF: hidden_states[i] is pre-norm for i < n, post-final-norm for i = n.
        ours = np.asarray(encode(params, cfg, jnp.asarray(tokens), jnp.asarray(LENGTHS), layer,
                                 pool="none", post_norm=layer == n, attn=attn))
        for a, b in zip(valid_rows(ours), valid_rows(ref[layer])):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_pooling_matches_hf_positions(tiny):
    folder, tokens, ref = tiny
    cfg, params = load_params(folder)
    args = (params, cfg, jnp.asarray(tokens), jnp.asarray(LENGTHS), 2)
    last = np.asarray(encode(*args, pool="last"))
    mean = np.asarray(encode(*args, pool="mean"))
    for b in range(B):
        np.testing.assert_allclose(last[b], ref[2][b, LENGTHS[b] - 1], atol=1e-5)
        np.testing.assert_allclose(mean[b], ref[2][b, : LENGTHS[b]].mean(0), atol=1e-5)


def test_bf16_within_stated_tolerance(tiny, attn):
    folder, tokens, ref = tiny
    cfg, params = load_params(folder, dtype=jnp.bfloat16)
    n = cfg.num_layers
    ours = np.asarray(encode(params, cfg, jnp.asarray(tokens), jnp.asarray(LENGTHS), n,
                             pool="none", post_norm=True, attn=attn)).astype(np.float32)
    for a, b in zip(valid_rows(ours), valid_rows(ref[n])):
        # bf16 keeps 8 mantissa bits; after 3 blocks we allow 3% of the state's scale.
        assert np.abs(a - b).max() <= 0.03 * np.abs(b).max()


def test_prefix_cache_equals_full_encoding(tiny, attn):
    """fp32 within 1e-5; cuDNN (bf16 only) within the rounding of a few bf16 blocks."""
    folder, tokens, _ = tiny
    dtype = jnp.bfloat16 if attn.form == "cudnn" else jnp.float32
    atol = 0.03 if attn.form == "cudnn" else 1e-5
    cfg, params = load_params(folder, dtype=dtype)
    prefix = jnp.asarray(tokens[0, :6])
    suffix = jnp.asarray(tokens[:, 6:])
    suf_len = jnp.array([7, 4, 1])
    full_tokens = jnp.concatenate([jnp.broadcast_to(prefix, (B, 6)), suffix], axis=1)
    cache = prefill(params, cfg, prefix, attn=attn)
    for layer in (1, cfg.num_layers):
        for pool in ("none", "last"):
            a = encode(params, cfg, suffix, suf_len, layer, pool=pool, post_norm=True, prefix=cache,
                       attn=attn)
            b = encode(params, cfg, full_tokens, suf_len + 6, layer, pool=pool, post_norm=True,
                       attn=attn)
            a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
            if pool == "none":
                for i in range(B):
                    np.testing.assert_allclose(a[i, : suf_len[i]], b[i, 6: 6 + suf_len[i]],
                                               atol=atol, rtol=0)
            else:
                np.testing.assert_allclose(a, b, atol=atol, rtol=0)


def test_early_exit_never_touches_later_layers(tiny):
    folder, tokens, ref = tiny
    cfg, params = load_params(folder)
    # every per-layer group (attention and norms, MLPs) poisoned past the first layer
    st = params.layers
    poisoned = params.replace(layers=st.replace(**{
        g: jax.tree.map(lambda a: a.at[1:].set(jnp.nan), getattr(st, g))
        for g in ("common", "dense")}))
    out = np.asarray(encode(poisoned, cfg, jnp.asarray(tokens), jnp.asarray(LENGTHS), 1, pool="none"))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[0], ref[1][0], atol=1e-5)


def test_config_layouts_read_the_same_theta(tmp_path):
    from llm_jax.config import Qwen3Config

    base = {"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 64}
    a = Qwen3Config.from_dict(dict(base, rope_theta=1e6))
    b = Qwen3Config.from_dict(dict(base, rope_parameters={"rope_type": "default", "rope_theta": 1e6}))
    assert a == b and a.head_dim == 64 and a.rope_theta == 1e6
