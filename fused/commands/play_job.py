"""`play.py llm`'s episodes as a block job (`fused.runs.blocks`): every block plays
`--block-steps` env steps of every episode in one jitted call; after it the evaluation's state,
the host figures and replies, and (with --record, --video) the block's records and drawn frames
are saved in R/progress/, each file whole, so a stopped play goes on from its last block with
`--resume` and ends as an uninterrupted one does."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import jax
import numpy as np

from fused.commands.offline_eval import plot_achievements
from fused.data.played import episodes_of, write_played
from fused.envspec import spec
from fused.errors import ConfigError
from fused.rl.envs import make_env
from fused.rl.evaluate import make_evaluate, summarise
from fused.rl.policy_input import Identity
from fused.rl.sharding import jit_init, on_device
from fused.runs import config_io
from fused.runs.checkpoint import state_digest
from fused.runs.files import atomic_path, atomic_write_json
from fused.video import DEFAULT_GAMMA, FrameWatch, write_videos
from llm_jax.graphs import loop_jit

REPLIES_KEPT = 20  # per episode, in replies.json


def save_state(path: Path, state, meta: dict) -> None:
    """The evaluation's state after a block and its host figures, in one file replaced whole
    (`atomic_path`), with the state's content digest."""
    leaves = [np.asarray(x) for x in jax.device_get(jax.tree.leaves(state))]
    meta = dict(meta, digest=state_digest(state))
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        np.savez(tmp, *leaves, meta=np.frombuffer(json.dumps(meta).encode(), np.uint8))


def load_state(path: Path, like) -> tuple:
    """(state shaped as `like`, meta) saved by `save_state`; ConfigError if damaged."""
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


def save_tree(folder: Path, i: int, tree) -> None:
    """Block `i`'s tree of arrays (its records, its frames), whole."""
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / f"block-{i:06d}.npz") as tmp:
        np.savez(tmp, *jax.tree.leaves(tree))


def load_trees(folder: Path, blocks, like) -> list:
    """The trees `save_tree` wrote for these block numbers, shaped as `like`."""
    treedef = jax.tree.structure(like)
    out = []
    for i in blocks:
        with np.load(folder / f"block-{i:06d}.npz") as z:
            out.append(jax.tree.unflatten(treedef, [z[f"arr_{j}"] for j in range(len(z.files))]))
    return out


class PlayJob:
    """The episodes of `c` played by `player` in the run folder `run` (resumed from its last
    saved block with --resume)."""

    def __init__(self, c, run: Path, player, command: str, resume_command: str, console):
        self.c, self.run, self.player, self.resume_command = c, run, player, resume_command
        self.lock = threading.Lock()
        self.blocks = 0
        self.times: list[float] = []  # seconds per block
        self.tokens: list[float] = []  # every token generated in each block
        self.useful: list[float] = []  # those of running episodes
        self.replies: list[list[str]] = [[] for _ in range(c.episodes)]
        self.records: list = []  # per block (Record [T, N], live [T, N]) with --record
        self.seconds_before = 0.0  # wall time of the runs before a resume
        self.command = command  # the command that started the play
        self.env = make_env(c.env, text=True)  # a pixel env: the text twin after it
        self.watch = None
        self.video_gamma = c.video_gamma  # (checked by play.py's validate)
        if c.video:  # the first --video episodes drawn as they are played, the reply beside;
            # the return-to-go alone under them (the player has no critic)
            self.watch = FrameWatch(c.env.name, c.video, c.video_max_steps,
                                    extra=lambda before, after: (after.carry.last_reply,
                                                                 after.carry.tokens),
                                    text=lambda reply: player.text(reply[0][:int(reply[1])]),
                                    critic=False)
        self.ev = make_evaluate(self.env, player.policy, Identity(), c.episodes, c.block_steps,
                                max_steps=c.max_steps,
                                record=spec(c.env.name) if c.record else None, watch=self.watch)
        self.state = on_device(jit_init(self.ev)(jax.random.PRNGKey(c.seed), None))
        self.params = on_device(player.params)  # (the loop's inputs all on one device)
        self.block = loop_jit(self.ev.block, c.cuda_graphs, donate_argnums=0)
        self.saved = run / "progress" / "state.npz"
        self.records_dir, self.frames_dir = run / "progress" / "records", run / "progress" / "frames"
        if c.resume and self.saved.is_file():
            self._resume(console)
        elif c.resume:
            console.print(f"--resume {run}: no block was played before it stopped; starting "
                          "afresh")
        self.host = jax.device_get(self.state)
        self.cap = c.max_steps or 10 ** 9

    def _resume(self, console) -> None:
        host, meta = load_state(self.saved, self.state)
        self.state = on_device(host)
        # the blocks' timings stay with the process that timed them (each one's first block
        # compiles); the results are the state's
        self.blocks, self.replies = meta["blocks"], meta["replies"]
        self.seconds_before = meta["seconds"] + sum(meta["times"])
        self.command = meta["command"]
        like = jax.eval_shape(self.ev.block, self.state, self.player.params, None)
        if self.c.record:
            self.records = load_trees(self.records_dir, range(self.blocks), like[1]["record"])
        if self.watch is not None:  # the blocks that kept steps of watched episodes
            drawn = [i for i in range(self.blocks)
                     if (self.frames_dir / f"block-{i:06d}.npz").is_file()]
            for watched in load_trees(self.frames_dir, drawn, like[1]["watch"]):
                self.watch.add(watched)
        console.print(f"resumed at step {int(host.t):,} ({self.blocks} blocks played)")

    def meta(self) -> dict:
        return {"blocks": self.blocks, "times": self.times, "tokens": self.tokens,
                "useful": self.useful, "replies": self.replies,
                "seconds": self.seconds_before, "command": self.command}

    # --- the block job --------------------------------------------------------------------------

    def pending(self) -> bool:
        return not bool(np.asarray(self.host.done).all()) and int(self.host.t) < self.cap

    def run_block(self) -> str:
        before = np.asarray(self.host.spent["tokens"]).sum()
        useful_before = np.asarray(self.host.stats["tokens"]).sum()
        t0 = time.time()
        out = self.block(self.state, self.params, None)
        self.state, extras = out if isinstance(out, tuple) else (out, {})
        jax.block_until_ready(self.state.t)
        took = time.time() - t0
        host = jax.device_get(self.state)
        with self.lock:
            if extras.get("record") is not None:
                recs = jax.device_get(extras["record"])
                save_tree(self.records_dir, self.blocks, recs)
                self.records.append(recs)
            if self.watch is not None and self.watch.holds(extras["watch"]):
                watched = self.watch.fetch(extras["watch"])
                save_tree(self.frames_dir, self.blocks, watched)
                self.watch.add(watched)
            self.times.append(took)
            self.tokens.append(float(np.asarray(host.spent["tokens"]).sum() - before))
            self.useful.append(float(np.asarray(host.stats["tokens"]).sum() - useful_before))
            lengths = np.asarray(host.carry.tokens)
            for e, r in enumerate(np.asarray(host.carry.last_reply)):
                if len(self.replies[e]) < REPLIES_KEPT and not bool(host.done[e]):
                    self.replies[e].append(self.player.text(r[:int(lengths[e])]))
            self.blocks += 1
            self.host = host
            save_state(self.saved, host, self.meta())
        return (f"  {min(int(host.t), self.cap):,} steps: {int(np.asarray(host.done).sum())}/"
                f"{self.c.episodes} episodes ended, {self.tokens[-1] / took:,.0f} tokens/s"
                + ("  (incl. compile)" if len(self.times) == 1 else ""))

    def stopped(self) -> str:
        if not self.blocks:
            return (f"interrupted before the first block of {self.c.block_steps} steps ended: "
                    f"nothing played yet; start again with `{self.resume_command}`")
        out = self.results(partial=True)
        self.write_replies()
        if self.c.record:
            out["record"] = {"data": self.c.record, **self.write_recording(partial=True)}
        atomic_write_json(self.run / "eval.json", out)
        return (f"interrupted after {out['steps_played']:,} steps: {out['episodes']} of "
                f"{self.c.episodes} episodes finished, kept in {self.run / 'eval.json'} "
                f"(partial); go on with `{self.resume_command}`")

    # --- what a play writes ---------------------------------------------------------------------

    def results(self, partial: bool) -> dict:
        """eval.json's contents from the blocks played (partial: of the finished episodes)."""
        c, state = self.c, self.host
        done = np.asarray(state.done)
        out = summarise(state, self.env.achievement_names, c.max_steps,
                        only=done if partial else None)
        steps = float(np.asarray(state.length).sum())
        first_timed = 1 if len(self.times) > 1 else 0  # the first block compiles
        secs = sum(self.times[first_timed:])
        out.update(
            run=str(self.run), seed=c.seed, env=c.env.name,
            seconds=self.seconds_before + sum(self.times), policy="llm", command=self.command,
            llm={"weights": c.llm.weights, "random_model": None if c.llm.weights else
                 c.llm.random_model, "dtype": self.player.dtype, "history": c.history,
                 "max_new_tokens": c.max_new_tokens, "thinking": c.thinking,
                 "shots": c.shots, "examples": c.examples,
                 "sampling": self.player.sampling.record()},
            tokens_generated=int(np.asarray(state.spent["tokens"]).sum()),
            useful_tokens=int(np.asarray(state.stats["tokens"]).sum()),
            tokens_per_s=sum(self.tokens[first_timed:]) / max(secs, 1e-9),
            useful_tokens_per_s=sum(self.useful[first_timed:]) / max(secs, 1e-9),
            tokens_per_s_includes_compile=first_timed == 0,
            tokens_per_step=float(np.asarray(state.stats["tokens"]).sum()) / max(steps, 1),
            invalid_action_rate=float(np.asarray(state.stats["invalid"]).sum()) / max(steps, 1),
            unfinished_thought_rate=float(np.asarray(state.stats["unfinished"]).sum())
            / max(steps, 1))
        if partial:
            out.update(partial=True, steps_played=min(int(state.t), c.max_steps or 10 ** 9),
                       episodes_total=c.episodes, episodes_running=int((~done).sum()),
                       resume=self.resume_command)
        return out

    def write_replies(self) -> None:
        atomic_write_json(self.run / "replies.json", {"every_steps": self.c.block_steps,
                                                      "replies": self.replies})

    def write_recording(self, partial: bool) -> dict:
        """The recorded episodes as a dataset at --record (partial: the finished ones,
        marked)."""
        c = self.c
        episodes = episodes_of([r for r, _ in self.records], [a for _, a in self.records])
        if partial:
            done = np.asarray(self.host.done)
            episodes = [e for i, e in enumerate(episodes) if done[i]]
        return write_played(Path(c.record).expanduser(), c.env.name, episodes,
                            {"policy": "llm", "played": config_io.to_dict(
                                dataclasses.replace(c, resume=None)), "command": self.command,
                             "partial": partial, "run": str(self.run)}, c.shard_rows)

    def finish(self, console) -> dict:
        """Every output of the finished play; eval.json's contents."""
        c = self.c
        out = self.results(partial=False)
        if c.resume:
            out["resumed"] = self.resume_command
        self.write_replies()
        if c.record:
            counts = self.write_recording(partial=False)
            out["record"] = {"data": str(Path(c.record).expanduser()), **counts}
            console.print(f"recorded {counts['episodes_kept']} episodes, {counts['rows']:,} rows "
                          f"-> {out['record']['data']}")
        atomic_write_json(self.run / "eval.json", out)
        if c.plot and out["achievements"]:
            plot_achievements(out, self.run / "eval_achievements.png")
        if c.video:
            gamma, source = ((self.video_gamma, "--video-gamma") if self.video_gamma is not None
                             else (DEFAULT_GAMMA, "default"))
            out["videos"] = [str(p) for p in write_videos(self.watch.episodes, self.run / "videos",
                                                          gamma, source, critic=False)]
            out["video_gamma"] = gamma
            atomic_write_json(self.run / "eval.json", out)
            console.print(f"{len(out['videos'])} videos -> {self.run / 'videos'}")
        return out
