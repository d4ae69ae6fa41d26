"""What names an LLM's hidden states: a digest of its weights folder (or the random model's name)
and of the prompt around an observation. Label sets record them; evaluation of an offline
policy checks the LLM it is given against them."""

from __future__ import annotations

import hashlib

import numpy as np

from llm_jax.loader import resolve_folder


def folder_digest(folder: str | None, random_model: str, seed: int) -> str:
    """sha256 over a weights folder's files (sorted names and bytes); a random model is named."""
    if folder is None:
        return f"random:{random_model}:seed{seed}"
    h = hashlib.sha256()
    for p in sorted(resolve_folder(folder).iterdir()):
        if p.is_file() and not p.name.endswith(".log"):
            h.update(p.name.encode() + b"\0")
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    h.update(chunk)
    return h.hexdigest()


def prompt_digest(prefix_ids, tail_ids=()) -> str:
    """sha256 of the prompt's token ids around an observation (the prefix, then the tail)."""
    return hashlib.sha256(np.asarray(prefix_ids, np.int32).tobytes()
                          + np.asarray(tail_ids, np.int32).tobytes()).hexdigest()
