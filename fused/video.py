"""Episodes as videos (`offline.py eval --video N`, `play.py llm --video N`): the first N
episodes of the evaluation itself, drawn as it plays them (Craftax's own pixel renderer, inside
its blocks), each frame with two curves under it over the whole episode: the critic's V(s_t)
and the discounted return-to-go G_t (a policy without a critic: G_t alone), the current step
marked; beside each frame, for an LLM-augmented policy or an LLM that plays, the text it was
given or its reply.

G_t is known only once the episode has ended, so the watch keeps each step's value and reward
(after the last frame too: G_t counts the rest of the episode) and the frames are composed on
the host when written: R/videos/episode_000.gif and .mp4 (imageio's ffmpeg plugin), and .npz,
the numbers the frames are drawn from (per step value, reward, terminated, truncated,
truncation_value, return_to_go; gamma, where the plot lies in the frame and its value range).
G_t is `label.py returns`' return-to-go of that episode (`fused.data.returns.returns_to_go`):
terminated, nothing after it; truncated, bootstrapped from the critic's V(final observation)
where there is one; cut by the evaluation's step cap, the rewards up to the cut.

Craftax builds a texture cache inside its package the first time its pixel renderer is made
(about a minute); that is announced once.
"""

from __future__ import annotations

import functools
import importlib
import os
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fused.envspec import spec
from fused.errors import ConfigError
from fused.runs.files import atomic_path

DEFAULT_GAMMA = 0.99  # a video's discount where nothing names one (an LLM player, a run without)
STEP_FIELDS = ("reward", "value", "terminated", "truncated", "truncation_value")
BACKGROUND = (250, 250, 250)
VALUE_COLOUR = (31, 119, 180)  # V(s_t)
RETURN_COLOUR = (230, 110, 0)  # G_t
MARK_COLOUR = (160, 160, 160)  # the current step's vertical line
PLOT_HEIGHT, PLOT_MIN_WIDTH = 150, 420


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


def check_video_gamma(gamma: float | None) -> None:
    """--video-gamma: None (the run's own) or a discount in [0, 1]."""
    if gamma is not None and not 0.0 <= gamma <= 1.0:
        raise ConfigError(f"--video-gamma {gamma} must lie in [0, 1] (or be left out: the run's "
                          "own gamma)")


class Episode:
    """One watched episode on the host: its frames (the text panel beside each, where there
    is one) and, per step played (frames or not), what `STEP_FIELDS` name."""

    def __init__(self):
        self.frames: list[np.ndarray] = []
        self.steps: dict[str, list] = {k: [] for k in STEP_FIELDS}

    def numbers(self, gamma: float) -> dict:
        """The per-step arrays [T] and G_t (`return_to_go`): `label.py returns` of this one
        episode (default `incomplete`: a cut episode's last row counts its reward alone)."""
        from fused.data.returns import returns_to_go

        out = {k: np.asarray(v, bool if k in ("terminated", "truncated") else np.float32)
               for k, v in self.steps.items()}
        # padded to a power of two with an episode of nothing after it (its first row is the
        # next episode's: this one's G_t are unchanged), so few lengths compile
        n = len(out["reward"])
        pad = max(64, 1 << (n - 1).bit_length()) - n
        padded = {k: np.concatenate([v, np.zeros(pad, v.dtype)]) for k, v in out.items()}
        episode = np.concatenate([np.zeros(n, np.int64), np.ones(pad, np.int64)])
        rtg, _, _ = returns_to_go(**padded, episode_id=episode, gamma=gamma)
        return dict(out, return_to_go=rtg[:n])


class FrameWatch:
    """Videos of an evaluation's first `videos` episodes as it plays them: the `watch` of
    `fused.rl.evaluate.make_evaluate`, then `add` of each block's output on the host.

    Each step draws those envs' states before acting (Craftax's renderer, uint8) while one of
    them still counts and `max_frames` steps have not passed (after that nothing is drawn), and
    keeps what the step did (`STEP_FIELDS` of its `Acted`) while the episode counts; it takes
    `extra(before, after)` of them ([N, ...] arrays: what `text` makes the words beside a frame
    from, on the host). `critic`: the policy has a critic worth drawing (else G_t alone)."""

    def __init__(self, env_name: str, videos: int, max_frames: int,
                 extra: Callable | None = None, text: Callable | None = None,
                 critic: bool = True):
        self.videos, self.max_frames, self.extra, self.text = videos, max_frames, extra, text
        self.critic = critic
        self.render = jax.vmap(pixel_renderer(env_name))
        self.episodes = [Episode() for _ in range(videos)]

    def __call__(self, before, after, live, acted):
        head = lambda tree: jax.tree.map(lambda x: x[:self.videos], tree)  # noqa: E731
        live = head(live)
        on = live & (before.t < self.max_frames)

        def draw(state):
            return jnp.clip(self.render(state), 0, 255).astype(jnp.uint8)

        state = head(before.env.state)
        blank = jax.eval_shape(draw, state)
        pixels = jax.lax.cond(on.any(), draw,
                              lambda _: jnp.zeros(blank.shape, blank.dtype), state)
        res = acted.env
        value = acted.value if acted.value is not None else jnp.full(live.shape, jnp.nan)
        out = {"on": on, "live": live, "pixels": pixels, "reward": head(res.reward),
               "value": head(value), "terminated": head(res.terminated),
               "truncated": head(res.truncated),
               "truncation_value": head(acted.truncation_value)}
        if self.extra is not None:
            out["extra"] = head(self.extra(before, after))
        return out

    @staticmethod
    def holds(watched) -> bool:
        """A block's output has something to keep (a step of a watched episode that counts)."""
        return bool(np.asarray(watched["live"]).any())

    @staticmethod
    def fetch(watched) -> dict:
        """The host copy of a block's output, its pixels left out (empty) where it drew none."""
        drew = bool(np.asarray(watched["on"]).any())
        return {k: (jax.device_get(v) if k != "pixels" or drew
                    else np.zeros((0,), np.uint8)) for k, v in watched.items()}

    def add(self, watched) -> None:
        """One block's output ([T, ...], device or host arrays): its frames and steps, kept in
        order."""
        if not self.holds(watched):
            return
        watched = self.fetch(watched)
        on, live = np.asarray(watched["on"]), np.asarray(watched["live"])
        extra = watched.get("extra")
        for t, e in zip(*np.nonzero(live)):
            ep = self.episodes[e]
            for k in STEP_FIELDS:
                ep.steps[k].append(watched[k][t, e].item())
            if on[t, e]:
                frame = watched["pixels"][t, e]
                if self.text is not None:
                    frame = beside(frame, self.text(jax.tree.map(lambda x: x[t, e], extra)))
                ep.frames.append(frame)


def beside(frame: np.ndarray, text: str, width: int = 420) -> np.ndarray:
    """The frame with a panel of `text` on its right."""
    from PIL import Image, ImageDraw

    h = frame.shape[0]
    panel = Image.new("RGB", (width, h), BACKGROUND)
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


class CurvePlot(NamedTuple):
    """Where an episode's curves lie in its panel: step t at column `x(t)` (0 at x0, the last
    of `steps` at x1), value v at row `y(v)` (`lo` on row y1, `hi` on row y0)."""

    x0: int
    y0: int
    x1: int
    y1: int
    lo: float
    hi: float
    steps: int

    def x(self, t) -> np.ndarray:
        return np.rint(self.x0 + np.asarray(t) * (self.x1 - self.x0)
                       / max(self.steps - 1, 1)).astype(int)

    def y(self, v) -> np.ndarray:
        return np.rint(self.y1 - (np.asarray(v) - self.lo) / (self.hi - self.lo)
                       * (self.y1 - self.y0)).astype(int)

    def shifted(self, rows: int) -> "CurvePlot":
        return self._replace(y0=self.y0 + rows, y1=self.y1 + rows)


@functools.cache
def _font():
    from PIL import ImageFont

    return ImageFont.load_default()


def _text(img: np.ndarray, xy, text: str, anchor: str = "la") -> np.ndarray:
    from PIL import Image, ImageDraw

    pic = Image.fromarray(img)
    ImageDraw.Draw(pic).text(xy, text, fill=(40, 40, 40), anchor=anchor, font=_font())
    return np.asarray(pic)


def curve_panel(numbers: dict, width: int, critic: bool, legend: str
                ) -> tuple[np.ndarray, CurvePlot]:
    """The panel of an episode's curves ([PLOT_HEIGHT, width, 3] uint8) without a current
    step: G_t (and V(s_t) with `critic`) over every step in `numbers`, a legend, the value range
    and the steps; drawn once per episode (`mark` adds the step)."""
    from PIL import Image, ImageDraw

    shown = [(numbers["return_to_go"], RETURN_COLOUR)]
    if critic:
        shown.append((numbers["value"], VALUE_COLOUR))
    finite = np.concatenate([s[np.isfinite(s)] for s, _ in shown])
    lo, hi = (float(finite.min()), float(finite.max())) if len(finite) else (0.0, 1.0)
    if hi - lo < 1e-6:  # a flat curve, in the middle
        lo, hi = lo - 0.5, hi + 0.5
    steps = len(numbers["reward"])
    plot = CurvePlot(44, 22, width - 12, PLOT_HEIGHT - 18, lo, hi, steps)
    pic = Image.new("RGB", (width, PLOT_HEIGHT), BACKGROUND)
    draw = ImageDraw.Draw(pic)
    draw.rectangle([plot.x0 - 1, plot.y0 - 1, plot.x1 + 1, plot.y1 + 1], outline=(210, 210, 210))
    if lo < 0 < hi:
        zero = int(plot.y(0.0))
        draw.line([(plot.x0, zero), (plot.x1, zero)], fill=(225, 225, 225))
    fill = (40, 40, 40)
    draw.text((plot.x0 - 4, plot.y0), f"{hi:.2f}", fill=fill, anchor="rm")
    draw.text((plot.x0 - 4, plot.y1), f"{lo:.2f}", fill=fill, anchor="rm")
    ended = bool(numbers["terminated"][-1] or numbers["truncated"][-1])
    draw.text((plot.x0, plot.y1 + 4), "0", fill=fill, anchor="la")
    draw.text((plot.x1, plot.y1 + 4), f"{steps - 1}" + ("" if ended else " (cut)"), fill=fill,
              anchor="ra")
    x = 6
    for (s, colour), name in zip(shown, (legend, "V(s) critic")):
        draw.line([(x, 10), (x + 14, 10)], fill=colour, width=3)
        draw.text((x + 18, 10), name, fill=fill, anchor="lm")
        x += 30 + int(draw.textlength(name))
    for s, colour in shown:
        t = np.flatnonzero(np.isfinite(s))
        points = list(zip(plot.x(t).tolist(), plot.y(s[t]).tolist()))
        if len(points) > 1:
            draw.line(points, fill=colour, width=1)
        elif points:
            draw.point(points, fill=colour)
    return np.asarray(pic), plot


def mark(panel: np.ndarray, plot: CurvePlot, numbers: dict, t: int, critic: bool
         ) -> np.ndarray:
    """`panel` with step t marked: a vertical line under the curves, a 5 x 5 square on each
    curve at its value, and the values written below."""
    out = panel.copy()
    x = int(plot.x(t))
    column = out[plot.y0:plot.y1 + 1, x]
    column[(column == BACKGROUND).all(-1)] = MARK_COLOUR
    g, v = numbers["return_to_go"][t], numbers["value"][t]
    for s, colour in [(g, RETURN_COLOUR)] + ([(v, VALUE_COLOUR)] if critic else []):
        if np.isfinite(s):
            y = int(plot.y(s))
            out[max(y - 2, 0):y + 3, max(x - 2, 0):x + 3] = colour
    words = f"t {t}" + (f"   V {v:.2f}" if critic else "") + f"   G {g:.2f}"
    strip = slice(plot.y1 + 2, PLOT_HEIGHT)
    out[strip] = _text(np.ascontiguousarray(out[strip]), ((plot.x0 + plot.x1) // 2, 2), words,
                       anchor="ma")
    return out


class Composed(NamedTuple):
    video: np.ndarray  # [F, H, W, 3] uint8: each frame over its curves
    plot: CurvePlot  # where the curves lie, in the video's pixels


def compose(ep: Episode, numbers: dict, legend: str, critic: bool) -> Composed:
    """The episode's frames, each above the curve panel marked at its step; height and width
    padded to even numbers (what MP4's yuv420p takes)."""
    h, w = ep.frames[0].shape[:2]
    width = max(w, PLOT_MIN_WIDTH)
    panel, plot = curve_panel(numbers, width, critic, legend)
    rows, cols = h + PLOT_HEIGHT, width
    video = np.empty((len(ep.frames), rows + rows % 2, cols + cols % 2, 3), np.uint8)
    for t, frame in enumerate(ep.frames):  # frame t is step t: episodes start at step 0
        video[t] = BACKGROUND
        video[t, :h, :w] = frame
        video[t, h:h + PLOT_HEIGHT, :width] = mark(panel, plot, numbers, t, critic)
    return Composed(video, plot.shifted(h))


def write_videos(episodes: list[Episode], folder: Path, gamma: float, gamma_source: str,
                 critic: bool = True, fps: int = 8) -> list[Path]:
    """Each watched episode as folder/episode_NNN.gif and .mp4, its frames over its curves,
    and .npz, the numbers drawn (`Episode.numbers`, gamma and its source, `critic`, `frames`,
    `plot_box` [x0, y0, x1, y1] and `plot_range` [lo, hi] in the video's pixels). The curves
    show V(s_t) only with `critic` (the policy has one) and every value finite. Returns the
    GIFs' paths."""
    import imageio.v3 as iio

    folder.mkdir(parents=True, exist_ok=True)
    legend = f"G return-to-go, gamma {gamma:g} ({gamma_source})"
    paths = []
    for i, ep in enumerate(episodes):
        numbers = ep.numbers(gamma)
        drawn = critic and bool(np.isfinite(numbers["value"]).all())
        video, plot = compose(ep, numbers, legend + ("" if drawn else "; no critic"), drawn)
        stem = folder / f"episode_{i:03d}"
        with atomic_path(stem.with_suffix(".npz")) as tmp:
            np.savez(tmp, **numbers, gamma=gamma, gamma_source=gamma_source, critic=drawn,
                     frames=len(video), plot_box=np.array(plot[:4]),
                     plot_range=np.array([plot.lo, plot.hi]))
        with atomic_path(stem.with_suffix(".gif")) as tmp:
            iio.imwrite(tmp, video, extension=".gif", duration=1000 / fps, loop=0)
        # ffmpeg runs as a process of its own, started by fork and exec at once: JAX's warning
        # about forking a threaded process does not apply. (Sizes even: nothing rescaled.)
        with atomic_path(stem.with_suffix(".mp4")) as tmp, warnings.catch_warnings():
            warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
            iio.imwrite(tmp, video, plugin="FFMPEG", fps=fps, macro_block_size=2)
        paths.append(stem.with_suffix(".gif"))
    return paths
