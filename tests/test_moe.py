"""Qwen3 mixture-of-experts in JAX vs HF transformers' `Qwen3MoeForCausalLM` (torch CPU) on tiny
random checkpoints that transformers itself writes (per-expert tensors, `num_local_experts`):
several expert counts and top-k, both `norm_topk_prob`, `mlp_only_layers` and
`decoder_sparse_step` > 1. Every layer's state in float32, bfloat16 within a stated bound, greedy
decoding, each grouped-matmul form against the dense all-experts oracle, router choices and
load by hand (numpy) and through hooks on HF's router, config and loader errors, the memory
check. The CLI, label.py, train.py and vLLM checks are in test_moe_commands.py."""

import json

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from llm_jax.config import Qwen3Config, Qwen3ConfigError  # noqa: E402
from llm_jax.loader import WeightsError, load_params  # noqa: E402
from llm_jax.model import AttentionConfig, encode, first_layers, init_params  # noqa: E402
from llm_jax.moe import (Routing, dense_reference, grouped_ragged, grouped_tiled,  # noqa: E402
                         moe_mlp, route)
from llm_jax.weights import MoE, random_params  # noqa: E402
from qwen_fixtures import build_tiny_qwen3_moe  # noqa: E402

B, T = 3, 13
LENGTHS = np.array([13, 8, 3])
# name: build_tiny_qwen3_moe arguments. Together: 4, 8, 16 experts; top 1..4; norm_topk_prob
# both ways; all-sparse, mlp_only_layers (a dense first layer too), decoder_sparse_step 2;
# tied and untied; one checkpoint sharded with an index file, rope_theta under rope_parameters.
MODELS = {
    "e8-k2-norm": dict(experts=8, top_k=2, norm_topk=True, seed=1),
    "e4-k3-raw-mlponly-sharded": dict(experts=4, top_k=3, norm_topk=False, mlp_only=(1,),
                                     shard=True, rope_layout="nested", seed=2),
    "e16-k4-norm-step2-tied": dict(experts=16, top_k=4, norm_topk=True, sparse_step=2, layers=4,
                                   tied=True, seed=3),
    "e8-k1-raw-dense-ends": dict(experts=8, top_k=1, norm_topk=False, layers=3,
                                 mlp_only=(0, 2), seed=4),
}


def run_hf(model, tokens, lengths=LENGTHS):
    """HF's hidden_states (pre-norm, the last post-norm) and, per sparse layer, the router's
    logits for every position (captured with forward hooks on `mlp.gate`)."""
    logits = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        if hasattr(layer.mlp, "gate"):
            hooks.append(layer.mlp.gate.register_forward_hook(
                lambda m, a, out, i=i: logits.__setitem__(i, out[0].detach().numpy())))
    mask = (np.arange(tokens.shape[1])[None] < lengths[:, None]).astype(np.int64)
    try:
        with torch.no_grad():
            out = model.model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                              output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    return [h.numpy() for h in out.hidden_states], logits


# the fast lane runs one pattern (every layer sparse); the slow lane all four
FAST_MODELS = ("e8-k2-norm",)


@pytest.fixture(scope="session", params=[
    m if m in FAST_MODELS else pytest.param(m, marks=pytest.mark.slow) for m in MODELS])
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = build_tiny_qwen3_moe(folder, **MODELS[request.param])
    tokens = np.random.default_rng(0).integers(0, 320, (B, T))
    states, logits = run_hf(model, tokens)
    return folder, model, tokens, states, logits


def valid_rows(x, lengths=LENGTHS):
    return [x[b, : lengths[b]] for b in range(len(lengths))]


def test_config_reads_the_moe_fields_and_hf_sparse_rule(tiny):
    """Our sparse/dense layer pattern is the one HF's own model builds (which layers hold a
    `Qwen3MoeSparseMoeBlock`), from the config.json transformers wrote (`num_local_experts`)."""
    folder, model, *_ = tiny
    cfg = Qwen3Config.from_folder(folder)
    hf = model.config
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
            cfg.norm_topk_prob, cfg.decoder_sparse_step, cfg.mlp_only_layers) == (
        hf.num_experts, hf.num_experts_per_tok, hf.moe_intermediate_size, hf.norm_topk_prob,
        hf.decoder_sparse_step, tuple(hf.mlp_only_layers))
    assert "num_local_experts" in json.loads((folder / "config.json").read_text())
    hf_sparse = tuple(type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock"
                      for layer in model.model.layers)
    assert cfg.sparse_layers == hf_sparse


@pytest.mark.parametrize("form", ["tiled", "ragged"])
def test_every_layer_matches_hf_fp32(tiny, form):
    folder, _, tokens, ref, _ = tiny
    cfg, params = load_params(folder)
    attn = AttentionConfig(moe_form=form)
    n = cfg.num_layers
    for layer in range(n + 1):
        ours = np.asarray(encode(params, cfg, jnp.asarray(tokens), jnp.asarray(LENGTHS), layer,
                                 pool="none", post_norm=layer == n, attn=attn))
        for a, b in zip(valid_rows(ours), valid_rows(ref[layer])):
            np.testing.assert_allclose(a, b, atol=1e-4, rtol=0, err_msg=f"layer {layer}")


def hand_route(logits, k, renormalise):
    """numpy: softmax in float64 over the experts, the k largest (descending), renormalised."""
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    idx = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, idx, -1)
    return (w / w.sum(-1, keepdims=True) if renormalise else w), idx


def test_router_choice_and_load_by_hand(tiny):
    """HF's router logits at every sparse layer (hooks) -> numpy top-k and renormalisation ->
    our `route` on the same logits agrees; and our per-layer load equals numpy's bincount of
    HF's choices over the non-padding positions (k per token)."""
    folder, _, tokens, _, logits = tiny
    cfg, params = load_params(folder)
    k = cfg.num_experts_per_tok
    _, load = encode(params, cfg, jnp.asarray(tokens), jnp.asarray(LENGTHS), cfg.num_layers,
                     pool="none", expert_load=True)
    sparse = [i for i, s in enumerate(cfg.sparse_layers) if s]
    assert load.shape == (len(sparse), cfg.num_experts) and sorted(logits) == sparse
    valid = (np.arange(T)[None] < LENGTHS[:, None]).reshape(-1)
    for row, i in enumerate(sparse):
        w, idx = hand_route(logits[i].astype(np.float64), k, cfg.norm_topk_prob)
        # `route` on HF's logits: an identity "hidden state" times the logits as router weights
        ours = route(cfg, jnp.asarray(logits[i]), jnp.eye(len(valid), dtype=jnp.float32))
        np.testing.assert_array_equal(np.asarray(ours.experts), idx)
        np.testing.assert_allclose(np.asarray(ours.weights), w, rtol=1e-5, atol=1e-6)
        want = np.bincount(idx[valid].reshape(-1), minlength=cfg.num_experts)
        np.testing.assert_array_equal(np.asarray(load[row]), want, err_msg=f"layer {i}")
        assert want.sum() == k * LENGTHS.sum()


@pytest.mark.parametrize("name", ["e8-k2-norm", "e16-k4-norm-step2-tied"])
def test_bf16_within_stated_tolerance(name, tmp_path):
    """bfloat16 weights and compute, against HF float32: every state within 3% of its scale
    (the dense model's bound). Built with a 4x router scale, so no token's k-th and (k+1)-th
    experts are within bf16 rounding of a tie: where they are, bf16 can route a token to another
    expert, as HF's own bf16 model does (measured: 15% of the scale on one token)."""
    model = build_tiny_qwen3_moe(tmp_path, **dict(MODELS[name], router_scale=4.0))
    tokens = np.random.default_rng(0).integers(0, 320, (B, T))
    ref, _ = run_hf(model, tokens)
    cfg, params = load_params(tmp_path, dtype=jnp.bfloat16)
    n = cfg.num_layers
    ours = np.asarray(encode(params, cfg, jnp.asarray(tokens), jnp.asarray(LENGTHS), n,
                             pool="none", post_norm=True)).astype(np.float32)
    for a, b in zip(valid_rows(ours), valid_rows(ref[n])):
        assert np.abs(a - b).max() <= 0.03 * np.abs(b).max()


def test_greedy_decode_matches_hf(tiny):
    """30 greedy tokens per ragged row, batched, equal HF generate's row by row; the states of
    the generated tokens at layer 1 equal HF's forward over prompt + generated tokens."""
    from llm_jax.decode import GenerateSpec, generate

    folder, model, *_ = tiny
    cfg, params = load_params(folder)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, cfg.vocab_size, n) for n in (7, 3, 12)]
    tokens = np.zeros((3, 12), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = p
    spec = GenerateSpec(max_new_tokens=30, pad_id=0, hidden_layer=1)
    out = jax.jit(lambda p, t, n: generate(p, cfg, spec, t, n, key=jax.random.PRNGKey(0)))(
        params, jnp.asarray(tokens), jnp.array([len(p) for p in prompts]))
    for i, p in enumerate(prompts):
        with torch.no_grad():
            ref = model.generate(torch.tensor([list(p)]), max_new_tokens=30, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0, len(p):].numpy()
        np.testing.assert_array_equal(np.asarray(out.tokens[i]), ref, err_msg=f"row {i}")
        seq = np.concatenate([p, ref])[None]
        states, _ = run_hf(model, seq, np.array([seq.shape[1]]))
        np.testing.assert_allclose(out.hidden[i], states[1][0, len(p):], atol=1e-4, rtol=0)


# (experts, k, tokens, tile): groups smaller and larger than a tile, empty experts (more
# experts than assignments), one expert, ties broken the same way.
# The fast lane checks the first two.
CASES = [(8, 2, 40, 8), (8, 2, 40, 16), *(pytest.param(*c, marks=pytest.mark.slow) for c in (
    (16, 4, 3, 8), (4, 4, 33, 8), (1, 1, 10, 8), (32, 8, 64, None)))]


@pytest.mark.parametrize("experts,k,n,tile", CASES)
def test_grouped_forms_equal_dense_oracle(experts, k, n, tile):
    """The sorted-token forms (ragged_dot, tiled, the Pallas kernel through its interpreter) and
    the gathered one against every expert on every token."""
    cfg = Qwen3Config(vocab_size=8, hidden_size=24, intermediate_size=8, num_layers=1,
                      num_heads=1, num_kv_heads=1, head_dim=8, rope_theta=1e4, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, num_experts=experts, num_experts_per_tok=k,
                      moe_intermediate_size=12, norm_topk_prob=True)
    keys = jax.random.split(jax.random.PRNGKey(experts * 100 + n), 4)
    mp = MoE(router=jax.random.normal(keys[0], (24, experts)),
             gate_up=0.3 * jax.random.normal(keys[1], (experts, 24, 24)),
             down=0.3 * jax.random.normal(keys[2], (experts, 12, 24)))
    h = jax.random.normal(keys[3], (1, n, 24))
    # (each form one program: op by op, each of its operations would compile on its own)
    mlp = jax.jit(moe_mlp, static_argnums=0, static_argnames="form")
    ref, load = mlp(cfg, mp, h, form="dense")
    assert int(load.sum()) == n * k
    for form in ("ragged", "tiled", "gathered", "pallas"):
        ours, load2 = mlp(cfg, mp, h, form=form)
        np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(load2, load)
    # the tiled kernel alone with an explicit tile, on rows already sorted by expert
    routing = route(cfg, mp.router, h[0])
    sizes = jnp.bincount(routing.experts.reshape(-1), length=experts).astype(jnp.int32)
    xs = jnp.repeat(h[0], k, axis=0)[jnp.argsort(routing.experts.reshape(-1), stable=True)]
    np.testing.assert_allclose(grouped_tiled(xs, sizes, mp.gate_up, mp.down, tile),
                               grouped_ragged(xs, sizes, mp.gate_up, mp.down),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend,form", [("cpu", "tiled"), ("gpu", "tiled"), ("tpu", "ragged")])
def test_auto_expert_form(monkeypatch, backend, form):
    """auto: ragged_dot only on TPU; CPU lowers it densely, and on an H100 it ran 3.9x slower
    than the tiled form and ran out of memory at 32 x 512 tokens of Qwen3-30B-A3B. Elsewhere
    the gathered form for calls with fewer assignments than tiles."""
    import llm_jax.moe as moe

    monkeypatch.setattr(moe.jax, "default_backend", lambda: backend)
    assert moe.resolve_moe_form("auto") == form
    assert moe.resolve_moe_form("ragged") == "ragged"  # asked for: kept
    # few assignments (a decode step): gathered where the tiled form's tiles (assignments /
    # tile + experts, tile 8 here) outnumber them: 146 < 19 + 128, 147 = 19 + 128; 32 x 256
    # tokens x 8 in tiles of 256: 256 + 128 tiles
    few = "ragged" if backend == "tpu" else "gathered"
    assert [moe.resolve_moe_form("auto", r, 128) for r in (8, 146, 147, 65536)] == [
        few, few, form, form]
    assert moe.resolve_moe_form("tiled", 8, 128) == "tiled"  # asked for: kept


def test_dense_oracle_by_hand():
    """The oracle itself against a numpy loop over tokens and their chosen experts."""
    cfg = Qwen3Config(vocab_size=8, hidden_size=6, intermediate_size=8, num_layers=1,
                      num_heads=1, num_kv_heads=1, head_dim=8, rope_theta=1e4, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, num_experts=5, num_experts_per_tok=2,
                      moe_intermediate_size=4)
    rng = np.random.default_rng(0)
    mp = {"gate_up": rng.normal(size=(5, 6, 8)).astype(np.float32),
          "down": rng.normal(size=(5, 4, 6)).astype(np.float32)}
    h = rng.normal(size=(7, 6)).astype(np.float32)
    routing = Routing(jnp.asarray(rng.random((7, 2)), jnp.float32),
                      jnp.asarray([rng.choice(5, 2, replace=False) for _ in range(7)], jnp.int32))
    experts = MoE(router=None, gate_up=jnp.asarray(mp["gate_up"]), down=jnp.asarray(mp["down"]))
    got = np.asarray(dense_reference(cfg, experts, jnp.asarray(h), routing))
    silu = lambda x: x / (1 + np.exp(-x))  # noqa: E731
    for t in range(7):
        want = sum(float(routing.weights[t, j]) * (
            (silu(h[t] @ mp["gate_up"][e][:, :4]) * (h[t] @ mp["gate_up"][e][:, 4:]))
            @ mp["down"][e]) for j, e in enumerate(np.asarray(routing.experts[t])))
        np.testing.assert_allclose(got[t], want, rtol=1e-5, atol=1e-5)


def test_first_layers_compute_only_the_first_layers(tiny):
    """`first_layers` (what fused.llm.encoder keeps) and `load_params(layers=L)` give the same
    layer-L states as the whole model, and poisoning every later layer's weights (all groups)
    changes nothing; `init_params(layers=L)` equals the whole random model's first layers, and
    `random_params` (jitted, optimised) the whole one's weights."""
    folder, _, tokens, ref, _ = tiny
    cfg, params = load_params(folder)
    for n in range(1, cfg.num_layers):
        cut = first_layers(params, cfg, n)
        _, read = load_params(folder, layers=n)
        assert jax.tree.structure(cut) == jax.tree.structure(read)
        for a, b in zip(jax.tree.leaves(cut), jax.tree.leaves(read)):
            np.testing.assert_array_equal(a, b)
        # the whole model, every row of every group past the first n layers' set to NaN
        poisoned = {}
        for g in ("common", "dense", "moe"):
            if getattr(params.layers, g) is not None:
                part = getattr(cut.layers, g)
                keep = 0 if part is None else jax.tree.leaves(part)[0].shape[0]
                poisoned[g] = jax.tree.map(lambda a, m=keep: a.at[m:].set(jnp.nan),
                                           getattr(params.layers, g))
        poisoned = params.replace(layers=params.layers.replace(**poisoned))
        for p in (cut, poisoned):
            out = np.asarray(encode(p, cfg, jnp.asarray(tokens), jnp.asarray(LENGTHS), n,
                                    pool="none"))
            for a, b in zip(valid_rows(out), valid_rows(ref[n])):
                np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
    whole = init_params(cfg, jax.random.PRNGKey(0))
    # jitted and optimised by LLVM though this process compiles at O0 (conftest): the weights a
    # process at XLA's default level draws, these up to float rounding (LLVM's fused
    # multiply-adds)
    drawn = random_params(cfg, jax.random.PRNGKey(0))
    default = jax.jit(lambda k: init_params(cfg, k),
                      compiler_options={"xla_backend_optimization_level": 2})(jax.random.PRNGKey(0))
    assert jax.tree.structure(drawn) == jax.tree.structure(whole)
    for a, b, c in zip(jax.tree.leaves(drawn), jax.tree.leaves(whole), jax.tree.leaves(default)):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
    for n in range(cfg.num_layers + 1):
        part = init_params(cfg, jax.random.PRNGKey(0), layers=n)
        want = first_layers(whole, cfg, n)
        assert jax.tree.structure(part) == jax.tree.structure(want)
        for a, b in zip(jax.tree.leaves(part), jax.tree.leaves(want)):
            np.testing.assert_array_equal(a, b)


def test_per_layer_layout_loads_as_it_converts_and_encodes_as_hf(tiny):
    """`load_params(per_layer=True)` (each layer's arrays as read) equals `per_layer` of the
    stacked params, its first layers equal `first_layers`, and the unrolled blocks' states are
    HF's (dense and sparse MLPs in each pattern, with no `lax.cond` between them)."""
    from llm_jax.weights import per_layer

    folder, _, tokens, ref, _ = tiny
    cfg, params = load_params(folder)
    _, direct = load_params(folder, per_layer=True)
    converted = per_layer(params, cfg)
    assert jax.tree.structure(direct) == jax.tree.structure(converted)
    for a, b in zip(jax.tree.leaves(direct), jax.tree.leaves(converted)):
        np.testing.assert_array_equal(a, b)
    _, two = load_params(folder, layers=2, per_layer=True)
    assert jax.tree.structure(two) == jax.tree.structure(first_layers(direct, cfg, 2))
    drawn = init_params(cfg, jax.random.PRNGKey(0), per_layer=True)  # layer by layer
    assert jax.tree.structure(drawn) == jax.tree.structure(converted)
    assert [a.shape for a in jax.tree.leaves(drawn)] == [
        a.shape for a in jax.tree.leaves(converted)]
    out = np.asarray(encode(direct, cfg, jnp.asarray(tokens), jnp.asarray(LENGTHS),
                            cfg.num_layers, pool="none", post_norm=True))
    for a, b in zip(valid_rows(out), valid_rows(ref[-1])):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)


BASE = {"model_type": "qwen3_moe", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 64, "rope_theta": 1e6, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 4, "norm_topk_prob": True}


def test_config_fields_and_sparse_rule_by_hand():
    """Released layout (num_experts, rope_theta at the top); HF's class defaults where a field
    is absent (norm_topk_prob False: never assumed True); the sparse rule by hand."""
    a = Qwen3Config.from_dict(BASE)
    assert a.num_experts == 8 and a.norm_topk_prob and a.sparse_layers == (True,) * 4
    b = Qwen3Config.from_dict({k: v for k, v in BASE.items() if k != "norm_topk_prob"})
    assert b.norm_topk_prob is False
    c = Qwen3Config.from_dict(dict(BASE, decoder_sparse_step=2, mlp_only_layers=[3]))
    assert c.sparse_layers == (False, True, False, False)  # (i + 1) % 2 == 0, not layer 3
    d = Qwen3Config.from_dict(dict(BASE, num_experts=0))  # HF: num_experts 0 -> all dense
    assert not d.is_moe and d.dense_layers == (0, 1, 2, 3)
    e = Qwen3Config.from_dict({**{k: v for k, v in BASE.items() if k != "num_experts"},
                               "num_local_experts": 6})
    assert e.num_experts == 6


@pytest.mark.parametrize("edit,match", [
    ({"num_experts_per_tok": 9}, "num_experts_per_tok=9 must lie in 1..num_experts=8"),
    ({"num_experts_per_tok": 0}, "num_experts_per_tok=0"),
    ({"shared_expert_intermediate_size": 64}, "shared experts"),
    ({"n_shared_experts": 1}, "shared experts"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"mlp_only_layers": [4]}, r"mlp_only_layers holds \[4\]"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step=0"),
    ({"moe_intermediate_size": 0}, "moe_intermediate_size=0"),
    ({"model_type": "qwen2_moe"}, "not 'qwen3' or 'qwen3_moe'"),
])
def test_bad_moe_configs_fail_in_one_line(edit, match):
    with pytest.raises(Qwen3ConfigError, match=match) as e:
        Qwen3Config.from_dict(dict(BASE, **edit))
    assert "\n" not in str(e.value)


def test_loader_names_missing_and_stacked_expert_tensors(tiny, tmp_path):
    """A missing expert tensor is named; a checkpoint with stacked expert tensors (one
    [E, 2F, H] per layer) is told how to get HF's per-expert layout."""
    import shutil

    from safetensors.numpy import load_file, save_file

    folder, *_ = tiny
    if (folder / "model.safetensors.index.json").exists():
        pytest.skip("edits the single-file checkpoints")
    cfg = Qwen3Config.from_folder(folder)
    i = cfg.sparse_layers.index(True)
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    t = load_file(str(broken / "model.safetensors"))
    del t[f"model.layers.{i}.mlp.experts.1.up_proj.weight"]
    save_file(t, str(broken / "model.safetensors"))
    with pytest.raises(WeightsError, match=rf"1 missing: \['model.layers.{i}.mlp.experts.1.up_proj"):
        load_params(broken)
    t = load_file(str(folder / "model.safetensors"))
    for proj in ("gate", "up", "down"):
        names = [f"model.layers.{i}.mlp.experts.{j}.{proj}_proj.weight"
                 for j in range(cfg.num_experts)]
        stacked = np.stack([t.pop(n) for n in names])
        if proj != "down":
            t[f"model.layers.{i}.mlp.experts.gate_up_proj"] = stacked  # (shape irrelevant here)
        else:
            t[f"model.layers.{i}.mlp.experts.down_proj"] = stacked
    save_file(t, str(broken / "model.safetensors"))
    with pytest.raises(WeightsError, match="per-expert tensors"):
        load_params(broken)


def test_memory_estimate_of_the_released_shape_by_hand():
    """Qwen3-30B-A3B's weights from its published shapes, counted by hand: 30.5B parameters
    (61.1 GB in bf16), 3.0B used per token (the embedding once, 8 of 128 experts)."""
    from llm_jax.memory import weight_bytes

    cfg = Qwen3Config.shape("qwen3-30b-a3b")
    h, layers, experts, width, vocab = 2048, 48, 128, 768, 151_936
    attn = h * 128 * (32 + 4 + 4) + 32 * 128 * h + 2 * h + 2 * 128
    moe = experts * 3 * h * width + experts * h  # experts + router
    total = 2 * vocab * h + layers * (attn + moe) + h  # untied: embed + lm_head
    assert cfg.num_params() == total
    assert 30.4e9 < total < 30.6e9
    active = vocab * h + layers * (attn + 8 * 3 * h * width + experts * h) + h
    assert cfg.active_params() == active and 3.0e9 < active < 3.4e9
    assert weight_bytes(cfg, jnp.bfloat16) == 2 * total
    assert weight_bytes(cfg, jnp.float32, layers=24) == 4 * (2 * vocab * h + 24 * (attn + moe)
                                                             + h)


def test_the_tile_loop_has_a_static_trip_count():
    """XLA knows the tiled form's loop count when compiling (R / tile + E, whatever the
    routing), so a GPU need not read the loop's condition back every tile; the output is the
    ragged form's. Fails with the loop bounded by the tiles in use (a traced count)."""
    rng = np.random.default_rng(0)
    xs = jnp.asarray(rng.normal(size=(100, 16)), jnp.float32)
    sizes = jnp.array([30, 0, 50, 20])
    gu = jnp.asarray(rng.normal(size=(4, 16, 8)), jnp.float32)
    dn = jnp.asarray(rng.normal(size=(4, 4, 16)), jnp.float32)
    fn = jax.jit(lambda a, b: grouped_tiled(a, b, gu, dn, tile=8))
    text = fn.lower(xs, sizes).compile().as_text()
    counts = [int(n) for n in re.findall(r'"known_trip_count":\{"n":"(\d+)"\}', text)]
    assert -(-100 // 8) + 4 in counts, counts
    np.testing.assert_allclose(fn(xs, sizes), grouped_ragged(xs, sizes, gu, dn), rtol=1e-5,
                               atol=1e-5)
