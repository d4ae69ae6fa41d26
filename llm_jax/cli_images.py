"""`python -m llm_jax encode|generate --image ...`: a Qwen3-VL model's hidden states of images
and a text, or its text generated after them (the image half of `llm_jax/__main__.py`)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from llm_jax.__main__ import Encode, Generate


def as_flags(e: Exception) -> str:
    """A library message in the CLI's words: `top_p=1.5` -> `--top-p 1.5`."""
    msg = str(e)
    for name, flag in (("max_new_tokens", "--max-new-tokens"), ("hidden_layer", "--layer"),
                       ("temperature", "--temperature"), ("top_k", "--top-k"),
                       ("top_p", "--top-p")):
        msg = re.sub(rf"(?<!-)\b{name}\b=?", lambda m: flag + (" " if m[0][-1] == "=" else ""),
                     msg)
    return msg


def read_images(paths: tuple[str, ...]) -> np.ndarray:
    """uint8 [N, H, W, 3] of image files (RGB; alpha dropped); SystemExit (one line) for a
    missing or unreadable file or images of different sizes."""
    from PIL import Image, UnidentifiedImageError

    out = []
    for p in paths:
        if not Path(p).is_file():
            raise SystemExit(f"error: --image {p} not found")
        try:
            with Image.open(p) as im:
                if im.mode != "RGB":  # as HF's convert_to_rgb: transparency over white
                    rgba = im.convert("RGBA")
                    im = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255)),
                                               rgba)
                out.append(np.asarray(im.convert("RGB")))
        except (UnidentifiedImageError, OSError) as e:
            raise SystemExit(f"error: --image {p} is not an image ({e})") from None
    sizes = sorted({x.shape[:2] for x in out})
    if len(sizes) > 1:
        raise SystemExit(f"error: the images have different sizes {sizes}; give images of one "
                         "size (resize them first)")
    return np.stack(out)


def image_prompt(tok, folder: Path, cfg, n_images: int, text: str, chat: bool,
                 enable_thinking: bool, image_tokens: int = 1) -> np.ndarray:
    """`llm_jax.vl_prompt.image_prompt_ids`, a prompt with image tokens of its own a
    SystemExit."""
    from llm_jax.vl_prompt import image_prompt_ids

    try:
        return image_prompt_ids(tok, folder, cfg, n_images, text, chat, enable_thinking,
                                image_tokens)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def _vl_setup(weights: str, images: tuple[str, ...], dtype_flag: str, text_tokens: int,
              new_tokens: int = 0):
    import jax
    import jax.numpy as jnp

    from llm_jax.config import resolve_dtype
    from llm_jax.loader import resolve_folder
    from llm_jax.tokenizer import load_tokenizer
    from llm_jax.vision import preprocess
    from llm_jax.vl_config import VLConfig
    from llm_jax.vl_loader import load_vl_params

    from llm_jax.memory import MemoryFitError, check_fits, fixes, generation_need, itemsize

    folder = resolve_folder(weights)
    cfg = VLConfig.from_folder(folder)
    frames = read_images(images)
    dtype, why = resolve_dtype(dtype_flag, folder, jax.default_backend())
    per_image = cfg.processor.num_tokens(*frames.shape[1:3])
    tokens = len(images) * per_image + text_tokens
    need = generation_need(cfg.text, dtype, cfg.text.num_layers, 1, tokens, new_tokens, 0)
    v = cfg.vision
    patches = per_image * v.spatial_merge_size ** 2  # of one image: attention stays within it
    need["vision weights"] = v.num_params() * itemsize(dtype)
    # the tower's widest pass: the MLP's input and output, attention scores per head (float32)
    need["vision activations"] = len(images) * (
        patches * (v.hidden_size * 4 + v.intermediate_size) * itemsize(dtype)
        + v.num_heads * patches ** 2 * 4)
    try:
        _, line = check_fits(need, fixes(dtype, "--dtype", None, "fewer images"))
    except MemoryFitError as e:
        raise SystemExit(f"error: {e}") from None
    print(line, flush=True)
    _, params = load_vl_params(folder, jnp.dtype(dtype))
    pixels, grid = preprocess(jnp.asarray(frames), cfg.processor)
    return folder, cfg, load_tokenizer(weights), params, pixels, grid, dtype, why


def run_encode_images(a: Encode, text: str) -> Path:
    import jax
    import jax.numpy as jnp

    from llm_jax.mrope import rope_index
    from llm_jax.vl_model import image_pool_every, pool_states, vl_hidden_states

    pool = a.pool
    if pool not in ("none", "last", "mean") and image_pool_every(pool) is None:
        raise SystemExit(f"error: --pool {pool}: choose none, last, mean, image-mean or every:K "
                         "(K >= 1)")
    if a.prefix_text_file is not None:
        raise SystemExit("error: --prefix-text-file with --image: not supported; put the text "
                         "in --text")
    # the text's characters bound its tokens (the estimate needs no tokenizer yet)
    folder, cfg, tok, params, pixels, grid, dtype, _ = _vl_setup(a.weights, a.image, a.dtype,
                                                                 len(text) + 64)
    layer = cfg.text.num_layers if a.layer is None else a.layer
    if not 0 <= layer <= cfg.text.num_layers:
        raise SystemExit(f"error: --layer {layer} must lie in 0..{cfg.text.num_layers}")
    ids = image_prompt(tok, folder, cfg, len(a.image), text, a.chat, a.enable_thinking,
                       int(np.prod(grid)) // cfg.vision.spatial_merge_size ** 2)
    pos, _ = rope_index(ids[None], np.array([ids.size]), cfg, grid, len(a.image))

    def fn(p, t, n, px, ps):
        x = vl_hidden_states(p, cfg, t, n, layer, px, grid, ps).x
        return pool_states(p.text, cfg, x, t, n, pool, a.post_norm)

    hidden = jax.jit(fn)(params, jnp.asarray(ids)[None], jnp.array([ids.size]), pixels,
                         jnp.asarray(pos))[0]
    out = Path(a.out)
    tmp = out.with_name(out.name + ".tmp.npz")
    np.savez(tmp, hidden=np.asarray(hidden, np.float32), token_ids=ids,
             image_grid=np.asarray(grid), image_positions=pos[:, 0])
    os.replace(tmp, out)
    print(f"{ids.size} tokens ({len(a.image)} images, grid {grid}), layer {layer}, pool {pool}, "
          f"{dtype}, hidden {tuple(hidden.shape)} -> {out}")
    return out


def run_generate_images(a: Generate) -> Path:
    import jax
    import jax.numpy as jnp

    from llm_jax.decode import GenerateError, GenerateSpec, check_generate
    from llm_jax.graphs import loop_jit
    from llm_jax.mrope import rope_index
    from llm_jax.sampling import resolve_sampling
    from llm_jax.tokenizer import stop_ids
    from llm_jax.vl_model import vl_generate

    if a.prompt is None or a.prefix_text_file is not None:
        raise SystemExit("error: --image takes one --prompt (no --prompt-file or "
                         "--prefix-text-file)")
    folder, cfg, tok, params, pixels, grid, dtype, why = _vl_setup(
        a.weights, a.image, a.dtype, len(a.prompt) + 64, a.max_new_tokens)
    try:
        resolved = resolve_sampling(a, folder)
    except GenerateError as e:
        raise SystemExit(f"error: {e}") from None
    ids = image_prompt(tok, folder, cfg, len(a.image), a.prompt, not a.raw, a.enable_thinking,
                       int(np.prod(grid)) // cfg.vision.spatial_merge_size ** 2)
    try:
        check_generate(cfg.text, [ids.size], a.max_new_tokens, 0, a.layer)
    except GenerateError as e:
        raise SystemExit(f"error: {as_flags(e)}") from None
    stop = () if a.ignore_eos else stop_ids(folder, tok, cfg.text.vocab_size, chat=not a.raw)
    pos, deltas = rope_index(ids[None], np.array([ids.size]), cfg, grid, len(a.image))
    print(f"sampling: {resolved.describe()}; {dtype} ({why})", flush=True)
    spec = GenerateSpec(max_new_tokens=a.max_new_tokens, pad_id=tok.pad_id,
                        sampling=resolved.sampling, stop_ids=stop, hidden_layer=a.layer,
                        post_norm=a.post_norm)
    fn = loop_jit(lambda p, t, n, px, ps, d, k: vl_generate(p, cfg, spec, t, n, px, grid, ps,
                                                            d, key=k), a.cuda_graphs)
    out = fn(params, jnp.asarray(ids)[None], jnp.array([ids.size]), pixels, jnp.asarray(pos),
             jnp.asarray(deltas), jax.random.PRNGKey(a.seed or 0))
    n = int(out.num_tokens[0])
    new = np.asarray(out.tokens[0, :n]).tolist()
    row = {"prompt": a.prompt, "prompt_ids": ids.tolist(), "images": list(a.image),
           "tokens": new, "text": tok.decode(new, keep_special=a.keep_special)}
    if a.layer is not None:
        row["hidden"] = np.asarray(out.hidden[0, :n], np.float32).tolist()
    settings = dict(dataclasses.asdict(a), sampling=resolved.record(), seed=a.seed or 0,
                    stop_ids=list(stop), dtype=dtype, dtype_source=why, pad_id=tok.pad_id,
                    image_grid=list(grid))
    path = Path(a.out)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"settings": settings, "prefix_ids": [], "results": [row]}))
    os.replace(tmp, path)
    print(f"1 prompt with {len(a.image)} images, {n} tokens generated -> {path}")
    return path
