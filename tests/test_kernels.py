"""kernels/: the Pallas shared-prefix attention (interpreted on CPU) against its plain-jnp
reference over ragged lengths, GQA ratios, head sizes and prefix lengths; the reference against
llm_jax's HF-checked attention; `auto` only ever picks a form that compiles here. (The kernel
against HF transformers end to end: tests/test_llm_model.py, form pallas-4.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels import prefix_attention, prefix_attention_reference


def inputs(b, t, g, kh, d, p, seed=0, dtype=jnp.float32):
    ks = jax.random.split(jax.random.PRNGKey(seed), 5)
    n = g * kh
    q = jax.random.normal(ks[0], (b, t, n, d), dtype)
    k = jax.random.normal(ks[1], (b, t, kh, d), dtype)
    v = jax.random.normal(ks[2], (b, t, kh, d), dtype)
    pk = jax.random.normal(ks[3], (p, kh, d), dtype)
    pv = jax.random.normal(ks[4], (p, kh, d), dtype)
    lengths = jnp.asarray(([t, 1] + [max(1, (t * (i + 1)) // (b + 1)) for i in range(b)])[:b])
    return q, k, v, lengths, pk, pv


def check(b, t, g, kh, d, p, block=16, dtype=jnp.float32, atol=2e-5):
    args = inputs(b, t, g, kh, d, p, dtype=dtype)
    ref = prefix_attention_reference(*args)
    out = prefix_attention(*args, block_q=block, block_k=block, interpret=True)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32),
                               atol=atol, rtol=0)
    return args


def test_reference_equals_llm_jax_attention():
    """The reference and llm_jax's blocked form (checked against HF transformers) agree on
    every valid query, with a prefix and GQA."""
    from llm_jax.model import AttentionConfig, attention

    q, k, v, lengths, pk, pv = inputs(3, 11, 2, 2, 64, 5)
    mask = (jnp.arange(11)[None, :, None] >= jnp.arange(11)[None, None, :]) & (
        jnp.arange(11)[None, None, :] < lengths[:, None, None])
    theirs = attention(q, k, v, mask, lengths, pk, pv, AttentionConfig("blocked"))
    ours = prefix_attention_reference(q, k, v, lengths, pk, pv)
    for i, n in enumerate(np.asarray(lengths)):
        np.testing.assert_allclose(ours[i, :n], theirs[i, :n], atol=1e-5, rtol=0)
    assert not np.asarray(ours[1, 1:]).any()  # padding queries are zeros


@pytest.mark.parametrize("b, t, g, kh, d, p", [
    (2, 13, 2, 2, 64, 0),     # no prefix, ragged last block
    (3, 33, 4, 1, 64, 1),     # one prefix token, lengths 33 / 1 / 16
    (2, 16, 1, 2, 128, 127),  # head_dim 128, prefix one short of a block multiple
    (1, 5, 8, 1, 64, 40),     # GQA 8, a row shorter than a block
])
def test_kernel_equals_reference(b, t, g, kh, d, p):
    check(b, t, g, kh, d, p)


def test_kernel_in_bf16_accumulates_in_float32():
    q, k, v, lengths, pk, pv = check(2, 20, 2, 2, 64, 37, dtype=jnp.bfloat16, atol=3e-2)
    exact = prefix_attention_reference(*(x.astype(jnp.float32) if x.dtype == jnp.bfloat16 else x
                                         for x in (q, k, v, lengths, pk, pv)))
    out = prefix_attention(q, k, v, lengths, pk, pv, block_q=16, block_k=16, interpret=True)
    assert np.abs(np.asarray(out, np.float32) - np.asarray(exact)).max() < 3e-2


@pytest.mark.slow
@pytest.mark.parametrize("g", [1, 2, 4, 8])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("p", [0, 1, 127, 790, 1387])
def test_kernel_grid(g, d, p):
    check(3, 40, g, 8 // g if g < 8 else 1, d, p, block=32)


def test_short_rows_share_a_program():
    """Rows whose queries do not fill a program share one (the prefix read once for them):
    4-token rows, GQA 1, 5 rows padded to 8 with length-0 rows, against the reference."""
    args = inputs(5, 4, 1, 2, 64, 37)
    ref = prefix_attention_reference(*args)
    for block_m in (4, 8, 32):  # 1, 2 and 8 rows a program
        out = prefix_attention(*args, block_q=16, block_k=16, block_m=block_m, interpret=True)
        np.testing.assert_allclose(out, ref, atol=2e-5, rtol=0)


@pytest.mark.parametrize("platform", ["cuda", "rocm"])
def test_kernel_lowers_for_gpus_through_triton(platform):
    """Without a GPU: `jax.export` runs Pallas' Triton lowering (which rejects unsupported block
    shapes and ops) for the 4B model's shapes (GQA 4, head_dim 128, prefix 1,387, 32-token
    suffixes) and a one-token, no-prefix case. (Pallas' default GPU backend, Mosaic GPU,
    fails on the lengths' 4-byte block.) The device compile and speed need a GPU."""
    from kernels.prefix_attention import lowers_for

    for shape in ((4, 32, 4, 8, 128, 1387), (3, 1, 2, 2, 64, 0)):
        text = lowers_for(platform, *inputs(*shape, dtype=jnp.bfloat16))
        assert "__gpu$xla.gpu.triton" in text


def test_auto_picks_a_form_that_compiles_here():
    from llm_jax.model import AttentionConfig, attention, resolve_form

    for dtype in (jnp.float32, jnp.bfloat16):
        q, k, v, lengths, pk, pv = inputs(2, 8, 2, 2, 64, 3, dtype=dtype)
        mask = jnp.ones((2, 8, 8), bool)
        for pre in ((None, None), (pk, pv)):
            form = resolve_form("auto", dtype, prefix=pre[0] is not None)
            assert form != "pallas" or jax.default_backend() == "gpu"  # timed on GPUs only
            jax.jit(lambda *a: attention(*a, cfg=AttentionConfig(form))).lower(
                q, k, v, mask, lengths, *pre).compile()


def test_auto_rule_on_gpus(monkeypatch):
    """On a GPU where cuDNN compiles (NVIDIA), auto takes the kernel after a prefix (faster than
    cuDNN's form there on an H100) and cuDNN for causal calls; float32 or no cuDNN: blocked."""
    import llm_jax.model as model

    monkeypatch.setattr(model.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(model, "_cudnn_compiles", lambda: True)
    assert model.resolve_form("auto", jnp.bfloat16, prefix=True) == "pallas"
    assert model.resolve_form("auto", jnp.bfloat16, prefix=False) == "cudnn"
    assert model.resolve_form("auto", jnp.float32, prefix=True) == "blocked"
    assert model.resolve_form("cudnn", jnp.bfloat16, prefix=True) == "cudnn"  # asked: kept
    monkeypatch.setattr(model, "_cudnn_compiles", lambda: False)
    assert model.resolve_form("auto", jnp.bfloat16, prefix=True) == "blocked"


@pytest.mark.parametrize("group, head_dim, suits", [
    (2, 128, True), (4, 128, True), (1, 64, True),  # 0.6B, 4B (timed), MHA
    (5, 128, False),  # Qwen3-14B's 40 / 8 heads: Triton's tiles need powers of two
    (8, 128, False),  # 30B-A3B's 32 / 4: 256 query vectors a program, never timed
    (4, 96, False)])
def test_auto_gives_the_kernel_only_heads_it_suits(group, head_dim, suits):
    from llm_jax.model import kernel_suits

    assert kernel_suits(group, head_dim) is suits


def test_a_group_of_five_does_not_lower_for_cuda():
    """Why `kernel_suits` refuses groups that are not powers of two."""
    from kernels.prefix_attention import lowers_for

    with pytest.raises(Exception, match="power of 2"):
        lowers_for("cuda", *inputs(2, 32, 5, 2, 128, 64, dtype=jnp.bfloat16))


@pytest.mark.parametrize("blocks", [(24, 64), (32, 0), (32, 48)])
def test_kernel_blocks_must_be_powers_of_two(blocks):
    from llm_jax.model import AttentionConfig

    with pytest.raises(ValueError, match="powers of two"):
        AttentionConfig(kernel_blocks=blocks)
    assert AttentionConfig(kernel_blocks=(16, 128)).kernel_blocks == (16, 128)


def _grouped_numpy(x, w, groups, tile):
    """Tile by tile in numpy (float64): rows i * tile.. times w[groups[i]], zeros for -1."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    return np.concatenate([x[i * tile:(i + 1) * tile] @ w[g] if g >= 0
                           else np.zeros((tile, w.shape[2])) for i, g in enumerate(groups)])


@pytest.mark.parametrize("tile,k,n,blocks", [(16, 40, 24, (16, 16)), (32, 64, 128, (64, 32)),
                                             (16, 7, 5, (128, 64))])
def test_grouped_matmul_equals_numpy(tile, k, n, blocks):
    """Each tile times its group's weights, tiles not in use (-1) zero, groups repeated and
    skipped, K and N not multiples of the blocks (padded inside), float32 and bf16 (products in
    bf16, sums in float32: within bf16's rounding of the result)."""
    from kernels import grouped_matmul, grouped_matmul_reference

    groups = [0, 3, 3, -1, 4, 1, -1]
    k1, k2 = jax.random.split(jax.random.PRNGKey(tile + k))
    x = jax.random.normal(k1, (len(groups) * tile, k))
    w = jax.random.normal(k2, (5, k, n))
    want = _grouped_numpy(x, w, groups, tile)
    g = jnp.array(groups, jnp.int32)
    out = grouped_matmul(x, w, g, tile=tile, block_n=blocks[0], block_k=blocks[1],
                         interpret=True)
    np.testing.assert_allclose(out, want, atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(grouped_matmul_reference(x, w, g, tile), want, atol=1e-4,
                               rtol=1e-5)
    xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    out = grouped_matmul(xb, wb, g, tile=tile, block_n=blocks[0], block_k=blocks[1],
                         interpret=True)
    want = _grouped_numpy(xb.astype(jnp.float32), wb.astype(jnp.float32), groups, tile)
    np.testing.assert_allclose(np.asarray(out, np.float32), want,
                               atol=0.01 * np.abs(want).max(), rtol=0)


def test_grouped_matmul_lowers_for_cuda_through_triton():
    """Without a GPU: Pallas' Triton lowering of the grouped matmul at a Qwen3-30B-A3B expert's
    shapes (2,048 x 1,536 gate/up, 128 experts, tiles of 64 rows), one kernel call."""
    from jax import export

    from kernels import grouped_matmul

    fn = jax.jit(lambda x, w, g: grouped_matmul(x, w, g, tile=64))
    args = (jax.ShapeDtypeStruct((16 * 64, 2048), jnp.bfloat16),
            jax.ShapeDtypeStruct((128, 2048, 1536), jnp.bfloat16),
            jax.ShapeDtypeStruct((16,), jnp.int32))
    text = export.export(fn, platforms=("cuda",), disabled_checks=[
        export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")])(*args).mlir_module()
    assert text.count("__gpu$xla.gpu.triton") == 1
