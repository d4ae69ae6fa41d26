"""`offline.py eval`: a run's policy (online or offline) played for N whole episodes from fixed
seeds; `eval.json` and a bar chart of achievement rates in the run folder.

An LLM-augmented policy computes its hidden states online with the fused path at the settings it
was trained under (layer, prompt, skip_n). For an offline run they come from its label set, and
the model and prompt built now are checked against that set's card (weights and prompt digests,
layer, pooling, post-norm): a mismatch is an error unless `allow_mismatch`.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import jax
import numpy as np

from fused.agent import Agent, needs_text
from fused.errors import ConfigError
from fused.llm.encoders import kind_of
from fused.trained_policy import TrainedPolicy, is_offline, load_policy
from fused.rl.envs import make_env
from fused.rl.evaluate import ci_text, make_evaluate, summarise
from fused.rl.acting import network_policy
from fused.rl.sharding import jit_init, on_device
from fused.runs.blocks import run_blocks
from fused.runs.config_io import from_json
from fused.runs.files import atomic_write_json, require_writable
from fused.runs.metrics import save_figure
from fused.runs.settings import CudaGraphs
from fused.video import DEFAULT_GAMMA, check_video_gamma, write_videos
from llm_jax.graphs import loop_jit


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    run: str
    """Run folder (train.py or offline.py)."""
    episodes: int = 128
    """Episodes, one per seed; each is played to its end."""
    seed: int = 0
    """Seed of the episodes' worlds (the same seeds for every policy evaluated with it)."""
    checkpoint: int | None = None
    """Checkpoint (update) to evaluate; default the newest good one."""
    max_steps: int | None = None
    """Stop episodes still running after this many steps and report them as censored (their
    return so far is included, flagged); None plays every episode to its end."""
    greedy: bool = False
    """Act by the most probable action instead of sampling the policy."""
    block_steps: int = 256
    """Env steps per compiled block at most (the host checks between blocks whether all ended);
    with --max-steps, blocks as few as that allows, sized to end on the cap. The episodes are the
    same whatever it is."""
    allow_mismatch: bool = False
    """Evaluate an LLM-augmented offline policy even if the model or prompt built now differs
    from the ones its label set was made with."""
    plot: bool = True
    """Write eval_achievements.png beside eval.json."""
    video: int = 0
    """Also write the first this many of the episodes evaluated into RUN/videos/ as GIF and MP4,
    drawn as they are played (Craftax's pixel renderer; an LLM-augmented policy's frames show
    the observation text beside them), each frame over two curves of the whole episode, the
    critic's V(s) and the discounted return-to-go (`label.py returns`' G_t of that episode), the
    current step marked; beside each, episode_NNN.npz holds the numbers drawn (`fused.video`)."""
    video_max_steps: int = 500
    """Frames per video at most (and at most --max-steps); the curves cover the whole episode."""
    video_gamma: float | None = None
    """Discount of the videos' return-to-go; default the run's own: a train.py run's ppo.gamma,
    an offline run's returns set's (the one it trained on), else 0.99. The legend names it."""
    video_text: bool = True
    """With an LLM-augmented policy, put the text its LLM saw beside each frame."""
    out: str | None = None
    """Write the results here instead of RUN/eval.json."""
    cuda_graphs: CudaGraphs = "loops"


def check_llm_matches_labels(run_dir: Path, pol: TrainedPolicy) -> None:
    """An offline policy's LLM, built now, against the label set it was trained on."""
    from fused.data.store import Dataset
    from fused.commands.offline_train import OfflineConfig

    ocfg = from_json(OfflineConfig, (run_dir / "config.json").read_text(),
                     str(run_dir / "config.json"))
    if not ocfg.labels:
        return
    try:
        entry = Dataset(ocfg.data).card()["labels"][ocfg.labels]
    except (ConfigError, KeyError):
        raise ConfigError(f"the label set {ocfg.labels!r} of {ocfg.data} that {run_dir} was "
                          "trained on cannot be read to check the LLM against; pass "
                          "--allow-mismatch to evaluate anyway") from None
    now = pol.agent.inputs.encoder.identity()
    for k, v in now.items():
        if entry.get(k) != v:
            raise ConfigError(f"{k} of the LLM built for evaluation ({v!r}) differs from the "
                              f"label set {ocfg.labels!r} it was trained on ({entry.get(k)!r}); "
                              "fix the weights folder or prompt, or pass --allow-mismatch")


def evaluate(c: EvalConfig, console, llm_overrides: dict | None = None,
             like: Agent | None = None) -> dict:
    """eval.json of the run's policy (`llm_overrides`: an ablation; `like`: an agent of the
    run already set up, whose LLM weights are then not loaded again)."""
    if c.episodes <= 1:
        raise ConfigError(f"episodes={c.episodes}: at least 2 for a confidence interval")
    if c.max_steps is not None and c.max_steps <= 0:
        raise ConfigError(f"max_steps={c.max_steps} must be positive or None")
    if c.block_steps <= 0:
        raise ConfigError(f"block_steps={c.block_steps} must be positive")
    if not 0 <= c.video <= c.episodes or c.video_max_steps <= 0:
        raise ConfigError(f"--video {c.video} must lie in 0..--episodes ({c.episodes}) and "
                          f"--video-max-steps {c.video_max_steps} be positive")
    check_video_gamma(c.video_gamma)
    run_dir = Path(c.run).expanduser()
    path = Path(c.out).expanduser() if c.out else run_dir / "eval.json"
    require_writable(path.parent, "--out" if c.out else "--run")  # before playing, not after
    if c.video:
        require_writable(run_dir / "videos", "--run (videos/)")
    pol = load_policy(run_dir, c.episodes, c.checkpoint, llm_overrides=llm_overrides, like=like)
    path.parent.mkdir(parents=True, exist_ok=True)  # (once the run is known: a typo leaves none)
    if is_offline(run_dir) and pol.cfg.llm.active_backend != "none" and not c.allow_mismatch:
        check_llm_matches_labels(run_dir, pol)
    env = make_env(pol.cfg.env, needs_text(pol.cfg))
    # blocks that end on the step cap (the fewest of at most --block-steps): steps past it
    # count for nothing, and the episodes are the same whatever the block size (`make_evaluate`)
    block_steps = c.block_steps
    if c.max_steps:
        block_steps = -(-c.max_steps // -(-c.max_steps // c.block_steps))
    watch = None
    if c.video:  # the first --video episodes drawn as they are played (in the same program)
        watch = video_watch(pol, c)
    ev = make_evaluate(env, network_policy(pol.agent.network), pol.agent.inputs, c.episodes,
                       block_steps, c.greedy, c.max_steps, watch=watch)
    # everything the loop takes committed to one device (`on_device`)
    frozen, params = on_device(pol.agent.inputs.frozen), on_device(pol.params)
    t0 = time.time()
    state = on_device(jit_init(ev)(jax.random.PRNGKey(c.seed), frozen,
                                   on_device(pol.inputs_state)))
    job = EvalBlocks(loop_jit(ev.block, c.cuda_graphs, donate_argnums=0), state, params, frozen,
                     watch, c)
    run_blocks(job, console)
    out = figures(job.host, c, pol, env, run_dir, time.time() - t0)
    atomic_write_json(path, out)
    if c.plot and out["achievements"]:
        plot_achievements(out, path.with_name(path.stem + "_achievements.png"))
    if c.video:
        gamma, source = video_gamma(run_dir, c.video_gamma)
        out["videos"] = [str(p) for p in write_videos(watch.episodes, run_dir / "videos", gamma,
                                                      source, watch.critic)]
        out["video_gamma"] = gamma
        atomic_write_json(path, out)
        console.print(f"{len(out['videos'])} videos -> {run_dir / 'videos'}")
    lo, hi = out["return_ci95"]
    console.print(f"return {out['return_mean']:.2f} (95% CI {ci_text(lo, hi)}) over "
                  f"{out['episodes']} episodes, length {out['length_mean']:.0f}"
                  + (f", {out['censored']} censored at {c.max_steps} steps"
                     if out["censored"] else "") + f" -> {path}")
    return out


class EvalBlocks:
    """The evaluation's blocks as a block job (`fused.runs.blocks`). Its results are written
    whole once every episode ends, so Ctrl-C keeps what an earlier evaluation wrote."""

    def __init__(self, block, state, params, frozen, watch, c: EvalConfig):
        self.block, self.state, self.params, self.frozen = block, state, params, frozen
        self.watch, self.c = watch, c
        self.cap = c.max_steps or 10 ** 9
        self.lock = threading.Lock()
        self.host = jax.device_get(state)  # (the device copy is donated to the block under way)

    def pending(self) -> bool:
        return not bool(np.asarray(self.host.done).all()) and int(self.host.t) < self.cap

    def run_block(self) -> str:
        state = self.block(self.state, self.params, self.frozen)
        if self.watch is not None:
            state, extras = state
            self.watch.add(extras["watch"])
        host = jax.device_get(state)
        with self.lock:
            self.state, self.host = state, host
        return (f"  {int(host.t):,} steps: {int(np.asarray(host.done).sum())}/"
                f"{self.c.episodes} episodes ended")

    def stopped(self) -> str:
        return "interrupted: what had finished is kept; run the same command again"


def figures(state, c: EvalConfig, pol: TrainedPolicy, env, run_dir: Path,
            seconds: float) -> dict:
    """eval.json's contents from the evaluation's final state."""
    out = summarise(state, env.achievement_names, c.max_steps)
    out.update(run=str(run_dir), checkpoint=pol.step, seed=c.seed, greedy=c.greedy,
               env=pol.cfg.env.name, seconds=seconds,
               llm=None if pol.cfg.llm.active_backend == "none" else {
                   "layer": pol.agent.inputs.encoder.layer, "skip_n": pol.cfg.llm.skip_n,
                   "hidden": pol.cfg.llm.hidden, "weights": pol.cfg.llm.weights})
    return out


def video_watch(pol: TrainedPolicy, c: EvalConfig):
    """The `FrameWatch` of `--video`: for an LLM-augmented policy (not a vision-language one,
    whose frames are its input) the observation text its LLM was given beside each frame. The
    critic is drawn unless the run trained none (`has_critic`)."""
    from fused.envspec import spec, text_env, text_offset
    from fused.video import FrameWatch

    name, critic = pol.cfg.env.name, has_critic(pol.run_dir)
    if not (c.video_text and pol.cfg.llm.active_backend != "none"
            and not kind_of(pol.cfg.llm).reads_frames):
        return FrameWatch(name, c.video, c.video_max_steps, critic=critic)
    from fused.text.format import render_text

    layout, offset = spec(text_env(name) or name).layout, text_offset(name)
    return FrameWatch(name, c.video, c.video_max_steps, extra=lambda before, after: before.obs,
                      text=lambda obs: render_text(layout, obs[offset:]), critic=critic)


def _saved_config(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def has_critic(run_dir: Path) -> bool:
    """The run trained its critic: PPO always; AWR and BC fit it to their data's returns-to-go
    (BC's is then the behaviour policy's value, which BC imitates), unless --value-coef 0."""
    return _saved_config(run_dir).get("value_coef", 1.0) != 0


def video_gamma(run_dir: Path, override: float | None) -> tuple[float, str]:
    """(gamma, where it came from) of a run's videos: `override` (--video-gamma); a train.py
    run's ppo.gamma; an offline run's returns set's gamma (the set it trained on: --returns, or
    its data's only one); else `fused.video.DEFAULT_GAMMA`."""
    from fused.data.store import Dataset

    if override is not None:
        return float(override), "--video-gamma"
    saved = _saved_config(run_dir)
    if "gamma" in saved.get("ppo", {}):
        return float(saved["ppo"]["gamma"]), "the run's ppo.gamma"
    if saved.get("data"):
        try:
            sets = Dataset(saved["data"]).card().get("returns", {})
        except (ConfigError, OSError, ValueError):
            sets = {}
        name = saved.get("returns") or (next(iter(sets)) if len(sets) == 1 else None)
        if "gamma" in sets.get(name, {}):
            return float(sets[name]["gamma"]), f"returns set {name!r}"
    return DEFAULT_GAMMA, "default"


def plot_achievements(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(out["achievements"], key=lambda k: -out["achievements"][k])
    rates = [100 * out["achievements"][k] for k in names]
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(names)), 4))
    ax.bar(range(len(names)), rates)
    ax.set_xticks(range(len(names)), names, rotation=75, fontsize=7)
    ax.set_ylabel("success rate (%)")
    lo, hi = out["return_ci95"]
    ax.set_title(f"{Path(out['run']).name}: return {out['return_mean']:.2f} "
                 f"[{lo:.2f}, {hi:.2f}], {out['episodes']} episodes")
    save_figure(fig, path, dpi=100)
