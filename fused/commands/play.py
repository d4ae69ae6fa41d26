"""`play.py llm`: a Qwen3 plays Craftax by writing its replies (what the LLM knows of the game).

    python play.py llm --llm.weights DIR --episodes 16 --seed 0 --history 2 --out-dir runs \\
        --run-name qwen-play [--max-steps 500] [--video 2] [--record data/qwen-play]
    python play.py llm --resume runs/qwen-play      # goes on after Ctrl-C or a kill

The player (`fused.llm.player`) is one more policy behind the shared acting step, and the
episodes are evaluation's (`fused.rl.evaluate`): one whole episode per env from fixed seeds,
every env in one jitted step. Writes R/config.json, R/eval.json (offline.py eval's keys, plus
the sampling used and where it came from, `tokens_generated` and `tokens_per_s` (every token
generated, the envs whose episode ended or passed the cap included), `useful_tokens` and
`useful_tokens_per_s` (those of running episodes), tokens per step,
`invalid_action_rate`: the share of steps whose reply named no action and took NOOP, and
`unfinished_thought_rate` with --thinking), R/eval_achievements.png, R/replies.json (each
episode's reply at the end of every block of steps, its first ones), R/videos/ with `--video N`
(the reply beside each frame), and with `--record D` the episodes as a label.py dataset.
Without --llm.weights the built-in tiny RANDOM Qwen3 plays, with a notice.

After every block the state of the evaluation is checkpointed in R/progress/ (with the recorded
steps and the frames drawn): Ctrl-C (or SIGTERM) at any moment ends the command at once (exit
130) keeping every block played: a partial eval.json (`"partial": true`, the episodes finished
so far), replies.json and, with --record, the finished episodes as a dataset marked partial;
`--resume R` continues the same evaluation to the same result (and videos) an uninterrupted run
gives.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from pathlib import Path

from rich.console import Console

from fused.commands import process
from fused.commands.play_job import PlayJob
from fused.data.played import check_new_dataset
from fused.errors import ConfigError
from fused.human.golden import shots as golden_shots
from fused.llm.config import ModelConfig, is_vl, model_config, validate_model
from fused.llm.player import PlayerSettings, check_settings, make_player
from fused.rl.config import GameSettings, validate_game
from fused.rl.evaluate import ci_text
from fused.runs import config_io, invocation
from fused.runs.blocks import run_blocks
from fused.runs.files import atomic_write_json, require_writable
from fused.runs.interrupts import exit_now
from fused.runs.run_dir import default_name
from fused.runs.settings import CudaGraphs
from fused.video import check_video_gamma

DESCRIPTION = ("An LLM plays N whole Craftax episodes from fixed seeds; eval.json as offline.py "
               "eval. Ctrl-C keeps every block played; --resume RUN goes on.")
HUMAN = ("You play Craftax on a local web page (or from a --script of keys); every step is "
         "recorded into a label.py dataset.")
# Flags that change no result: a resumed play may give them anew (not --video: its frames are
# drawn in the play's own blocks).
RESUME_FREE = ("plot", "resume", "cuda_graphs")


@dataclasses.dataclass(frozen=True)
class PlayConfig(PlayerSettings):
    """How the LLM plays (`PlayerSettings`), then what it plays and where the results go."""

    llm: ModelConfig = ModelConfig()
    """The Qwen3 that plays."""
    env: GameSettings = GameSettings(name="Craftax-Classic-Symbolic-v1")
    """The env the LLM plays: a Craftax env, Classic or the full game, symbolic or pixels (the
    LLM reads the text of the same state; a recording stores the env's observations, frames for
    a pixel env). Its episodes never reset."""
    episodes: int = 8
    """Episodes, one per seed, played at once; each to its end or --max-steps (at least 2:
    eval.json gives a confidence interval)."""
    seed: int = 0
    """Seed of the episodes' worlds (offline.py eval's: the same worlds for the same seed) and
    of the replies' sampling."""
    max_steps: int | None = 500
    """Stop episodes still running after this many steps (reported as censored); None plays
    every episode to its end (long: Craftax episodes run to 10,000 steps)."""
    block_steps: int = 16
    """Env steps per compiled block (the host reports and checkpoints between blocks)."""
    out_dir: str = "runs"
    """Folder under which the run gets its folder."""
    run_name: str | None = None
    """Run folder name; default `play-<env>-s<seed>-<time>`."""
    resume: str | None = None
    """Go on with the play in this run folder (stopped by Ctrl-C or a kill) from its last
    block; only --plot may be given anew."""
    video: int = 0
    """Also write the first this many episodes as GIFs into R/videos/ with each step's reply
    beside, drawn as they are played."""
    video_max_steps: int = 200
    """Frames per video at most (and at most --max-steps); the return-to-go curve beneath covers
    the whole episode."""
    video_gamma: float | None = None
    """Discount of the videos' return-to-go (an LLM player has no critic: the curve is the
    return-to-go alone); default 0.99. The legend names it."""
    record: str | None = None
    """Write the episodes played as a label.py dataset into this new folder."""
    shard_rows: int = 8192
    """Rows per shard of the recorded dataset."""
    examples: str | None = None
    """Golden examples recorded by `play.py human --examples E`: --shots of them go before the
    conversation as few-shot turns (observation, then `Action: id:NAME`)."""
    shots: int = 0
    """Few-shot turns from --examples: steps of this env other than NOOP, evenly spaced over
    what was recorded. They are part of the prompt's constant prefix (encoded once)."""
    plot: bool = True
    """Write eval_achievements.png beside eval.json."""
    cuda_graphs: CudaGraphs = "loops"


def resume_command(run: Path) -> str:
    """The command that goes on with the play in `run`, named as the user started this one."""
    return f"{invocation.command('play.py')} llm --resume {run}"


def validate(c: PlayConfig) -> None:
    validate_game(c.env)
    if c.episodes <= 1:
        raise ConfigError(f"--episodes {c.episodes}: at least 2 for a confidence interval")
    if c.max_steps is not None and c.max_steps <= 0:
        raise ConfigError(f"--max-steps {c.max_steps} must be positive (or None: no cap)")
    for name in ("block_steps", "video_max_steps", "shard_rows"):
        if getattr(c, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} {getattr(c, name)} must be positive")
    if c.shots < 0 or (c.shots > 0) != (c.examples is not None):
        raise ConfigError(f"--shots {c.shots} with --examples {c.examples}: few-shot turns need "
                          "both (--examples E --shots N, N >= 1), or neither")
    if not 0 <= c.video <= c.episodes:
        raise ConfigError(f"--video {c.video} must lie in 0..--episodes ({c.episodes})")
    check_video_gamma(c.video_gamma)
    check_settings(c)
    if is_vl(c.llm):
        raise ConfigError(f"llm.weights={c.llm.weights!r} is a Qwen3-VL: one playing from frames "
                          "is not built yet (play.py llm reads text; a VL model's states of "
                          "frames drive policies: train.py cpu-pixels --llm.weights VL_DIR)")
    model_config(c.llm)
    validate_model(c.llm)


def load_shots(c: PlayConfig, run: Path) -> dict:
    """The few-shot turns: picked from --examples when the play starts, kept in R/shots.json,
    which a resumed play reads (golden examples recorded since do not change it)."""
    if c.resume and (run / "shots.json").is_file():
        return json.loads((run / "shots.json").read_text())
    if not c.examples:
        return {"examples": None, "from": [], "turns": []}
    turns, where = golden_shots(c.examples, c.shots, c.env.name)
    return {"examples": c.examples, "from": where, "turns": [list(t) for t in turns]}


def play(c: PlayConfig, run: Path, console, command: str) -> dict:
    """Plays the episodes (from the last saved block with --resume) and writes the run folder;
    returns eval.json's contents."""
    settings = PlayerSettings(**{f.name: getattr(c, f.name)
                                 for f in dataclasses.fields(PlayerSettings)})
    shots = load_shots(c, run)
    # one-line errors, memory among them, before compiling
    player = make_player(c.llm, settings, c.env.name, c.episodes, c.seed,
                         tuple((o, r) for o, r in shots["turns"]))
    run.mkdir(parents=True, exist_ok=True)
    if shots["turns"]:  # before config.json: a resumed play always finds the shots it began with
        atomic_write_json(run / "shots.json", shots)
    if not c.resume:
        atomic_write_json(run / "config.json", config_io.to_dict(c))
    job = PlayJob(c, run, player, command, resume_command(run), console)
    console.print(f"[bold]craftax-fused play[/] {c.env.name}: {c.episodes} episodes, history "
                  f"{c.history}, replies of up to {c.max_new_tokens} tokens, "
                  f"{player.sampling.describe()}{', thinking' if c.thinking else ''}"
                  f"{f', {c.shots} golden shots' if c.shots else ''}, "
                  f"{player.dtype} -> {run}")
    run_blocks(job, console)
    out = job.finish(console)
    lo, hi = out["return_ci95"]
    console.print(f"return {out['return_mean']:.2f} (95% CI {ci_text(lo, hi)}) over "
                  f"{out['episodes']} episodes, length {out['length_mean']:.0f}, invalid "
                  f"replies {out['invalid_action_rate']:.1%}"
                  + (f" ({out['unfinished_thought_rate']:.1%} unfinished thoughts)"
                     if c.thinking else "")
                  + f", {out['tokens_per_s']:,.0f} tokens/s ({out['useful_tokens_per_s']:,.0f} of "
                  "running episodes)" + (f", {out['censored']} censored at {c.max_steps} steps"
                                         if out["censored"] else "") + f" -> {run / 'eval.json'}")
    return out


def resume_config(argv: list[str]) -> PlayConfig:
    """The saved config of the run named by --resume, with the flags that change no result."""
    i = argv.index("--resume")
    if i + 1 >= len(argv):
        raise ConfigError("--resume needs a run folder written by play.py llm")
    run = Path(argv[i + 1]).expanduser()
    rest = argv[:i] + argv[i + 2:]
    fields = [f.name for f in dataclasses.fields(PlayConfig)]
    fixed = tuple(f for f in fields if f not in RESUME_FREE)
    c, _ = config_io.resume(PlayConfig, run / "config.json", rest, {}, fixed)
    return dataclasses.replace(c, resume=str(run))


@process.ends_in_one_line
def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    console = Console(soft_wrap=True)
    process.one_line_warnings()
    process.log_to(console)
    prog = invocation.command("play.py")
    if argv in (["-h"], ["--help"]):
        print(f"usage: {prog} llm|human [--flags]\n\ncommands:\n  llm     {DESCRIPTION}\n"
              f"  human   {HUMAN}\n(`{prog} llm --help`, `{prog} human --help` list the flags)")
        sys.exit(0)
    if not argv or argv[0] not in ("llm", "human"):
        sys.exit(f"usage: {prog} llm|human [--flags] ({prog} llm --help for each)")
    if argv[0] == "human":
        from fused.commands import human  # (the page's server and game: `human` only)

        try:
            return human.main(argv[1:], prog)
        except ConfigError as e:
            sys.exit(f"error: {e}")
    try:
        if "--resume" in argv[1:]:
            c = resume_config(argv[1:])
            run = Path(c.resume)
            done = run / "eval.json"
            if done.is_file() and '"partial": true' not in done.read_text():
                console.print(f"{run}: the play is complete ({done}); nothing to resume")
                return json.loads(done.read_text())
        else:
            c = config_io.cli(PlayConfig, argv[1:], DESCRIPTION, f"{prog} llm")
            run = Path(c.out_dir).expanduser() / (c.run_name or default_name(
                "play", c.env.name, f"s{c.seed}"))
            if (run / "config.json").exists():
                raise ConfigError(f"run folder {run} already holds a play; pick another "
                                  f"--run-name, or go on with --resume {run}")
        validate(c)
        require_writable(run.parent if not c.resume else run, "--out-dir")
        if c.record:
            require_writable(Path(c.record).expanduser().parent, "--record")
            check_new_dataset(c.record, partial_of=str(run) if c.resume else None)
        process.setup_compilation_cache()
        return play(c, run, console, f"{prog} " + shlex.join(argv))
    except ConfigError as e:
        sys.exit(f"error: {e}")
    except KeyboardInterrupt:  # before the play began (loading, compiling its first steps)
        folder = locals().get("run")
        again = (f"start again with `{resume_command(folder)}`"
                 if folder is not None and (folder / "config.json").is_file()
                 else "run the same command again")
        console.print(f"\ninterrupted before the first block: nothing played yet; {again}")
        exit_now(130)  # a compilation may still run in another thread


cli = process.console_script(main)  # craftax-play
