"""Episodes of a policy as GIFs (`offline.py eval --video N`): Craftax's own pixel renderer,
and beside each frame, for an LLM-augmented policy, the observation text its LLM was given.

Craftax builds a texture cache inside its package the first time its pixel renderer is made
(about a minute); that is announced once. Videos play evaluation's episodes through its
acting step (episode i starts in evaluation episode i's world) and stop at `max_steps` frames.
"""

from __future__ import annotations

import importlib
import os
import warnings
from pathlib import Path

import jax
import numpy as np

from fused.agent import needs_text
from fused.envspec import spec, text_env, text_offset
from fused.trained_policy import load_policy
from fused.rl.acting import network_policy
from fused.rl.envs import make_env
from fused.rl.evaluate import make_evaluate
from fused.rl.sharding import on_device
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


def record(run_dir: Path, checkpoint: int | None, episodes: int, seed: int, max_steps: int,
           greedy: bool, with_text: bool, like=None, llm_overrides: dict | None = None
           ) -> list[list[np.ndarray]]:
    """Frames [H, W, 3] uint8 of `episodes` episodes (each to its end or max_steps) of a run's
    policy (set up for that many envs; `like`: an agent of the run whose LLM it shares)."""
    pol = load_policy(run_dir, episodes, checkpoint, llm_overrides=llm_overrides, like=like)
    name = pol.cfg.env.name
    layout = spec(text_env(name) or name).layout
    offset = text_offset(name)

    def text(before, after, e):  # the observation text the policy's LLM was given
        from fused.text.format import render_text

        return render_text(layout, np.asarray(before.obs[e])[offset:])

    return play_frames(pol.cfg.env, network_policy(pol.agent.network), pol.agent.inputs,
                       pol.params, pol.inputs_state, episodes, seed, max_steps, greedy,
                       text if with_text else None, needs_text(pol.cfg))


def play_frames(env_cfg, policy, inputs, params, trained_inputs, episodes: int, seed: int,
                max_steps: int, greedy: bool, text=None,
                with_text: bool = False) -> list[list[np.ndarray]]:
    """Frames of `episodes` evaluation episodes (episode i in evaluation episode i's world) of
    any policy (`fused.rl.acting.Policy`); `text(before, after, e)`, when given, is put beside
    env e's frame: the text of the step acted from state `before` to `after` (host side)."""
    env = make_env(env_cfg, with_text)  # a pixel env's text twin after the frame, for an LLM
    # everything the loop takes committed to one device (`on_device`)
    frozen, params = on_device(inputs.frozen), on_device(params)
    render = jax.jit(jax.vmap(pixel_renderer(env_cfg.name)))
    ev = make_evaluate(env, policy, inputs, episodes, 1, greedy, max_steps)
    state = on_device(jax.jit(ev.init)(jax.random.PRNGKey(seed), frozen,
                                       on_device(trained_inputs)))
    step = jax.jit(ev.block)
    frames: list[list[np.ndarray]] = [[] for _ in range(episodes)]
    for _ in range(max_steps):
        done = np.asarray(state.done)
        if done.all():
            break
        pixels = np.asarray(render(state.env.state)).clip(0, 255).astype(np.uint8)
        acted = step(state, params, frozen)
        for e in np.flatnonzero(~done):
            frame = pixels[e]
            if text is not None:
                frame = beside(frame, text(state, acted, e))
            frames[e].append(frame)
        state = acted
    return frames


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
