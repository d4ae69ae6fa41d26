"""Imagination labels (`label.py label --imagine.*`) against HF transformers: each labelled
state's hidden state is the pool of the states HF computes for the tokens HF's own greedy
generate writes after the same prompt, and the kept text is those tokens decoded; the set is
exact (a second command, a redone shard: same bytes) and sampled labels follow their seed.
Online imagination (`train.py --llm.imagine.tokens`) runs in the fused loop."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from fused.data.store import Dataset  # noqa: E402
from qwen_fixtures import build_tiny_qwen3  # noqa: E402
from shared_data import small_data  # noqa: E402, F401 (a fixture: the session's small dataset)

N_NEW, LAYER = 12, 1


@pytest.fixture(scope="module")
def labelled(tmp_path_factory, small_data):
    """A smoke dataset (a copy of the session's `small_data`: 8 envs x 24 steps in two shards)
    labelled by a tiny random checkpoint (real vocabulary) with greedy imagination, every:2
    pooling at layer 1, the text kept."""
    import shutil

    from fused.commands import label

    root = tmp_path_factory.mktemp("imagine")
    weights = root / "qwen"
    model = build_tiny_qwen3(weights, tied=True, head_dim=64, hidden=128, heads=4, kv_heads=2,
                             layers=2, vocab=151_680, seed=5, tokenizer=True)
    data = root / "d"
    shutil.copytree(small_data, data)
    args = ["label", "--data", str(data), "--name", "im", "--llm.weights", str(weights),
            "--llm.layer", str(LAYER), "--llm.skip-n", "8", "--imagine.tokens", str(N_NEW),
            "--imagine.pool", "every:2", "--imagine.keep-text", "--batch", "8",
            "--dtype", "float16"]
    label.main(args)
    return model, weights, data, args


@pytest.mark.slow
def test_labels_are_hf_generation_states_pooled(labelled):
    from fused.data.labelling import imagined_texts, label_sources
    from fused.envspec import spec
    from fused.llm.config import ImagineConfig, LLMConfig
    from fused.llm.encoders import make_encoder
    from fused.rl.obs_codec import ObsCodec
    from fused.text.render import render_tokens
    import jax.numpy as jnp

    model, weights, data, _ = labelled
    ds = Dataset(data)
    env = ds.card()["env"]
    entry = ds.card()["labels"]["im"]
    assert entry["pool"] == "imagine:every:2" and entry["imagine"]["tokens"] == N_NEW
    llm = make_encoder(LLMConfig(backend="jax", weights=str(weights), layer=LAYER,
                             imagine=ImagineConfig(tokens=N_NEW, pool="every:2")), env)
    name = ds.shard_names()[0]
    codec = ObsCodec(spec(env))
    cols = ds.read(name, ["t", "step", "episode_id"] + codec.columns)
    source, _, _ = label_sources(cols, 8)
    obs = codec.decode(np, {k: cols[k] for k in codec.columns})
    lab = ds.read_labels("im", name)
    texts = imagined_texts(lab)
    checked = 0
    for j in np.flatnonzero(source >= 0)[:3]:
        toks, n = render_tokens(llm.renderer, jnp.asarray(obs[source[j]][None]))
        prompt = (list(llm.prefix_ids) + list(np.asarray(toks[0, :int(n[0])]))
                  + list(np.asarray(llm.frozen.tail)))
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=N_NEW, do_sample=False,
                                 eos_token_id=list(llm.stop_ids), pad_token_id=0)
            new = out[0, len(prompt):].numpy()
            states = model.model(input_ids=out, output_hidden_states=True).hidden_states
        h = states[LAYER][0, len(prompt):].numpy()  # the generated tokens' own positions
        want = h[::2].mean(0)
        np.testing.assert_allclose(lab["hidden"][j].astype(np.float32), want,
                                   atol=2e-3 * np.abs(want).max() + 1e-3)
        assert lab["imagined_len"][j] == len(new)
        assert list(lab["imagined"][j, :len(new)]) == list(new)
        assert texts[j] == llm.tokenizer.decode(new.tolist())
        checked += 1
    assert checked == 3


@pytest.mark.slow
def test_the_set_is_exact_and_sampling_follows_its_seed(labelled):
    from fused.commands import label

    _, _, data, args = labelled
    ds = Dataset(data)
    before = json.loads((data / "manifest.json").read_text())["labels"]["im"]
    name = ds.shard_names()[0]
    import shutil

    shutil.rmtree(ds.label_dir("im", name))  # damaged: the rerun redoes it alone
    label.main(args)
    assert json.loads((data / "manifest.json").read_text())["labels"]["im"] == before
    # sampled over the whole vocabulary (151,680 Gumbel draws a token and row: most of the
    # time of a label pass on a CPU with XLA's backend optimisation off), so 3 tokens, not 12,
    # and a row in 24 (one batch of 8 rows), not in 8
    sampled = ["--imagine.temperature", "1.0", "--imagine.tokens", "3", "--llm.skip-n", "24"]

    def digests(set_name, seed):
        label.main([*[a for a in args[:4]], set_name, *args[5:], *sampled,
                    "--imagine.seed", str(seed)])
        return [s["digest"] for s in ds.manifest()["labels"][set_name]["shards"]]

    a, b, c = digests("s0", 0), digests("s0b", 0), digests("s1", 1)
    assert a == b and a != c


@pytest.mark.slow
def test_online_imagination_runs_in_the_fused_loop(tmp_path):
    from fused.commands import train

    run = train.main(["smoke", "--llm.backend", "jax", "--llm.imagine.tokens", "4",
                      "--llm.imagine.temperature", "0.7", "--out-dir", str(tmp_path),
                      "--run-name", "im"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["llm/tokens"] > 0 for r in rows if r["llm/calls"])
    assert json.loads((run / "config.json").read_text())["llm"]["imagine"]["tokens"] == 4
