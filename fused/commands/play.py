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
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from rich.console import Console

from fused.commands import process
from fused.errors import ConfigError
from fused.llm.config import ModelConfig
from fused.llm.player import PlayerSettings
from fused.envspec import EnvName
from fused.rl.config import EnvSettings
from fused.runs import config_io
from fused.runs.files import atomic_write_json, require_writable
from fused.runs.run_dir import default_name
from fused.runs import invocation

DESCRIPTION = ("An LLM plays N whole Craftax episodes from fixed seeds; eval.json as offline.py "
               "eval. Ctrl-C keeps every block played; --resume RUN goes on.")
HUMAN = ("You play Craftax on a local web page (or from a --script of keys); every step is "
         "recorded into a label.py dataset.")
REPLIES_KEPT = 20  # per episode, in replies.json
# Flags that change no result: a resumed play may give them anew (not --video: its frames are
# drawn in the play's own blocks).
RESUME_FREE = ("plot", "resume")


@dataclasses.dataclass(frozen=True)
class PlayEnv:
    """The env the LLM plays (its episodes never reset: no reset settings)."""

    name: EnvName = "Craftax-Classic-Symbolic-v1"
    """A Craftax env: Classic or the full game, symbolic or pixels (the LLM reads the text of
    the same state; a recording stores the env's observations, frames for a pixel env)."""
    max_episode_steps: int | None = None
    """Override the env's episode limit (truncation); None keeps the env default."""

    @property
    def settings(self) -> EnvSettings:
        return EnvSettings(name=self.name, max_episode_steps=self.max_episode_steps)


@dataclasses.dataclass(frozen=True)
class PlayConfig(PlayerSettings):
    """How the LLM plays (`PlayerSettings`), then what it plays and where the results go."""

    llm: ModelConfig = ModelConfig()
    """The Qwen3 that plays."""
    env: PlayEnv = PlayEnv()
    """The env (a Craftax env, symbolic or pixels)."""
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
    """Frames per video at most (and at most --max-steps)."""
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


def resume_command(run: Path) -> str:
    """The command that goes on with the play in `run`, named as the user started this one."""
    return f"{invocation.command('play.py')} llm --resume {run}"


def validate(c: PlayConfig) -> None:
    from fused.llm.config import is_vl, model_config, validate_model
    from fused.llm.player import check_settings
    from fused.rl.config import validate_env

    validate_env(c.env.settings, c.episodes, 1, "--episodes")
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
    check_settings(c)
    if is_vl(c.llm):
        raise ConfigError(f"llm.weights={c.llm.weights!r} is a Qwen3-VL: one playing from frames "
                          "is not built yet (play.py llm reads text; a VL model's states of "
                          "frames drive policies: train.py cpu-pixels --llm.weights VL_DIR)")
    model_config(c.llm)
    validate_model(c.llm)


class Progress:
    """What the blocks played so far left on the host, guarded by `lock` (the worker thread
    plays and saves; the main thread reads it to write partial results on an interrupt)."""

    def __init__(self, episodes: int, command: str):
        self.lock = threading.Lock()
        self.blocks = 0
        self.times: list[float] = []  # seconds per block
        self.tokens: list[float] = []  # every token generated in each block
        self.useful: list[float] = []  # those of running episodes
        self.replies: list[list[str]] = [[] for _ in range(episodes)]
        self.state = None  # the host copy of the last block's EvalState
        self.records: list = []  # per block (Record [T, N], live [T, N]) with --record
        self.seconds_before = 0.0  # wall time of the runs before a resume
        self.command = command  # the command that started the play
        self.run = ""  # the run folder

    def meta(self) -> dict:
        return {"blocks": self.blocks, "times": self.times, "tokens": self.tokens,
                "useful": self.useful, "replies": self.replies,
                "seconds": self.seconds_before, "command": self.command}


def _save_progress(path: Path, state, meta: dict) -> None:
    """The evaluation's state after a block and its host figures, in one file replaced whole
    (`atomic_path`), with the state's content digest."""
    import jax
    import numpy as np

    from fused.runs.checkpoint import state_digest
    from fused.runs.files import atomic_path

    leaves = [np.asarray(x) for x in jax.device_get(jax.tree.leaves(state))]
    meta = dict(meta, digest=state_digest(state))
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        np.savez(tmp, *leaves, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))


def _load_progress(path: Path, like) -> tuple:
    """(state shaped as `like`, meta) saved by `_save_progress`; ConfigError if damaged."""
    import jax
    import numpy as np

    from fused.runs.checkpoint import state_digest

    try:
        with np.load(path) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            leaves = [z[f"arr_{i}"] for i in range(len(z.files) - 1)]
        state = jax.tree.unflatten(jax.tree.structure(like), leaves)
    except Exception as e:  # a damaged file: numpy and zipfile raise many kinds
        raise ConfigError(f"--resume: {path} does not read back ({type(e).__name__}); start the "
                          "play again under another --run-name") from None
    if state_digest(state) != meta.get("digest"):
        raise ConfigError(f"--resume: {path} does not match its digest; start the play again "
                          "under another --run-name")
    return state, meta


def _save_records(folder: Path, i: int, recs) -> None:
    import jax
    import numpy as np

    from fused.runs.files import atomic_path

    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / f"block-{i:06d}.npz") as tmp:
        np.savez(tmp, *jax.tree.leaves(recs))


def _load_records(folder: Path, blocks, like) -> list:
    """The trees `_save_records` wrote for these block numbers, shaped as `like`."""
    import jax
    import numpy as np

    treedef = jax.tree.structure(like)
    out = []
    for i in blocks:
        with np.load(folder / f"block-{i:06d}.npz") as z:
            out.append(jax.tree.unflatten(treedef, [z[f"arr_{j}"] for j in range(len(z.files))]))
    return out


def load_shots(c: PlayConfig, run: Path) -> dict:
    """The few-shot turns: picked from --examples when the play starts, kept in R/shots.json,
    which a resumed play reads (golden examples recorded since do not change it)."""
    if c.resume and (run / "shots.json").is_file():
        return json.loads((run / "shots.json").read_text())
    if not c.examples:
        return {"examples": None, "from": [], "turns": []}
    from fused.human.golden import shots

    turns, where = shots(c.examples, c.shots, c.env.name)
    return {"examples": c.examples, "from": where, "turns": [list(t) for t in turns]}


def results(c: PlayConfig, player, env, progress: Progress, run: Path, partial: bool) -> dict:
    """eval.json's contents from what `progress` holds (partial: of the finished episodes)."""
    import numpy as np

    from fused.rl.evaluate import summarise

    state = progress.state
    done = np.asarray(state.done)
    out = summarise(state, env.achievement_names, c.max_steps, only=done if partial else None)
    steps = float(np.asarray(state.length).sum())
    first_timed = 1 if len(progress.times) > 1 else 0  # the first block compiles
    secs = sum(progress.times[first_timed:])
    out.update(
        run=str(run), seed=c.seed, env=c.env.name, seconds=progress.seconds_before
        + sum(progress.times), policy="llm", command=progress.command,
        llm={"weights": c.llm.weights, "random_model": None if c.llm.weights else
             c.llm.random_model, "dtype": player.dtype, "history": c.history,
             "max_new_tokens": c.max_new_tokens, "thinking": c.thinking,
             "shots": c.shots, "examples": c.examples,
             "sampling": player.sampling.record()},
        tokens_generated=int(np.asarray(state.spent["tokens"]).sum()),
        useful_tokens=int(np.asarray(state.stats["tokens"]).sum()),
        tokens_per_s=sum(progress.tokens[first_timed:]) / max(secs, 1e-9),
        useful_tokens_per_s=sum(progress.useful[first_timed:]) / max(secs, 1e-9),
        tokens_per_s_includes_compile=first_timed == 0,
        tokens_per_step=float(np.asarray(state.stats["tokens"]).sum()) / max(steps, 1),
        invalid_action_rate=float(np.asarray(state.stats["invalid"]).sum()) / max(steps, 1),
        unfinished_thought_rate=float(np.asarray(state.stats["unfinished"]).sum())
        / max(steps, 1))
    if partial:
        out.update(partial=True, steps_played=min(int(state.t), c.max_steps or 10 ** 9),
                   episodes_total=c.episodes, episodes_running=int((~done).sum()),
                   resume=resume_command(run))
    return out


def write_recording(c: PlayConfig, progress: Progress, partial: bool) -> dict:
    """The recorded episodes as a dataset at --record (partial: the finished ones, marked)."""
    import numpy as np

    from fused.data.played import episodes_of, write_played

    blocks = [r for r, _ in progress.records]
    live = [a for _, a in progress.records]
    episodes = episodes_of(blocks, live)
    if partial:
        done = np.asarray(progress.state.done)
        episodes = [e for i, e in enumerate(episodes) if done[i]]
    return write_played(Path(c.record).expanduser(), c.env.name, episodes,
                        {"policy": "llm", "played": config_io.to_dict(
                            dataclasses.replace(c, resume=None)), "command": progress.command,
                         "partial": partial, "run": progress.run}, c.shard_rows)


def play(c: PlayConfig, run: Path, console, command: str) -> dict:
    """Plays the episodes (from the last checkpointed block with --resume) and writes the run
    folder; returns eval.json's contents."""
    import jax
    import numpy as np

    from fused.commands.offline_eval import plot_achievements
    from fused.envspec import spec
    from fused.llm.player import make_player
    from fused.rl.envs import make_env
    from fused.rl.evaluate import ci_text, make_evaluate
    from fused.rl.policy_input import Identity
    from fused.rl.sharding import on_device

    settings = PlayerSettings(**{f.name: getattr(c, f.name)
                                 for f in dataclasses.fields(PlayerSettings)})
    shots = load_shots(c, run)
    # one-line errors, memory among them, before compiling
    player = make_player(c.llm, settings, c.env.name, c.episodes, c.seed,
                         tuple((o, r) for o, r in shots["turns"]))
    record = Path(c.record).expanduser() if c.record else None
    run.mkdir(parents=True, exist_ok=True)
    if shots["turns"]:  # before config.json: a resumed play always finds the shots it began with
        atomic_write_json(run / "shots.json", shots)
    if not c.resume:
        atomic_write_json(run / "config.json", config_io.to_dict(c))
    env = make_env(c.env.settings, text=True)  # a pixel env: the text twin after the frame
    s = spec(c.env.name)
    watch = None
    if c.video:  # the first --video episodes drawn as they are played, the reply beside
        from fused.video import FrameWatch

        watch = FrameWatch(c.env.name, c.video, c.video_max_steps,
                           extra=lambda before, after: (after.carry.last_reply,
                                                        after.carry.tokens),
                           text=lambda reply: player.text(reply[0][:int(reply[1])]),
                           critic=False)  # (the return-to-go alone: the player has no critic)
    ev = make_evaluate(env, player.policy, Identity(), c.episodes, c.block_steps,
                       max_steps=c.max_steps, record=s if record is not None else None,
                       watch=watch)
    console.print(f"[bold]craftax-fused play[/] {c.env.name}: {c.episodes} episodes, history "
                  f"{c.history}, replies of up to {c.max_new_tokens} tokens, "
                  f"{player.sampling.describe()}{', thinking' if c.thinking else ''}"
                  f"{f', {c.shots} golden shots' if c.shots else ''}, "
                  f"{player.dtype} -> {run}")
    state = on_device(jax.jit(ev.init)(jax.random.PRNGKey(c.seed), None))
    params = on_device(player.params)  # (the loop's inputs all on one device)
    block = jax.jit(ev.block, donate_argnums=0)
    progress = Progress(c.episodes, command)
    progress.run = str(run)
    saved = run / "progress" / "state.npz"
    records_dir = run / "progress" / "records"
    frames_dir = run / "progress" / "frames"
    if c.resume and saved.is_file():
        host, meta = _load_progress(saved, state)
        state = on_device(host)
        # the blocks' timings stay with the process that timed them (each one's first block
        # compiles); the results are the state's
        progress.blocks, progress.replies = meta["blocks"], meta["replies"]
        progress.seconds_before = meta["seconds"] + sum(meta["times"])
        progress.command = meta["command"]
        like = jax.eval_shape(ev.block, state, player.params, None)
        if record is not None:
            progress.records = _load_records(records_dir, range(progress.blocks),
                                             like[1]["record"])
        if watch is not None:  # the blocks that kept steps of watched episodes
            drawn = [i for i in range(progress.blocks)
                     if (frames_dir / f"block-{i:06d}.npz").is_file()]
            for watched in _load_records(frames_dir, drawn, like[1]["watch"]):
                watch.add(watched)
        console.print(f"resumed at step {int(state.t):,} ({progress.blocks} blocks played)")
    elif c.resume:
        console.print(f"--resume {run}: no block was played before it stopped; starting afresh")
    progress.state = jax.device_get(state)
    cap = c.max_steps or 10 ** 9
    failure: list[BaseException] = []

    def loop():
        nonlocal state
        try:
            while not bool(np.asarray(state.done).all()) and int(state.t) < cap:
                before = np.asarray(state.spent["tokens"]).sum()
                useful_before = np.asarray(state.stats["tokens"]).sum()
                t0 = time.time()
                out = block(state, params, None)
                state, extras = out if isinstance(out, tuple) else (out, {})
                recs = extras.get("record")
                jax.block_until_ready(state.t)
                took = time.time() - t0
                host = jax.device_get(state)
                replies = np.asarray(host.carry.last_reply)
                with progress.lock:
                    if recs is not None:
                        recs = jax.device_get(recs)
                        _save_records(records_dir, progress.blocks, recs)
                        progress.records.append(recs)
                    if watch is not None and watch.holds(extras["watch"]):
                        watched = watch.fetch(extras["watch"])
                        _save_records(frames_dir, progress.blocks, watched)
                        watch.add(watched)
                    progress.times.append(took)
                    progress.tokens.append(float(np.asarray(host.spent["tokens"]).sum() - before))
                    progress.useful.append(float(np.asarray(host.stats["tokens"]).sum()
                                                 - useful_before))
                    for e, r in enumerate(replies):
                        if len(progress.replies[e]) < REPLIES_KEPT and not bool(host.done[e]):
                            progress.replies[e].append(
                                player.text(r[:int(np.asarray(host.carry.tokens)[e])]))
                    progress.blocks += 1
                    progress.state = host
                    _save_progress(saved, host, progress.meta())
                console.print(f"  {min(int(host.t), cap):,} steps: "
                              f"{int(np.asarray(host.done).sum())}/{c.episodes} episodes ended, "
                              f"{progress.tokens[-1] / took:,.0f} tokens/s"
                              + ("  (incl. compile)" if len(progress.times) == 1 else ""))
        except BaseException as e:  # handed to the main thread
            failure.append(e)

    stop = threading.Event()
    handlers = {sig: signal.signal(sig, lambda *_: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    worker = threading.Thread(target=loop, name="play", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.2)
            if stop.is_set():
                interrupted(c, player, env, progress, run, console)
    finally:
        for sig, h in handlers.items():
            signal.signal(sig, h)
    if failure:
        raise failure[0]
    out = results(c, player, env, progress, run, partial=False)
    if c.resume:
        out["resumed"] = resume_command(run)
    atomic_write_json(run / "replies.json", {"every_steps": c.block_steps,
                                             "replies": progress.replies})
    if record is not None:
        counts = write_recording(c, progress, partial=False)
        out["record"] = {"data": str(record), **counts}
        console.print(f"recorded {counts['episodes_kept']} episodes, {counts['rows']:,} rows "
                      f"-> {record}")
    atomic_write_json(run / "eval.json", out)
    if c.plot and out["achievements"]:
        plot_achievements(out, run / "eval_achievements.png")
    if c.video:
        from fused.video import DEFAULT_GAMMA, write_videos

        out["videos"] = [str(p) for p in write_videos(watch.episodes, run / "videos",
                                                      DEFAULT_GAMMA, "default", critic=False)]
        out["video_gamma"] = DEFAULT_GAMMA
        atomic_write_json(run / "eval.json", out)
        console.print(f"{len(out['videos'])} videos -> {run / 'videos'}")
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


def interrupted(c: PlayConfig, player, env, progress: Progress, run: Path, console) -> None:
    """Ctrl-C / SIGTERM: the blocks played so far as partial results, then exit 130 at once
    (a block still computing is dropped: the checkpoint of the one before is its start)."""
    with progress.lock:  # waits for a save in progress
        if progress.blocks:
            out = results(c, player, env, progress, run, partial=True)
            atomic_write_json(run / "replies.json", {"every_steps": c.block_steps,
                                                     "replies": progress.replies})
            if c.record:
                out["record"] = {"data": c.record, **write_recording(c, progress, partial=True)}
            atomic_write_json(run / "eval.json", out)
            line = (f"interrupted after {out['steps_played']:,} steps: {out['episodes']} of "
                    f"{c.episodes} episodes finished, kept in {run / 'eval.json'} (partial); "
                    f"go on with `{resume_command(run)}`")
        else:
            line = (f"interrupted before the first block of {c.block_steps} steps ended: nothing "
                    f"played yet; start again with `{resume_command(run)}`")
        console.print("\n" + line)
        sys.stdout.flush()
        sys.stderr.flush()
        # At once: XLA may be computing in the worker thread, and the interpreter's teardown
        # beside a running computation crashed (SIGSEGV).
        os._exit(130)


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


@process.quiet_broken_pipe
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
        from fused.commands import human

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
            from fused.data.played import check_new_dataset

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
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # a compilation may still run in another thread


cli = process.console_script(main)  # craftax-play
