"""`python -m llm_jax encode|generate|truncate ...`: hidden states of a text (with images before
it, `--image`, on a Qwen3-VL model), generated text (and the generated tokens' hidden states),
or a layer-truncated copy of a checkpoint (so a vLLM server's post-norm output equals our
`layer=L, post_norm=True`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import tyro

from llm_jax.cli import closest, help_paragraphs, typos_in_one_line
from llm_jax.cli_images import as_flags, run_encode_images, run_generate_images
from llm_jax.graphs import Graphs
from llm_jax.sampling import SamplingFlags


ENCODE = "Hidden states of a text (a chat turn with --chat), after an optional cached prefix."
GENERATE = ("Text generated for prompts, sampled as the checkpoint's generation_config.json says "
            "unless flags say otherwise (greedy where there is none).")
TRUNCATE = "A copy of a checkpoint cut after its first L layers (a vLLM server's last layer)."


@dataclasses.dataclass(frozen=True)
class Encode:
    weights: str
    """HuggingFace Qwen3 model folder (dense or MoE; with --image a Qwen3-VL one, dense or MoE)."""
    out: str
    """Output .npz with `hidden` ([T, H] for pool none, else [H]) and `token_ids` [T]."""
    text: str | None = None
    """Text to encode."""
    text_file: str | None = None
    """Read the text from this file instead."""
    chat: bool = False
    """Wrap the text as a user message in the Qwen3 chat template (with generation prompt)."""
    enable_thinking: bool = False
    """With --chat: leave thinking on (off appends the empty <think></think> block)."""
    layer: int | None = None
    """Layer (HF convention: 0 = embeddings, i = after block i); default the last."""
    pool: str = "last"
    """Pooling over positions: none, last, mean (every token), or with --image every:K (the
    mean of every K-th image token, e.g. every:8) or image-mean (of every image token)."""
    post_norm: bool = False
    """Apply the final RMSNorm."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype: auto (float32 on CPU; on a GPU/TPU the checkpoint's own, bfloat16 for
    Qwen3, as HF's torch_dtype=auto and vLLM's dtype=auto do), float32 or bfloat16."""
    attention: Literal["auto", "cudnn", "blocked", "row", "pallas"] = "auto"
    """Attention form (llm_jax.model.attention); pallas runs interpreted on CPU."""
    prefix_text_file: str | None = None
    """Encode this file's text first as a cached prefix (`prefill`), then the text after it
    (the layout of the LLM-augmented policy's prompt); the .npz then also holds `prefix_ids`."""
    image: tyro.conf.UseAppendAction[tuple[str, ...]] = ()
    """Images (PNG, JPEG; one size) before the text, each as `<|vision_start|><|image_pad|> x
    n<|vision_end|>`: the weights must be a Qwen3-VL folder. The .npz also holds
    `image_grid` and `image_positions`."""


@dataclasses.dataclass(frozen=True)
class Generate(SamplingFlags):
    """Sampling: the checkpoint's generation_config.json unless a flag says otherwise (as HF
    transformers and vLLM do); greedy where the checkpoint has none."""

    weights: str
    """HuggingFace Qwen3 model folder (dense or MoE; with --image a Qwen3-VL one, dense or MoE)."""
    out: str
    """Output .json: settings, prefix_ids, and per prompt {prompt, prompt_ids, tokens, text}
    (+ hidden [n, H] with --layer)."""
    max_new_tokens: int
    """Tokens to generate per prompt at most (fewer where a stop token comes first)."""
    prompt: str | None = None
    """One prompt."""
    prompt_file: str | None = None
    """Prompts, one a line (blank lines skipped), generated in one batch."""
    raw: bool = False
    """Use the prompt's tokens as they are (no chat template)."""
    enable_thinking: bool = False
    """Chat template with thinking on (off, the default, appends an empty <think></think>)."""
    prefix_text_file: str | None = None
    """Shared prefix, computed once for all prompts: the system message in the chat template,
    or (with --raw) text whose tokens come before each prompt's."""
    seed: int | None = None
    """PRNG seed of the sampling (unset: 0); not with --greedy."""
    ignore_eos: bool = False
    """Generate max_new_tokens for every prompt, past EOS."""
    keep_special: bool = False
    """Keep special tokens (<|im_end|>, <|endoftext|>) in each result's `text` (its `tokens`
    always hold them)."""
    layer: int | None = None
    """Also write each generated token's hidden state at this layer (HF convention: 0 =
    embeddings, i = after block i)."""
    post_norm: bool = False
    """With --layer: apply the final RMSNorm to the states."""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Compute dtype: auto (float32 on CPU; on a GPU/TPU the checkpoint's own, bfloat16 for
    Qwen3), float32 or bfloat16; logits are float32 either way."""
    attention: Literal["auto", "cudnn", "blocked", "row", "pallas"] = "auto"
    """Attention form of the prompt pass (decode steps use plain jnp)."""
    cuda_graphs: Graphs = "loops"
    """On an NVIDIA GPU, the decode loop's kernels as CUDA graphs (llm_jax/graphs.py): only the
    launching differs; nothing changes elsewhere."""
    image: tyro.conf.UseAppendAction[tuple[str, ...]] = ()
    """Images (one size) before the prompt's text (with --prompt): the weights must be a
    Qwen3-VL folder."""


@dataclasses.dataclass(frozen=True)
class Truncate:
    weights: str
    """HuggingFace Qwen3 model folder (dense or MoE)."""
    layers: int
    """Keep the first L layers."""
    out: str
    """New model folder (config.json, model.safetensors, tokenizer files)."""


def run_encode(a: Encode) -> Path:
    if (a.text is None) == (a.text_file is None):
        raise SystemExit("error: give exactly one of --text or --text-file")
    text = a.text if a.text is not None else Path(a.text_file).read_text()
    if a.image:
        return run_encode_images(a, text)
    if a.pool not in ("none", "last", "mean"):
        raise SystemExit(f"error: --pool {a.pool}: choose none, last or mean (every:K and "
                         "image-mean pool image tokens: with --image)")
    import jax
    import jax.numpy as jnp

    from llm_jax.config import Qwen3Config, resolve_dtype
    from llm_jax.loader import load_params, resolve_folder
    from llm_jax.model import AttentionConfig, encode, prefill
    from llm_jax.tokenizer import load_tokenizer

    folder = resolve_folder(a.weights)
    cfg = Qwen3Config.from_folder(folder)
    dtype, _ = resolve_dtype(a.dtype, folder, jax.default_backend())
    layer = cfg.num_layers if a.layer is None else a.layer
    if not 0 <= layer <= cfg.num_layers:
        raise SystemExit(f"error: --layer {layer} must lie in 0..{cfg.num_layers}")
    tok = load_tokenizer(a.weights)
    if a.chat:
        text = tok.apply_chat_template([{"role": "user", "content": text}],
                                       enable_thinking=a.enable_thinking)
    ids = np.asarray(tok.encode(text), np.int32)
    if ids.size == 0:
        raise SystemExit("error: the text encodes to no tokens")
    if int(ids.max()) >= cfg.vocab_size:
        raise SystemExit(f"error: token id {int(ids.max())} >= the model's vocab_size "
                         f"{cfg.vocab_size}; tokenizer and weights do not belong together")
    attn = AttentionConfig(form=a.attention)
    extra = {}
    cache = None
    prefix_ids = np.zeros(0, np.int32)
    if a.prefix_text_file is not None:
        prefix_ids = np.asarray(tok.encode(Path(a.prefix_text_file).read_text()), np.int32)
        if prefix_ids.size == 0:
            raise SystemExit("error: --prefix-text-file encodes to no tokens")
    computed = max(layer, 1) if prefix_ids.size else layer  # only these layers are read
    check_memory(cfg, dtype, computed, 1, ids.size, prefix_ids.size)
    _, params = load_params(folder, jnp.dtype(dtype), computed)
    if prefix_ids.size:
        cache = jax.jit(lambda p, t: prefill(p, cfg, t, max(layer, 1), attn))(
            params, jnp.asarray(prefix_ids))
        extra["prefix_ids"] = prefix_ids
    fn = jax.jit(lambda p, t, n, c: encode(p, cfg, t, n, layer, a.pool, a.post_norm, c, attn))
    hidden = fn(params, jnp.asarray(ids)[None], jnp.array([ids.size]), cache)[0]
    out = Path(a.out)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez(tmp, hidden=np.asarray(hidden, np.float32), token_ids=ids, **extra)
    os.replace(tmp, out)
    print(f"{ids.size} tokens, layer {layer}, pool {a.pool}, {dtype}, hidden "
          f"{tuple(hidden.shape)} -> {out}")
    return out


def check_memory(cfg, dtype: str, layers: int, rows: int, tokens: int, prefix: int,
                 new_tokens: int = 0, layer_flag: str | None = "--layer") -> None:
    """SystemExit (one line: the figures and the fix) unless the weights of `layers` layers,
    the prefix and KV caches and one pass's activations fit the device; prints the estimate."""
    from llm_jax.memory import MemoryFitError, check_fits, fixes, generation_need, kv_bytes

    need = generation_need(cfg, dtype, layers, rows, tokens, new_tokens, prefix)
    if not new_tokens:  # encoding keeps every computed layer's keys and values of the prompt
        need["caches"] = kv_bytes(cfg, layers, rows * tokens, dtype)
    try:
        _, line = check_fits(need, fixes(dtype, "--dtype", layer_flag, "fewer or shorter prompts"))
    except MemoryFitError as e:
        raise SystemExit(f"error: {e}") from None
    print(line, flush=True)


def generate_settings(a: Generate) -> list[str]:
    """Checks of the flags alone (SystemExit "error: ..." before anything loads); returns the
    prompts."""
    from llm_jax.sampling import GenerateError, check_flags

    if (a.prompt is None) == (a.prompt_file is None):
        raise SystemExit("error: give exactly one of --prompt or --prompt-file")
    if a.greedy and a.seed is not None:
        raise SystemExit("error: --seed given with --greedy (greedy tokens draw nothing); drop one")
    if a.max_new_tokens <= 0:
        raise SystemExit(f"error: --max-new-tokens {a.max_new_tokens}; generate at least 1")
    try:
        check_flags(a)
    except GenerateError as e:
        raise SystemExit(f"error: {e}") from None
    if a.prompt is not None:
        prompts = [a.prompt]
    else:
        path = Path(a.prompt_file)
        if not path.is_file():
            raise SystemExit(f"error: --prompt-file {path} not found")
        prompts = [line for line in path.read_text().splitlines() if line.strip()]
        if not prompts:
            raise SystemExit(f"error: --prompt-file {path} holds no prompt (one a line)")
    if a.prefix_text_file is not None and not Path(a.prefix_text_file).is_file():
        raise SystemExit(f"error: --prefix-text-file {a.prefix_text_file} not found")
    return prompts


def run_generate(a: Generate) -> Path:
    from llm_jax.config import Qwen3Config, resolve_dtype
    from llm_jax.decode import GenerateError, check_generate
    from llm_jax.loader import resolve_folder
    from llm_jax.sampling import resolve_sampling
    from llm_jax.tokenizer import load_tokenizer, prompt_ids, stop_ids

    prompts = generate_settings(a)
    if a.image:
        return run_generate_images(a)
    folder = resolve_folder(a.weights)
    cfg = Qwen3Config.from_folder(folder)  # config.json only: the checks below need no weights
    try:
        resolved = resolve_sampling(a, folder)
    except GenerateError as e:
        raise SystemExit(f"error: {e}") from None
    sampling = resolved.sampling
    if sampling.greedy and a.seed is not None:
        raise SystemExit(f"error: --seed given but sampling is {resolved.describe()}; drop "
                         "--seed or give sampling flags")
    tok = load_tokenizer(a.weights)
    prefix_text = None if a.prefix_text_file is None else Path(a.prefix_text_file).read_text()
    prefix, rows = prompt_ids(tok, prompts, prefix_text, chat=not a.raw,
                              enable_thinking=a.enable_thinking)
    if prefix_text is not None and not prefix:
        raise SystemExit("error: --prefix-text-file encodes to no tokens")
    try:
        check_generate(cfg, [len(r) for r in rows], a.max_new_tokens, len(prefix), a.layer)
    except GenerateError as e:
        raise SystemExit(f"error: {as_flags(e)}") from None
    top = max(max(r) for r in rows + [prefix or [0]])
    if top >= cfg.vocab_size:
        raise SystemExit(f"error: token id {top} >= the model's vocab_size {cfg.vocab_size}; "
                         "tokenizer and weights do not belong together")
    stop = () if a.ignore_eos else stop_ids(folder, tok, cfg.vocab_size, chat=not a.raw)

    import jax
    import jax.numpy as jnp

    from llm_jax.decode import GenerateSpec, generate
    from llm_jax.graphs import loop_jit
    from llm_jax.loader import load_params
    from llm_jax.model import AttentionConfig, prefill

    dtype, dtype_why = resolve_dtype(a.dtype, folder, jax.default_backend())
    check_memory(cfg, dtype, cfg.num_layers, len(rows), max(map(len, rows)), len(prefix),
                 a.max_new_tokens, layer_flag=None)  # decoding reads every layer
    print(f"sampling: {resolved.describe()}; {dtype} ({dtype_why})", flush=True)
    _, params = load_params(folder, jnp.dtype(dtype), per_layer=True)  # the decode loop's layout
    attn = AttentionConfig(form=a.attention)
    cache = (jax.jit(lambda p, t: prefill(p, cfg, t, attn=attn))(params, jnp.asarray(prefix))
             if prefix else None)
    tokens = np.full((len(rows), max(map(len, rows))), tok.pad_id, np.int32)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = r
    spec = GenerateSpec(max_new_tokens=a.max_new_tokens, pad_id=tok.pad_id, sampling=sampling,
                        stop_ids=stop, hidden_layer=a.layer, post_norm=a.post_norm, attn=attn)
    fn = loop_jit(lambda p, t, n, k, c: generate(p, cfg, spec, t, n, key=k, prefix=c),
                  a.cuda_graphs)
    out = fn(params, tokens, np.array([len(r) for r in rows], np.int32),
             jax.random.PRNGKey(a.seed or 0), cache)
    new, num = np.asarray(out.tokens), np.asarray(out.num_tokens)
    results = []
    for i, (p, r) in enumerate(zip(prompts, rows)):
        ids = new[i, : num[i]].tolist()
        row = {"prompt": p, "prompt_ids": r, "tokens": ids,
               "text": tok.decode(ids, keep_special=a.keep_special)}
        if a.layer is not None:
            row["hidden"] = np.asarray(out.hidden[i, : num[i]], np.float32).tolist()
        results.append(row)
    settings = dict(dataclasses.asdict(a), sampling=resolved.record(), seed=a.seed or 0,
                    stop_ids=list(stop), dtype=dtype, dtype_source=dtype_why,
                    pad_id=tok.pad_id)
    for n in ("greedy", "temperature", "top_k", "top_p"):  # as used: `sampling` says why
        settings[n] = resolved.record()[n]
    path = Path(a.out)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"settings": settings, "prefix_ids": prefix, "results": results}))
    os.replace(tmp, path)
    print(f"{len(rows)} prompts, {int(num.sum())} tokens generated -> {path}")
    return path


def run_truncate(a: Truncate) -> Path:
    from safetensors.numpy import save_file

    from llm_jax.loader import _tensor_files, expected_tensors, load_params

    src, out = Path(a.weights), Path(a.out)
    # every tensor's name and shape checked before writing anything (one layer's values read:
    # a 30B model does not fit in memory whole)
    cfg, _ = load_params(src, layers=1)
    if not 1 <= a.layers <= cfg.num_layers:
        raise SystemExit(f"error: --layers {a.layers} must lie in 1..{cfg.num_layers}")
    from safetensors import safe_open

    files = _tensor_files(src)
    keep = list(expected_tensors(cfg, a.layers))
    if "lm_head.weight" in files and "lm_head.weight" not in keep:  # a tied model's copy
        keep.append("lm_head.weight")
    tensors = {}
    for name in keep:
        with safe_open(files[name], framework="numpy") as f:
            tensors[name] = f.get_tensor(name)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    conf = json.loads((src / "config.json").read_text())
    conf["num_hidden_layers"] = a.layers
    if isinstance(conf.get("layer_types"), list):
        conf["layer_types"] = conf["layer_types"][: a.layers]
    if isinstance(conf.get("mlp_only_layers"), list):
        conf["mlp_only_layers"] = [i for i in conf["mlp_only_layers"] if i < a.layers]
    if "max_window_layers" in conf:
        conf["max_window_layers"] = min(conf["max_window_layers"], a.layers)
    (tmp / "config.json").write_text(json.dumps(conf, indent=1))
    for extra in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                  "generation_config.json"):
        if (src / extra).is_file():
            shutil.copy(src / extra, tmp / extra)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    print(f"kept {a.layers}/{cfg.num_layers} layers -> {out}")
    return out


def parse(argv=None) -> "Encode | Generate | Truncate":
    """The subcommand's settings from the command line (tyro; --help prints and exits; a typo
    is one line naming the closest flags or values)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    kinds = {"encode": Encode, "generate": Generate, "truncate": Truncate}
    more = "(python -m llm_jax --help lists them)"
    if argv and not argv[0].startswith("-") and argv[0] not in kinds:
        raise SystemExit(f"error: no subcommand {argv[0]!r}; did you mean "
                         f"{closest(argv[0], kinds)}? {more}")
    if not argv or argv[0] not in kinds and not {"-h", "--help"} & set(argv):
        raise SystemExit(f"error: name a subcommand first: encode, generate or truncate {more}")
    cls = kinds.get(argv[0], Encode)
    prog = "python -m llm_jax" + (f" {argv[0]}" if argv[0] in kinds else "")
    with help_paragraphs(), typos_in_one_line(cls, prog):
        return tyro.cli(
            Annotated[Encode, tyro.conf.subcommand("encode", description=ENCODE)]
            | Annotated[Generate, tyro.conf.subcommand("generate", description=GENERATE)]
            | Annotated[Truncate, tyro.conf.subcommand("truncate", description=TRUNCATE)],
            args=argv, prog="python -m llm_jax")


def main(argv=None):
    from llm_jax.config import Qwen3ConfigError
    from llm_jax.loader import WeightsError
    from llm_jax.tokenizer import TokenizerError
    from llm_jax.vision import VisionConfigError

    try:
        cmd = parse(argv)
    except BrokenPipeError:  # `--help | head`: end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    from llm_jax.graphs import refused

    run = {Encode: run_encode, Generate: run_generate, Truncate: run_truncate}[type(cmd)]
    try:
        return run(cmd)
    except (Qwen3ConfigError, WeightsError, TokenizerError, VisionConfigError) as e:
        sys.exit(f"error: {e}")
    except Exception as e:  # (a driver refusing --cuda-graphs' graph: one line)
        line = refused(e)
        if line is None:
            raise
        sys.exit(f"error: {line}")


if __name__ == "__main__":
    main()
