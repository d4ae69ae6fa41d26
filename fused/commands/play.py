"""`play.py llm`: a Qwen3 plays Craftax by writing its replies (what the LLM knows of the game).

    python play.py llm --llm.weights DIR --episodes 16 --seed 0 --history 2 --out-dir runs \\
        --run-name qwen-play [--max-steps 500] [--video 2] [--record data/qwen-play]

The player (`fused.llm.player`) is one more policy behind the shared acting step, and the
episodes are evaluation's (`fused.rl.evaluate`): one whole episode per env from fixed seeds,
every env in one jitted step. Writes R/config.json, R/eval.json (offline.py eval's keys, plus
tokens/s, tokens per step and `invalid_action_rate`: the share of steps whose reply named no
action and took NOOP), R/eval_achievements.png, R/replies.json (each episode's reply at the end of every block of
steps, its first ones),
R/videos/ with `--video N` (the reply beside each frame), and with `--record D` the episodes as
a label.py dataset. Without --llm.weights the built-in tiny RANDOM Qwen3 plays, with a notice.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import time
from pathlib import Path

from rich.console import Console

from fused.commands import process
from fused.errors import ConfigError
from fused.llm.config import ModelConfig
from fused.llm.player import PlayerSettings
from fused.rl.config import EnvSettings
from fused.runs import config_io
from fused.runs.files import atomic_write_json, require_writable
from fused.runs.run_dir import default_name

DESCRIPTION = "An LLM plays N whole Craftax episodes from fixed seeds; eval.json as offline.py eval."
REPLIES_KEPT = 20  # per episode, in replies.json


@dataclasses.dataclass(frozen=True)
class PlayConfig(PlayerSettings):
    """How the LLM plays (`PlayerSettings`), then what it plays and where the results go."""

    llm: ModelConfig = ModelConfig()
    """The Qwen3 that plays."""
    env: EnvSettings = EnvSettings(name="Craftax-Classic-Symbolic-v1")
    """The env (Craftax-Classic-Symbolic-v1 or Craftax-Symbolic-v1)."""
    episodes: int = 8
    """Episodes, one per seed, played at once; each to its end or --max-steps."""
    seed: int = 0
    """Seed of the episodes' worlds (offline.py eval's: the same worlds for the same seed) and
    of the replies' sampling."""
    max_steps: int | None = 500
    """Stop episodes still running after this many steps (reported as censored); None plays
    every episode to its end (long: Craftax episodes run to 10,000 steps)."""
    block_steps: int = 16
    """Env steps per compiled block (the host reports between blocks)."""
    out_dir: str = "runs"
    """Folder under which the run gets its folder."""
    run_name: str | None = None
    """Run folder name; default `play-<env>-s<seed>-<time>`."""
    video: int = 0
    """Also write this many episodes as GIFs into R/videos/ with each step's reply beside."""
    video_max_steps: int = 200
    """Frames per video at most."""
    record: str | None = None
    """Write the episodes played as a label.py dataset into this new folder."""
    shard_rows: int = 8192
    """Rows per shard of the recorded dataset."""
    plot: bool = True
    """Write eval_achievements.png beside eval.json."""


def validate(c: PlayConfig) -> None:
    from fused.llm.config import model_config, validate_model
    from fused.llm.player import check_settings
    from fused.rl.config import validate_env

    validate_env(c.env, c.episodes, 1, "episodes")
    if c.episodes <= 1:
        raise ConfigError(f"episodes={c.episodes}: at least 2 for a confidence interval")
    if c.max_steps is not None and c.max_steps <= 0:
        raise ConfigError(f"max_steps={c.max_steps} must be positive or None")
    for name in ("block_steps", "video_max_steps", "shard_rows"):
        if getattr(c, name) <= 0:
            raise ConfigError(f"{name}={getattr(c, name)} must be positive")
    if not 0 <= c.video <= c.episodes:
        raise ConfigError(f"video={c.video} must lie in 0..episodes ({c.episodes})")
    check_settings(c)
    model_config(c.llm)
    validate_model(c.llm)


def play(c: PlayConfig, run: Path, console, command: str) -> dict:
    """Plays the episodes and writes the run folder; returns eval.json's contents."""
    import jax
    import numpy as np

    from fused.commands.offline_eval import plot_achievements
    from fused.envspec import spec
    from fused.llm.player import make_player
    from fused.rl.envs import make_env
    from fused.rl.evaluate import make_evaluate, summarise
    from fused.rl.policy_input import Identity

    settings = PlayerSettings(**{f.name: getattr(c, f.name)
                                 for f in dataclasses.fields(PlayerSettings)})
    player = make_player(c.llm, settings, c.env.name, c.seed)  # one-line errors before compiling
    record = Path(c.record).expanduser() if c.record else None
    run.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run / "config.json", config_io.to_dict(c))
    env = make_env(c.env)
    s = spec(c.env.name)
    ev = make_evaluate(env, player.policy, Identity(), c.episodes, c.block_steps,
                       max_steps=c.max_steps, record=s if record is not None else None)
    console.print(f"[bold]craftax-fused play[/] {c.env.name}: {c.episodes} episodes, history "
                  f"{c.history}, replies of up to {c.max_new_tokens} tokens "
                  f"({'greedy' if c.greedy else f'temperature {c.temperature}'}"
                  f"{', thinking' if c.thinking else ''}) -> {run}")
    state = jax.jit(ev.init)(jax.random.PRNGKey(c.seed), None)
    block = jax.jit(ev.block, donate_argnums=0)
    cap = c.max_steps or 10 ** 9
    blocks, live, replies = [], [], [[] for _ in range(c.episodes)]  # a reply per block
    times, tokens = [], []
    t_start = time.time()
    while not bool(np.asarray(state.done).all()) and int(state.t) < cap:
        before = np.asarray(state.stats["tokens"]).sum()
        t0 = time.time()
        out = block(state, player.params, None)
        state, recs = out if record is not None else (out, None)
        jax.block_until_ready(state.t)
        times.append(time.time() - t0)
        tokens.append(float(np.asarray(state.stats["tokens"]).sum() - before))
        if recs is not None:
            rec, alive = jax.device_get(recs)
            blocks.append(rec)
            live.append(alive)
        for e, r in enumerate(np.asarray(state.carry.last_reply)):
            if len(replies[e]) < REPLIES_KEPT and not bool(np.asarray(state.done)[e]):
                replies[e].append(player.text(r[:int(np.asarray(state.carry.tokens)[e])]))
        console.print(f"  {int(state.t):,} steps: {int(np.asarray(state.done).sum())}/"
                      f"{c.episodes} episodes ended, {tokens[-1] / times[-1]:,.0f} tokens/s"
                      + ("  (incl. compile)" if len(times) == 1 else ""))
    out = summarise(state, env.achievement_names, c.max_steps)
    steps = float(np.asarray(state.length).sum())
    timed = slice(1, None) if len(times) > 1 else slice(None)  # the first block compiles
    out.update(
        run=str(run), seed=c.seed, env=c.env.name, seconds=time.time() - t_start,
        policy="llm", command=command,
        llm={"weights": c.llm.weights, "random_model": None if c.llm.weights else
             c.llm.random_model, "history": c.history, "max_new_tokens": c.max_new_tokens,
             "sampling": "greedy" if c.greedy else {"temperature": c.temperature,
                                                    "top_k": c.top_k, "top_p": c.top_p},
             "thinking": c.thinking},
        tokens_per_s=sum(tokens[timed]) / sum(times[timed]),
        tokens_per_s_includes_compile=len(times) == 1,
        tokens_per_step=float(np.asarray(state.stats["tokens"]).sum()) / max(steps, 1),
        invalid_action_rate=float(np.asarray(state.stats["invalid"]).sum()) / max(steps, 1))
    atomic_write_json(run / "replies.json", {"every_steps": c.block_steps, "replies": replies})
    if record is not None:
        from fused.data.played import episodes_of, write_played

        counts = write_played(record, c.env.name, episodes_of(blocks, live),
                              {"policy": "llm", "played": config_io.to_dict(c),
                               "command": command}, c.shard_rows)
        out["record"] = {"data": str(record), **counts}
        console.print(f"recorded {counts['episodes_kept']} episodes, {counts['rows']:,} rows "
                      f"-> {record}")
    atomic_write_json(run / "eval.json", out)
    if c.plot and out["achievements"]:
        plot_achievements(out, run / "eval_achievements.png")
    if c.video:
        from fused.video import play_frames, write_gifs

        def text(before, after, e):
            n = int(np.asarray(after.carry.tokens)[e])
            return player.text(np.asarray(after.carry.last_reply)[e][:n])

        frames = play_frames(c.env, player.policy, Identity(), player.params, None, c.video,
                             c.seed, c.video_max_steps, False, text)
        out["videos"] = [str(p) for p in write_gifs(frames, run / "videos")]
        atomic_write_json(run / "eval.json", out)
        console.print(f"{len(out['videos'])} videos -> {run / 'videos'}")
    lo, hi = out["return_ci95"]
    console.print(f"return {out['return_mean']:.2f} (95% CI {lo:.2f}-{hi:.2f}) over "
                  f"{out['episodes']} episodes, length {out['length_mean']:.0f}, invalid "
                  f"replies {out['invalid_action_rate']:.1%}, {out['tokens_per_s']:,.0f} "
                  f"tokens/s" + (f", {out['censored']} censored at {c.max_steps} steps"
                                 if out["censored"] else "") + f" -> {run / 'eval.json'}")
    return out


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    console = Console(soft_wrap=True)
    process.one_line_warnings()
    process.log_to(console)
    if not argv or argv[0] != "llm":
        sys.exit("usage: python play.py llm [--flags] (python play.py llm --help for each)")
    try:
        c = config_io.cli(PlayConfig, argv[1:], DESCRIPTION, "play.py llm")
        validate(c)
        require_writable(c.out_dir, "--out-dir")
        if c.record:
            from fused.data.played import check_new_dataset

            require_writable(Path(c.record).expanduser().parent, "--record")
            check_new_dataset(c.record)
        run = Path(c.out_dir).expanduser() / (c.run_name or default_name(
            "play", c.env.name, f"s{c.seed}"))
        if (run / "eval.json").exists():
            raise ConfigError(f"run folder {run} already holds a play's results; pick another "
                              "--run-name")
        process.setup_compilation_cache()
        return play(c, run, console, "python play.py " + shlex.join(argv))
    except ConfigError as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:
        sys.exit("interrupted: nothing of this play was kept but what it had written; run the "
                 "same command again")
