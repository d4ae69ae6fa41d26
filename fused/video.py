"""Episodes as GIFs (`offline.py eval --video N`, `play.py llm --video N`): the first N
episodes of the evaluation itself, drawn as it plays them (Craftax's own pixel renderer, inside
its blocks), and beside each frame, for an LLM-augmented policy or an LLM that plays, the text
it was given or its reply.

Craftax builds a texture cache inside its package the first time its pixel renderer is made
(about a minute); that is announced once.
"""

from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fused.envspec import spec
from fused.runs.files import atomic_path


def pixel_renderer(env_name: str, block_pixel_size: int = 16):
    """state -> [H, W, 3] pixels (jnp, 0..255), Craftax's renderer for this env."""
    s = spec(env_name)
    if s.family != "craftax":
        raise ValueError(f"{env_name} has no pixel renderer (videos are for Craftax envs)")
    constants = importlib.import_module(s.constants)
    if not os.path.exists(constants.TEXTURE_CACHE_FILE):
        warnings.warn(f"building Craftax's texture cache for {env_name} (first use only, about "
                      "a minute; kept in the craftax package)", stacklevel=2)
    renderer = importlib.import_module(s.constants.rsplit(".", 1)[0] + ".renderer")
    return renderer.make_craftax_pixel_renderer(block_pixel_size)


class FrameWatch:
    """Videos of an evaluation's first `videos` episodes as it plays them: the `watch` of
    `fused.rl.evaluate.make_evaluate`, then `add` of each block's output on the host.

    Each step draws those envs' states before acting (Craftax's renderer, uint8) while one of
    them still counts and `max_frames` steps have not passed (after that nothing is drawn), and
    takes `extra(before, after)` of them ([N, ...] arrays: what `text` makes the words beside a
    frame from, on the host)."""

    def __init__(self, env_name: str, videos: int, max_frames: int,
                 extra: Callable | None = None, text: Callable | None = None):
        self.videos, self.max_frames, self.extra, self.text = videos, max_frames, extra, text
        self.render = jax.vmap(pixel_renderer(env_name))
        self.frames: list[list[np.ndarray]] = [[] for _ in range(videos)]

    def __call__(self, before, after, live):
        head = lambda tree: jax.tree.map(lambda x: x[:self.videos], tree)  # noqa: E731
        on = head(live) & (before.t < self.max_frames)

        def draw(state):
            return jnp.clip(self.render(state), 0, 255).astype(jnp.uint8)

        state = head(before.env.state)
        blank = jax.eval_shape(draw, state)
        pixels = jax.lax.cond(on.any(), draw,
                              lambda _: jnp.zeros(blank.shape, blank.dtype), state)
        out = {"on": on, "pixels": pixels}
        if self.extra is not None:
            out["extra"] = head(self.extra(before, after))
        return out

    def add(self, watched) -> None:
        """One block's output ([T, ...], device or host arrays): its frames, kept in order."""
        on = np.asarray(watched["on"])
        if not on.any():  # (the pixels of such a block are blank: not fetched)
            return
        pixels = np.asarray(watched["pixels"])
        extra = jax.device_get(watched.get("extra"))
        for t, e in zip(*np.nonzero(on)):
            frame = pixels[t, e]
            if self.text is not None:
                frame = beside(frame, self.text(jax.tree.map(lambda x: x[t, e], extra)))
            self.frames[e].append(frame)


def beside(frame: np.ndarray, text: str, width: int = 420) -> np.ndarray:
    """The frame with a panel of `text` on its right."""
    from PIL import Image, ImageDraw

    h = frame.shape[0]
    panel = Image.new("RGB", (width, h), (250, 250, 250))
    draw = ImageDraw.Draw(panel)
    lines = []
    for line in text.splitlines():
        while len(line) > 68:
            cut = line.rfind(",", 0, 68) + 1 or 68
            lines.append(line[:cut])
            line = "  " + line[cut:].lstrip()
        lines.append(line)
    draw.multiline_text((6, 6), "\n".join(lines[: max(1, h // 12)]), fill=(20, 20, 20),
                        spacing=2)
    return np.concatenate([frame, np.asarray(panel)], axis=1)


def write_gifs(frames: list[list[np.ndarray]], folder: Path, fps: int = 8) -> list[Path]:
    import imageio.v3 as iio

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, ep in enumerate(frames):
        path = folder / f"episode_{i:03d}.gif"
        with atomic_path(path) as tmp:
            iio.imwrite(tmp, np.stack(ep), extension=".gif", duration=1000 / fps, loop=0)
        paths.append(path)
    return paths
