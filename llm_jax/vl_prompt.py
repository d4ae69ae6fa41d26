"""Prompts with images for a Qwen3-VL (host-only): token ids of images before a text, each
image's `<|image_pad|>` expanded to its tokens as HF's processor does."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llm_jax.vl_config import VLConfig


def image_prompt_ids(tok, folder: Path, cfg: VLConfig, n_images: int, text: str, chat: bool,
                     enable_thinking: bool, image_tokens: int) -> np.ndarray:
    """Token ids of n images before `text` (as a user turn with `chat`: the folder's own chat
    template, which takes image items, else Qwen3's with the images' tokens written out), each
    `<|image_pad|>` expanded to `image_tokens` as HF's processor does. ValueError if the text
    holds image tokens of its own."""
    vision = "<|vision_start|><|image_pad|><|vision_end|>"
    if chat:
        own = tok.folder == Path(folder) and tok.template_source is not None
        content = ([{"type": "image"}] * n_images + [{"type": "text", "text": text}] if own
                   else vision * n_images + text)
        text = tok.apply_chat_template([{"role": "user", "content": content}],
                                       enable_thinking=enable_thinking)
    else:
        text = vision * n_images + text
    ids = np.asarray(tok.encode(text), np.int32)
    pad = cfg.image_token_id
    if (ids == pad).sum() != n_images:
        raise ValueError(f"the prompt holds {(ids == pad).sum()} <|image_pad|> tokens for "
                         f"{n_images} images; leave image tokens out of the text")
    return np.repeat(ids, np.where(ids == pad, image_tokens, 1)).astype(np.int32)
