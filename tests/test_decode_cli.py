"""`python -m llm_jax generate`: the JSON it writes (tokens vs HF transformers' greedy generate,
ids vs the tokenizer's chat template, states vs HF's forward) and its one-line errors, raised
before any weights load."""

import json
import os
import sys

import numpy as np
import pytest

from command_runner import run_command
from conftest import ROOT, subprocess_env
from llm_jax.tokenizer import load_tokenizer

torch = pytest.importorskip("torch")


@pytest.fixture(scope="session")
def cli_model(tmp_path_factory):
    from qwen_fixtures import build_tiny_qwen3

    folder = tmp_path_factory.mktemp("decode-cli")
    model = build_tiny_qwen3(folder, tied=True, head_dim=16, vocab=151_680, hidden=32, heads=2,
                             kv_heads=1, layers=2, seed=4, tokenizer=True)
    return folder, model


def generate_cli(*args, env=None):
    return run_command([sys.executable, "-m", "llm_jax", "generate", *map(str, args)],
                       env=env or subprocess_env(), cwd=ROOT, capture_output=True, text=True,
                       timeout=300)


@pytest.mark.slow
def test_cli_writes_prompts_tokens_text_and_states(cli_model, tmp_path):
    folder, model = cli_model
    (tmp_path / "p.txt").write_text("Map: 0, 1:tree\n\nWhat do you do next?\n")
    (tmp_path / "sys.txt").write_text("You play Craftax. Answer with one action.")
    out = tmp_path / "o.json"
    r = generate_cli("--weights", folder, "--prompt-file", tmp_path / "p.txt", "--prefix-text-file",
                     tmp_path / "sys.txt", "--max-new-tokens", 20, "--greedy", "--ignore-eos",
                     "--layer", 1, "--out", out)
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    tok = load_tokenizer()
    system = {"role": "system", "content": "You play Craftax. Answer with one action."}
    assert [x["prompt"] for x in d["results"]] == ["Map: 0, 1:tree", "What do you do next?"]
    for row in d["results"]:
        whole = tok.apply_chat_template([system, {"role": "user", "content": row["prompt"]}],
                                        enable_thinking=False)
        assert whole.endswith("<think>\n\n</think>\n\n")
        ids = d["prefix_ids"] + row["prompt_ids"]
        assert ids == tok.encode(whole)
        with torch.no_grad():
            ref = model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0]
            states = model.model(input_ids=ref[None], output_hidden_states=True).hidden_states
        assert row["tokens"] == ref[len(ids):].tolist()
        assert row["text"] == tok.decode(row["tokens"])
        np.testing.assert_allclose(row["hidden"], states[1][0, len(ids):].numpy(), atol=1e-4)
    assert d["settings"]["temperature"] == 0 and d["settings"]["stop_ids"] == []

    # raw, sampled, default stop tokens: the same seed gives the same tokens
    args = ("--weights", folder, "--prompt", "Hello", "--raw", "--max-new-tokens", 6,
            "--temperature", 0.7, "--top-k", 5, "--seed", 9, "--out")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert generate_cli(*args, a).returncode == 0 and generate_cli(*args, b).returncode == 0
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    assert ra["results"] == rb["results"]
    assert ra["results"][0]["prompt_ids"] == tok.encode("Hello") and ra["prefix_ids"] == []
    assert 1 <= len(ra["results"][0]["tokens"]) <= 6
    assert ra["settings"]["stop_ids"] == [151643, 151645]  # <|endoftext|>, <|im_end|>
    assert ra["settings"]["sampling"]["source"] == {"temperature": "flag", "top_k": "flag",
                                                    "top_p": "default (off)"}

    # no sampling flag: the checkpoint's generation_config.json (Qwen3's values) is used and
    # recorded with its source; a base model's EOS alone still stops a chat at <|im_end|>
    import shutil

    from transformers import AutoTokenizer

    own = tmp_path / "own-defaults"
    shutil.copytree(folder, own)
    (own / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
         "eos_token_id": 151643}))
    c = tmp_path / "c.json"
    r = generate_cli("--weights", own, "--prompt", "Hello", "--max-new-tokens", 12,
                     "--keep-special", "--seed", 2, "--out", c)
    assert r.returncode == 0, r.stderr
    d = json.loads(c.read_text())
    assert d["settings"]["sampling"] == {
        "greedy": False, "temperature": 0.6, "top_k": 20, "top_p": 0.95,
        "source": {k: "generation_config.json" for k in ("temperature", "top_k", "top_p")}}
    assert d["settings"]["stop_ids"] == [151643, 151645] and d["settings"]["dtype"] == "float32"
    hf = AutoTokenizer.from_pretrained(tok.folder)
    row = d["results"][0]
    assert row["text"] == hf.decode(row["tokens"])  # --keep-special: as written
    assert json.loads(a.read_text())["results"][0]["text"] == hf.decode(
        ra["results"][0]["tokens"], skip_special_tokens=True)


BAD = [  # (arguments, words the one-line error must contain)
    (["--prompt", "hi", "--greedy", "--temperature", "0.5"],
     "--greedy with --temperature 0.5: greedy tokens take no sampling flag"),
    (["--prompt", "hi", "--greedy", "--seed", "1"], "--seed given with --greedy"),
    (["--prompt", "hi", "--temperature", "0", "--top-k", "4"], "--temperature 0 is greedy"),
    (["--prompt", "hi", "--prompt-file", "p.txt"], "exactly one of --prompt or --prompt-file"),
    ([], "exactly one of --prompt or --prompt-file"),
    (["--prompt-file", "empty.txt"], "holds no prompt"),
    (["--prompt-file", "absent.txt"], "not found"),
    (["--prompt", "hi", "--max-new-tokens", "0"], "--max-new-tokens 0"),
    (["--prompt", "hi", "--temperature", "-1"], "--temperature -1.0 is negative"),
    (["--prompt", "hi", "--top-p", "0"], "--top-p 0.0 lies outside (0, 1]"),
    (["--prompt", "hi", "--top-p", "1.5"], "--top-p 1.5 lies outside (0, 1]"),
    (["--prompt", "hi", "--top-k", "-3"], "--top-k -3 is negative"),
    (["--prompt", "hi", "--max-new-tokens", "4090"], "exceeds the model's context "
     "(max_position_embeddings=4096)"),
    (["--prompt", "hi", "--layer", "3"], "--layer 3 must lie in 0..2"),
]


@pytest.mark.parametrize("args,words", BAD, ids=[w[:30] for _, w in BAD])
def test_cli_errors_in_one_line_before_loading_weights(cli_model, tmp_path, monkeypatch, args,
                                                       words):
    import llm_jax.loader
    from llm_jax.__main__ import main

    folder, _ = cli_model
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.txt").write_text("hi\n")
    (tmp_path / "empty.txt").write_text("\n  \n")
    monkeypatch.setattr(llm_jax.loader, "load_params",
                        lambda *a, **k: pytest.fail("weights loaded before the check"))
    argv = ["generate", "--weights", str(folder), "--out", "o.json", "--max-new-tokens", "8"]
    with pytest.raises(SystemExit) as e:
        main(argv + args)
    msg = str(e.value.code)
    assert msg.startswith("error: ") and "\n" not in msg and words in msg, msg


def test_cli_error_exits_without_touching_jax(cli_model, tmp_path):
    """In a process where any JAX computation would crash (no such platform), the error is the
    last line of stderr, alone."""
    folder, _ = cli_model
    env = dict(subprocess_env(), JAX_PLATFORMS="no-such-platform")
    r = generate_cli("--weights", folder, "--prompt", "hi", "--max-new-tokens", 5000, "--out",
                     tmp_path / "o.json", env=env)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith("error: prefix 0 + longest prompt")
    assert not (tmp_path / "o.json").exists() and os.listdir(tmp_path) == []
