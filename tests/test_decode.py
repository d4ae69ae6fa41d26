"""Decoding (`llm_jax.decode.generate`) vs HF transformers (torch CPU) on tiny random checkpoints:
greedy tokens, hidden states of the generated tokens, a shared prefix, per-row stops; sampling
checked statistically against softmax(logits / T) restricted by hand (numpy), and its keys.
The real-vLLM comparison is in test_decode_vllm.py, the CLI in test_decode_cli.py."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from llm_jax.decode import GenerateSpec, check_generate, generate  # noqa: E402
from llm_jax.sampling import GREEDY, GenerateError, Sampling  # noqa: E402
from llm_jax.loader import load_params  # noqa: E402
from llm_jax.model import prefill  # noqa: E402
from qwen_fixtures import build_tiny_qwen3  # noqa: E402

N_NEW = 70
LENGTHS = (7, 3, 12, 1)
PREFIX = 9
PAD = 5  # a pad id unlike the old fill (0): rows past their end must hold it


# the fast lane decodes the tied model; the untied one (its own lm_head) in the slow lane
@pytest.fixture(scope="session", params=["tied", pytest.param("untied", marks=pytest.mark.slow)])
def tiny(request, tmp_path_factory):
    """(HF model, our config, our params, prefix ids, per-row prompt ids)."""
    tied = request.param == "tied"
    folder = tmp_path_factory.mktemp(f"decode-{request.param}")
    model = build_tiny_qwen3(folder, tied=tied, seed=11 if tied else 12)
    cfg, params = load_params(folder)
    assert (params.lm_head is not None) != tied
    rng = np.random.default_rng(1)
    prefix = rng.integers(0, cfg.vocab_size, PREFIX)
    prompts = [rng.integers(0, cfg.vocab_size, n) for n in LENGTHS]
    return model, cfg, params, prefix, prompts


def padded(prompts):
    tokens = np.zeros((len(prompts), max(map(len, prompts))), np.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = p
    return jnp.asarray(tokens), jnp.array([len(p) for p in prompts], jnp.int32)


def hf_greedy(model, ids, n_new):
    """HF generate, one row at a time (no padding), EOS never stops it; the new tokens."""
    with torch.no_grad():
        out = model.generate(torch.tensor([list(ids)]), max_new_tokens=n_new, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(ids):].numpy()


def hf_states(model, ids):
    """HF's hidden_states over the whole sequence: [L + 1] arrays [T, H] (the last post-norm)."""
    with torch.no_grad():
        out = model.model(input_ids=torch.tensor([list(ids)]), output_hidden_states=True)
    return [h[0].numpy() for h in out.hidden_states]


def run(cfg, params, prompts, *, cache=None, key=0, **kw):
    tokens, lengths = padded(prompts)
    return generate(params, cfg, GenerateSpec(pad_id=PAD, **kw), tokens, lengths,
                    key=jax.random.PRNGKey(key), prefix=cache)


def test_greedy_and_hidden_states_match_hf(tiny):
    """70 new tokens per ragged row, batched, vs HF generate per row; the states of the
    generated tokens at an inner layer (pre-norm) vs HF's forward over prompt + generated."""
    model, cfg, params, _, prompts = tiny
    spec = GenerateSpec(max_new_tokens=N_NEW, pad_id=PAD, hidden_layer=1)
    out = jax.jit(lambda p, t, n: generate(p, cfg, spec, t, n, key=jax.random.PRNGKey(0)))(
        params, *padded(prompts))
    np.testing.assert_array_equal(out.num_tokens, N_NEW)
    for i, p in enumerate(prompts):
        ref = hf_greedy(model, p, N_NEW)
        np.testing.assert_array_equal(np.asarray(out.tokens[i]), ref, err_msg=f"row {i}")
        states = hf_states(model, np.concatenate([p, ref]))
        np.testing.assert_allclose(out.hidden[i], states[1][len(p):], atol=1e-4, rtol=0)


def test_prefix_then_prompt_equals_hf_on_the_concatenation(tiny):
    """A shared prefix cache + ragged rows = HF on prefix + prompt; the last layer's states
    with the final norm = HF's hidden_states[-1] at the generated positions."""
    model, cfg, params, prefix, prompts = tiny
    cache = prefill(params, cfg, jnp.asarray(prefix))
    spec = GenerateSpec(max_new_tokens=N_NEW, pad_id=PAD, hidden_layer=cfg.num_layers,
                        post_norm=True)
    out = jax.jit(lambda p, c, t, n: generate(p, cfg, spec, t, n, key=jax.random.PRNGKey(0),
                                              prefix=c))(params, cache, *padded(prompts))
    for i, p in enumerate(prompts):
        full = np.concatenate([prefix, p])
        ref = hf_greedy(model, full, N_NEW)
        np.testing.assert_array_equal(np.asarray(out.tokens[i]), ref, err_msg=f"row {i}")
        states = hf_states(model, np.concatenate([full, ref]))
        np.testing.assert_allclose(out.hidden[i], states[-1][len(full):], atol=1e-4, rtol=0)


def test_rows_stop_at_their_own_stop_token(tiny):
    """A stop id taken from one row's HF continuation: that row ends with it (kept, its state
    too); rows that never produce it go on to N_NEW; nothing past a row's end changes."""
    model, cfg, params, _, prompts = tiny
    refs = [hf_greedy(model, p, 24) for p in prompts]
    # the first token of row 0's continuation at index >= 4 that it has not produced before
    stop = next(int(t) for j, t in enumerate(refs[0]) if j >= 4 and t not in refs[0][:j])
    expect = [r[: list(r).index(stop) + 1] if stop in r else r for r in refs]
    assert len(expect[0]) < 24 and any(len(e) == 24 for e in expect)  # the test means something
    out = run(cfg, params, prompts, max_new_tokens=24, stop_ids=(stop, cfg.vocab_size + 5),
              hidden_layer=2)
    for i, (p, e) in enumerate(zip(prompts, expect)):
        assert int(out.num_tokens[i]) == len(e)
        np.testing.assert_array_equal(np.asarray(out.tokens[i, : len(e)]), e)
        assert (np.asarray(out.tokens[i, len(e):]) == PAD).all()
        assert not np.asarray(out.hidden[i, len(e):]).any()
        states = hf_states(model, np.concatenate([p, e]))
        np.testing.assert_allclose(out.hidden[i, : len(e)], states[2][len(p):], atol=1e-4)


def reference_probs(logits, s: Sampling):
    """numpy, from the definitions: softmax(logits / T); keep the top k; then, in descending
    order, keep a token while the (renormalised) probability of those before it is < top_p."""
    x = np.asarray(logits, np.float64) / s.temperature
    order = np.argsort(-x, kind="stable")
    keep = np.zeros(x.size, bool)
    keep[order[: s.top_k or x.size]] = True
    p = np.where(keep, np.exp(x - x.max()), 0.0)
    p /= p.sum()
    before = 0.0
    for t in order:
        if keep[t] and before >= s.top_p:
            keep[t] = False
        before += p[t]
    p = np.where(keep, p, 0.0)
    return p / p.sum()


def chi_square_p(counts, probs):
    """p-value of observed counts against probs, bins with expected < 5 pooled; counts outside
    the support fail outright."""
    assert counts[probs == 0].sum() == 0, "a token outside the allowed set was sampled"
    n = counts.sum()
    exp = probs * n
    big = exp >= 5
    obs = np.append(counts[big], counts[~big & (probs > 0)].sum())
    exp = np.append(exp[big], exp[~big & (probs > 0)].sum())
    obs, exp = (obs[:-1], exp[:-1]) if exp[-1] == 0 else (obs, exp)
    try:
        from scipy.stats import chisquare

        return chisquare(obs, exp).pvalue
    except ImportError:  # the statistic against the 0.1% critical value (Wilson-Hilferty)
        stat, df = ((obs - exp) ** 2 / exp).sum(), len(obs) - 1
        crit = df * (1 - 2 / (9 * df) + 3.09 * np.sqrt(2 / (9 * df))) ** 3
        return 1.0 if stat < crit else 0.0


SAMPLINGS = [Sampling(1.3), Sampling(0.9, top_k=7), Sampling(1.0, top_p=0.6),
             Sampling(1.6, top_k=40, top_p=0.7)]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=lambda s: f"T{s.temperature}-k{s.top_k}-p{s.top_p}")
def test_sampled_frequencies_match_softmax(tiny, sampling):
    """4,000 rows of one prompt, one new token each: the frequencies of the first token vs HF's
    logits at the prompt's last position, filtered by hand (chi-square, p > 0.001)."""
    model, cfg, params, _, prompts = tiny
    p = prompts[0]
    rows = 4000
    out = run(cfg, params, [p] * rows, max_new_tokens=1, sampling=sampling, key=3)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([list(p)])).logits[0, -1].numpy()
    probs = reference_probs(logits, sampling)
    counts = np.bincount(np.asarray(out.tokens[:, 0]), minlength=cfg.vocab_size)
    assert chi_square_p(counts, probs) > 1e-3


def test_hand_computed_filters():
    """Logits by hand: top-p 0.6 over (0.4, 0.3, 0.2, 0.1) keeps the first two (0.4 < 0.6,
    0.7 >= 0.6) -> 4/7, 3/7; top-k 3 at T = 2 over the same: sqrt(p) of the first three."""
    from llm_jax.sampling import sample_tokens

    logits = jnp.log(jnp.array([[0.1, 0.4, 0.2, 0.3]] * 20_000))
    keys = jax.random.split(jax.random.PRNGKey(0), 20_000)
    cases = [(Sampling(1.0, top_p=0.6), [0, 4 / 7, 0, 3 / 7]),
             (Sampling(2.0, top_k=3), np.array([0, 0.4, 0.2, 0.3]) ** 0.5 * [0, 1, 1, 1])]
    for s, p in cases:
        p = np.asarray(p) / np.sum(p)
        counts = np.bincount(np.asarray(sample_tokens(logits, keys, s)), minlength=4)
        assert chi_square_p(counts, p) > 1e-3, (s, counts)


def test_keys_rows_and_calls(tiny):
    """Identical rows draw different tokens; the same key draws the same; another key others; a
    row's draws do not depend on the rows beside it (row 0 alone = row 0 in a batch); steps
    draw afresh (at T = 100, nearly uniform over 320 tokens, a row's 16 tokens are mostly
    distinct, where one noise reused every step would repeat one token)."""
    _, cfg, params, _, prompts = tiny
    s = Sampling(1.0)
    a = run(cfg, params, [prompts[0]] * 3, max_new_tokens=16, sampling=s, key=1).tokens
    b = run(cfg, params, [prompts[0]] * 3, max_new_tokens=16, sampling=s, key=1).tokens
    c = run(cfg, params, [prompts[0]] * 3, max_new_tokens=16, sampling=s, key=2).tokens
    alone = run(cfg, params, [prompts[0]], max_new_tokens=16, sampling=s, key=1).tokens
    np.testing.assert_array_equal(a, b)
    assert (a[0] != a[1]).any() and (a[1] != a[2]).any() and (a[0] != a[2]).any()
    assert (a != c).any(axis=1).all()
    np.testing.assert_array_equal(alone[0], a[0])
    hot = run(cfg, params, [prompts[0]] * 2, max_new_tokens=16, sampling=Sampling(100.0), key=4)
    assert all(len(set(np.asarray(r).tolist())) >= 12 for r in hot.tokens)


def test_settings_rejected_in_one_line(tiny):
    _, cfg, _, _, _ = tiny
    for bad in (dict(temperature=-0.1), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.01)):
        with pytest.raises(GenerateError, match="temperature|top_k|top_p"):
            Sampling(**{"temperature": 1.0, **bad})
    with pytest.raises(GenerateError, match="max_position_embeddings=4096"):
        check_generate(cfg, [10, 30], 4000, prefix_len=100)
    check_generate(cfg, [10, 30], 3966, prefix_len=100)  # exactly the context: fine
    with pytest.raises(GenerateError, match="max_new_tokens=0"):
        check_generate(cfg, [3], 0)
    with pytest.raises(GenerateError, match="prompt 1 is empty"):
        check_generate(cfg, [3, 0], 5)
    with pytest.raises(GenerateError, match="hidden_layer=4"):
        check_generate(cfg, [3], 5, hidden_layer=4)
    assert GREEDY.greedy and not Sampling(0.5).greedy


def test_first_argmax_equals_numpy_with_ties():
    """The blocked argmax used for greedy and Gumbel draws: numpy's first index of the maximum,
    with ties across and inside blocks, a vocabulary with no divisor near the block size (a
    prime: blocks of 1) and the Qwen3 vocabulary (blocks of 480)."""
    from llm_jax.sampling import first_argmax

    rng = np.random.default_rng(0)
    for v in (300, 1024, 1031, 151_680):
        x = rng.integers(0, 7, (6, v)).astype(np.float32)  # many ties of the maximum
        x[1] = -3.0  # every entry tied
        x[2, -1] = 99.0  # in the last block
        x[3, :] = 0.0
        x[3, [5, v - 1]] = 1.0  # a tie across blocks
        np.testing.assert_array_equal(first_argmax(jnp.asarray(x)), np.argmax(x, axis=-1))


@pytest.mark.parametrize("case", ["candidates", "whole"])
def test_top_p_alone_sorts_a_bounded_set_exactly(monkeypatch, case):
    """Top-p without top-k over a vocabulary larger than the candidates sorted: where the
    candidates hold the nucleus, and where a flat row's do not (the whole row sorted), the
    frequencies are softmax restricted to the nucleus by hand (numpy). Fails if the nucleus is
    measured within the candidates instead of the whole row."""
    import llm_jax.sampling as sampling

    monkeypatch.setattr(sampling, "TOP_P_CANDIDATES", 8)
    v, rows = 64, 20_000
    rng = np.random.default_rng(3)
    if case == "candidates":  # a nucleus of 5 tokens (0.2 + ... + 0.1 < 0.7 <= 0.75)
        head = [0.2, 0.18, 0.15, 0.12, 0.1, 0.08]
        p = np.concatenate([head, np.full(v - len(head), (1 - sum(head)) / (v - len(head)))])
        logits = np.log(rng.permutation(p))
    else:  # nearly flat: 8 tokens hold far less than top-p
        logits = rng.normal(size=v) * 0.3
    s = Sampling(1.0, top_p=0.7 if case == "candidates" else 0.5)
    p = np.exp(logits - logits.max())
    held = np.sort(p / p.sum())[::-1][:8].sum() >= s.top_p
    assert held == (case == "candidates")  # each case takes the path it names
    keys = jax.random.split(jax.random.PRNGKey(5), rows)
    x = jnp.asarray(np.tile(logits, (rows, 1)), jnp.float32)
    counts = np.bincount(np.asarray(jax.jit(
        lambda x, k: sampling.sample_tokens(x, k, s))(x, keys)), minlength=v)
    assert chi_square_p(counts, reference_probs(logits, s)) > 1e-3


def test_sampling_defaults_are_the_checkpoints_as_hf_reads_them(tmp_path):
    """No flag: the folder's generation_config.json as HF transformers' GenerationConfig reads
    it (Qwen3's file: do_sample, 0.6 / 20 / 0.95; fields it leaves out at HF's defaults; no
    do_sample: greedy); no file: greedy; each flag overrides its value, and where each came
    from is recorded; --greedy with a sampling flag, or temperature 0 with top-k, is one line."""
    import json

    from transformers import GenerationConfig

    from llm_jax.sampling import SamplingFlags, resolve_sampling

    qwen3 = {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
             "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95}
    files = {"qwen3": qwen3, "no-top-k": {"do_sample": True, "temperature": 0.8},
             "no-do-sample": {"temperature": 0.6, "top_k": 20}}
    for name, content in files.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "generation_config.json").write_text(json.dumps(content))
        hf = GenerationConfig.from_pretrained(folder).to_dict()
        # what HF's generate uses: the file's values, the ones it leaves None at HF's defaults
        hf = {**GenerationConfig._get_default_generation_params(),
              **{k: v for k, v in hf.items() if v is not None}}
        got = resolve_sampling(SamplingFlags(), folder)
        if hf["do_sample"]:
            assert got.sampling == Sampling(hf["temperature"], hf["top_k"], hf["top_p"]), name
        else:
            assert got.sampling.greedy, name
    got = resolve_sampling(SamplingFlags(), tmp_path / "qwen3")
    assert got.sampling == Sampling(0.6, 20, 0.95)
    assert set(got.source.values()) == {"generation_config.json"}
    got = resolve_sampling(SamplingFlags(top_k=5), tmp_path / "qwen3")
    assert got.sampling == Sampling(0.6, 5, 0.95) and got.source["top_k"] == "flag"
    assert got.record()["source"]["temperature"] == "generation_config.json"
    assert resolve_sampling(SamplingFlags(), tmp_path / "absent").sampling.greedy
    assert resolve_sampling(SamplingFlags(), None).sampling.greedy
    got = resolve_sampling(SamplingFlags(temperature=0.9), None)  # a flag over greedy: samples
    assert got.sampling == Sampling(0.9, 0, 1.0)
    assert resolve_sampling(SamplingFlags(greedy=True), tmp_path / "qwen3").sampling.greedy
    with pytest.raises(GenerateError, match="--greedy with --temperature 0.7"):
        resolve_sampling(SamplingFlags(greedy=True, temperature=0.7), None)
    with pytest.raises(GenerateError, match="--temperature 0 is greedy"):
        resolve_sampling(SamplingFlags(temperature=0.0, top_k=3), None)
    with pytest.raises(GenerateError, match="llm.imagine.top_p=1.5"):
        resolve_sampling(SamplingFlags(top_p=1.5), None, "llm.imagine.")


def hlo_computations(text: str) -> dict[str, str]:
    """{computation name: its body} of an HLO module's text."""
    out, name = {}, None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head and not line.startswith(" "):
            name = head.group(1)
            out[name] = ""
        elif name is not None:
            out[name] += line + "\n"
    return out


def loop_text(text: str, carried: str) -> str:
    """The text of the `while` whose state holds an array of type `carried` (e.g. the decode
    loop's tokens, s32[B,N]) and the most else (loops inside it, such as XLA:CPU's scatter
    loops, carry less): its state's types, its body and condition and every computation they
    call, recursively."""
    comps = hlo_computations(text)
    line = max((x for c in comps.values() for x in c.splitlines()
                if " while(" in x and carried in x.split(" while(")[0]),
               key=lambda x: len(x.split(" while(")[0]))
    seen, todo, out = set(), re.findall(r"(?:condition|body)=%?([\w.\-]+)", line), [line]
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        out.append(comps[name])
        todo += re.findall(r"(?:calls|to_apply|body|condition|branch_computations)=\{?%?"
                           r"([\w.\-]+(?:, %?[\w.\-]+)*)", comps[name])
        todo = [n.strip("% ") for t in todo for n in t.split(",")]
    return "\n".join(out)


@pytest.mark.parametrize("layout", ["stacked", "per-layer"])
def test_the_decode_loop_slices_no_stack_of_layers(tiny, layout):
    """The compiled decode loop (read from XLA's HLO) holds each layer's weights and cache as
    arrays of their own: no array with the stacks' leading layer axis anywhere in the loop, its
    body or what it calls (the scan over stacked layers sliced every weight and cache every
    step). The per-layer layout gives the same tokens and states as the stacked one."""
    from llm_jax.weights import per_layer

    _, cfg, params, _, prompts = tiny
    tokens, lengths = padded(prompts)
    p = params if layout == "stacked" else jax.jit(lambda q: per_layer(q, cfg))(params)
    spec = GenerateSpec(max_new_tokens=6, pad_id=PAD, hidden_layer=1)
    fn = jax.jit(lambda q, t, n: generate(q, cfg, spec, t, n, key=jax.random.PRNGKey(0)))
    text = fn.lower(p, tokens, lengths).compile().as_text()
    body = loop_text(text, f"s32[{len(prompts)},6]")
    stacked = {f"[{','.join(map(str, a.shape))}]"
               for a in jax.tree.leaves(params.layers.common)}
    stacked |= {f"[{cfg.num_layers},{len(prompts)},"}  # a cache of every layer
    assert not [s for s in stacked if s in body], [s for s in stacked if s in body]
    if layout == "per-layer":
        want = fn(params, tokens, lengths)
        got = fn(p, tokens, lengths)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_allclose(got.hidden, want.hidden, atol=1e-5)
