"""The encoder interface (`fused.llm.encoder`): a model that reads the game is one implementation
registered with `fused.llm.encoders.register`. A toy of this file's own (a fixed random
projection of the observation) trains with train.py, labels a dataset with label.py and is
evaluated by offline.py eval, with no other file changed; its states are checked against numpy.
And the picker: which built-in kind `auto` takes for which settings."""

from __future__ import annotations

import json
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fused.envspec import spec
from fused.errors import ConfigError
from fused.llm.batching import Batching
from fused.llm.config import LLMConfig
from fused.llm.encoder import Encoded, OnDevice
from fused.llm.encoders import KINDS, Kind, kind_of, register, validate_llm
from fused.runs.config_io import to_dict
from shared_data import small_data  # noqa: F401 (a fixture: the session's small dataset)

ENV = "Craftax-Classic-Symbolic-v1"
WIDTH = 16


class Frozen(NamedTuple):
    w: jax.Array  # [D, WIDTH]
    shuffle: jax.Array


class Projection(OnDevice):
    """tanh(obs @ W), W ~ N(0, 1 / D) from the run's seed."""

    draws, load_shape, tokenizer, layer = False, None, None, 0
    ablations = ("real", "zero", "shuffle")
    hidden_size = WIDTH

    def __init__(self, cfg: LLMConfig, env_name: str, seed: int = 0, like=None):
        dim = spec(env_name).obs_dim
        self.cfg, self.seed = cfg, seed
        w = np.random.default_rng(seed).normal(0, dim ** -0.5, (dim, WIDTH)).astype(np.float32)
        self.frozen = Frozen(jnp.asarray(w), jnp.asarray(cfg.hidden == "shuffle"))

    def encode(self, frozen, obs, microbatch=None, keys=None) -> Encoded:
        return Encoded(jnp.tanh(obs @ frozen.w), jnp.int32(0))

    def batching(self, local_envs, platform=None) -> Batching:
        return Batching(local_envs, min(2, local_envs), 1.0)

    def identity(self) -> dict:
        return {"weights_digest": f"projection:seed{self.seed}", "prompt_digest": "",
                "layer": 0, "pool": "projection", "post_norm": False}

    def card(self, label_dtype, imagine=None) -> dict:
        return json.loads(json.dumps({"llm": to_dict(self.cfg), "backend": "jax",
                                      **self.identity(), "skip_n": self.cfg.skip_n,
                                      "dtype": label_dtype, "hidden": self.cfg.hidden}))


@pytest.fixture
def projection():
    kind = Kind("toy-projection", Projection, accepts=lambda c: False,
                validate=lambda *a: None, hidden_size=lambda c: WIDTH,
                ablations=Projection.ablations)
    register(kind)
    yield kind
    del KINDS["toy-projection"]


def test_auto_picks_each_built_in_kind_by_the_settings(tmp_path):
    from fused.llm.config import ImagineConfig

    assert kind_of(LLMConfig(backend="jax")).name == "text"
    assert kind_of(LLMConfig(backend="jax", imagine=ImagineConfig(tokens=4))).name == \
        "text-imagine"
    assert kind_of(LLMConfig(backend="vllm", weights=str(tmp_path))).name == "vllm"
    (tmp_path / "config.json").write_text(json.dumps({"vision_config": {}}))
    assert kind_of(LLMConfig(weights=str(tmp_path))).name == "vl"
    assert kind_of(LLMConfig(weights=str(tmp_path), imagine=ImagineConfig(tokens=2))).name == \
        "vl-imagine"
    assert kind_of(LLMConfig(backend="jax", encoder="text")).name == "text"
    with pytest.raises(ConfigError, match="llm.encoder='nope' is not a registered encoder"):
        validate_llm(LLMConfig(backend="jax", encoder="nope"), ENV, 8)
    with pytest.raises(ValueError, match="registered already"):
        register(KINDS["text"])


@pytest.mark.slow
def test_a_registered_encoder_trains_labels_and_evaluates(projection, small_data, tmp_path):
    import shutil

    from fused.commands import label, offline, train
    from fused.data.store import Dataset
    from fused.rl.obs_codec import ObsCodec

    flags = ["--llm.backend", "jax", "--llm.encoder", "toy-projection"]
    run = train.main(["smoke", *flags, "--llm.skip-n", "2", "--out-dir", str(tmp_path),
                      "--run-name", "r"])
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["update"] == 6 and all(r["llm/calls"] > 0 for r in rows)
    assert json.loads((run / "config.json").read_text())["llm"]["encoder"] == "toy-projection"

    data = tmp_path / "d"
    shutil.copytree(small_data, data)  # (the session's `label.py generate smoke`, 24 steps)
    label.main(["label", "--data", str(data), "--name", "toy", *flags, "--llm.skip-n", "1",
                "--dtype", "float16"])
    ds = Dataset(data)
    name = ds.shard_names()[0]
    codec = ObsCodec(spec(ENV))
    obs = codec.decode(np, ds.read(name, codec.columns))
    labels = ds.read_labels("toy", name)
    w = np.random.default_rng(0).normal(0, spec(ENV).obs_dim ** -0.5,
                                        (spec(ENV).obs_dim, WIDTH)).astype(np.float32)
    np.testing.assert_allclose(labels["hidden"][labels["label_row"]].astype(np.float32),
                               np.tanh(obs.astype(np.float64) @ w), atol=2e-3)
    assert ds.card()["labels"]["toy"]["weights_digest"] == "projection:seed0"

    out = offline.main(["eval", "--run", str(run), "--episodes", "4", "--max-steps", "30"])
    assert out["episodes"] == 4 and (run / "eval.json").is_file()
