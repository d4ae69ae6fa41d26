"""`play.py human`: a person plays Craftax on a local web page, every step recorded.

    python play.py human --out data/human [--env.name Craftax-Symbolic-v1] [--seed 0]
                         [--port 8765] [--host 127.0.0.1] [--examples golden]
    python play.py human --script keys.txt --out data/human    # no browser: a file of keys

The page (open the printed URL; over SSH forward the port: `ssh -L 8765:localhost:8765 ...`)
shows the frame, the text observation exactly as the LLM reads it, inventory, health bars,
achievements, floor and the key map; keys are Craftax's own (w a s d move, space do, tab sleep,
1-8 craft, t table, ...). Each step is written to the dataset at --out (label.py's format:
`label.py verify|returns|label` and `offline.py bc|awr|eval` take it) before the page shows it:
closing the tab, Ctrl-C, a kill or a lost connection loses at most the step being taken, and
the same command goes on with the same dataset and game. `--examples E` also writes the prior
system's golden examples (E/game_<time>/steps.jsonl with a PNG per step) for `play.py llm
--examples E`.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path

from rich.console import Console

from fused.commands import process
from fused.envspec import spec
from fused.errors import ConfigError
from fused.human.game import Game
from fused.human.keys import key_map, key_name
from fused.human.recorder import Recorder, check_out
from fused.human.server import Server
from fused.human.session import Session
from fused.rl.config import GameSettings
from fused.runs import config_io
from fused.runs.blocks import run_blocks
from fused.runs.files import require_writable
from fused.runs.interrupts import Flag, exit_now, on_signals, say

DESCRIPTION = ("You play Craftax on a local web page (or from a --script of keys); every step is "
               "recorded into a label.py dataset at --out.")
@dataclasses.dataclass(frozen=True)
class HumanConfig:
    out: str
    """The dataset the play is recorded into: a new folder, or one this command recorded
    before (it goes on: same env, the game where it stood)."""
    env: GameSettings = GameSettings(name="Craftax-Classic-Symbolic-v1")
    """The game, a Craftax env; the dataset stores its observations (a pixel env's: its
    frames)."""
    seed: int = 0
    """The first new game's world seed (each next episode: one more); a reopened dataset
    goes on with its own game. The page's seed field starts another."""
    host: str = "127.0.0.1"
    """Address the page is served on. 127.0.0.1: this machine only (forward the port over
    SSH); 0.0.0.0 widens it to every network this machine is on: anyone who reaches the port
    plays and records."""
    port: int = 8765
    """Port of the page."""
    script: str | None = None
    """Play the keys in this file (one key name a line, any case: d, space or a single space,
    tab, ',', ...; empty lines and lines starting with # are skipped) instead of serving the
    page; records exactly what the page would: after an episode ends, the next key starts the
    next episode and takes no step."""
    examples: str | None = None
    """Also write golden examples (E/game_<time>/steps.jsonl and a PNG per step) into E."""
    shard_rows: int = 1024
    """Rows per shard at most (a shard is also written when an episode ends and at exit)."""
    block_pixels: int = 16
    """Pixels per block of the frame the page shows."""


def read_script(path: str, keys: dict) -> list[str]:
    """The key names of a --script file; one line naming the first bad one."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"--script {p}: no such file")
    out = []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line or (line.strip() and line.lstrip().startswith("#")):
            continue  # (a line of one space is the space key; other blank lines are errors)
        k = key_name(line)
        if k not in keys:
            raise ConfigError(f"--script {p}, line {i}: {line!r} is not a key of this game; "
                              f"the keys: {' '.join(keys)}")
        out.append(k)
    return out


def validate(c: HumanConfig) -> None:
    if c.shard_rows <= 0 or c.block_pixels <= 0:
        raise ConfigError("--shard-rows and --block-pixels must be positive")
    if not 0 <= c.port < 65536:
        raise ConfigError(f"--port {c.port}: a port from 0 to 65535")
    if spec(c.env.name).family == "probe":
        raise ConfigError(f"--env.name {c.env.name}: a test env has no game to show; a person "
                          "plays a Craftax env (Craftax-Classic-Symbolic-v1, Craftax-Symbolic-v1 "
                          "or their Pixels)")
    if c.env.max_episode_steps is not None and c.env.max_episode_steps <= 0:
        raise ConfigError("--env.max-episode-steps must be positive")
    require_writable(Path(c.out).expanduser(), "--out")
    if c.examples:
        out, ex = Path(c.out).expanduser().resolve(), Path(c.examples).expanduser().resolve()
        if ex == out or out in ex.parents:
            raise ConfigError(f"--examples {c.examples} lies inside the dataset --out {c.out}: "
                              "give golden examples a folder of their own")
        require_writable(Path(c.examples).expanduser(), "--examples")


def run(c: HumanConfig, command: str, console: Console) -> dict:
    validate(c)
    script = read_script(c.script, key_map(c.env.name)) if c.script else None
    card = check_out(c.out, c.env.name, c.env.max_episode_steps)  # before textures / compiles
    kept = (card or {}).get("human", {})  # (a recording older than the kept length: the flag)
    max_steps = (kept["max_episode_steps"] if "max_episode_steps" in kept
                 else c.env.max_episode_steps)
    server = None
    if script is None:  # the port first: a port in use ends here, before anything compiles
        try:
            server = Server(c.host, c.port, None)
        except OSError as e:
            raise ConfigError(f"cannot serve on {c.host}:{c.port} ({e.strerror or e}): another "
                              "program holds the port; pass another --port") from None
    try:
        game = Game(c.env.name, max_steps, c.block_pixels)
        if STOP.is_set():
            _starting_stopped(console)
        rec = Recorder(c.out, game, c.seed, command, c.shard_rows)
    except BaseException:
        if server is not None:
            server.server_close()
        raise
    say = console.print
    how = (f"going on with episode {rec.episode_id} (seed {game.seed}) at step "
           f"{int(game.state.timestep)}" if rec.resumed
           else f"episode {rec.episode_id}, seed {game.seed}")
    console.print(f"[bold]craftax-fused play human[/] {c.env.name}: {how}; "
                  f"{rec.t:,} rows recorded in {rec.ds.root}")
    session = Session(game, rec, Path(c.examples).expanduser() if c.examples else None, say)
    play = Play(session, script, server)
    try:
        if server is not None:
            server.session = session
            session.view()  # compile the display and a step before the first visit
            game.warm()
            if not STOP.is_set():
                console.print(f"open {server.url()} (Ctrl-C stops; everything played is kept)")
                sys.stdout.flush()
        if STOP.is_set():  # (while compiling: Ctrl-C ends the session as it would the page)
            with session.lock:
                console.print("\n" + play.stopped())
            exit_now(0)
        # a stop commits what was played, says so in one line and exits 0 (it is how a person
        # ends a session)
        run_blocks(play, console, stop=STOP, status=0)
    finally:
        play.close()
    if script is not None:
        console.print(f"played {len(script)} keys ({play.steps} steps)")
    console.print(play.summary())
    return rec.ds.card()["counts"]


class Play:
    """A session as a block job (`fused.runs.blocks`): a block is one key of the script, or a
    wait of at most 0.2 s for the page's next request (answered in a thread of its own, which
    steps under the session's lock, the job's). Each step's row is journaled whole as it is
    taken (`Recorder.step`); a stop waits for the step under way, then stops serving and
    commits the journal into the dataset."""

    def __init__(self, session: Session, script: list[str] | None, server: Server | None):
        self.session, self.server = session, server
        self.keys = None if script is None else iter(script)
        self.left = script is not None and len(script) > 0
        self.lock = session.lock
        self.steps = 0
        self.script = script
        if server is not None:
            server.timeout = 0.2  # (handle_request waits this long for a request)

    def pending(self) -> bool:
        return self.server is not None or self.left

    def run_block(self) -> None:
        if self.server is not None:
            self.server.handle_request()
            return
        key = next(self.keys, None)
        if key is None:
            self.left = False
        else:
            self.steps += self.session.press(key)

    def close(self) -> None:
        """Stops serving; what waits in the journal committed; the dataset released."""
        with self.session.lock:  # (a step under way is taken first)
            self._end()

    def _end(self) -> None:
        # (called under the session's lock: closing joins no handler thread waiting for it, as
        # the server's are daemon threads)
        if self.server is not None:
            self.server.server_close()
        self.session.broken = "the server is stopping: nothing more is recorded"  # (a request
        # still under way is refused)
        self.session.recorder.close()

    def summary(self) -> str:
        rec, examples = self.session.recorder, self.session.examples
        counts = rec.ds.card()["counts"]
        return (f"{counts['rows']:,} rows, {counts.get('episodes', 0)} episodes in {rec.ds.root}"
                + (f"; golden examples in {examples}" if examples else ""))

    def stopped(self) -> str:
        """(Called under the session's lock.)"""
        self._end()
        played = ("" if self.script is None else
                  f"{self.steps:,} steps played from the script's keys; ")
        return "stopping: " + played + self.summary()


# Ctrl-C and SIGTERM set STOP (checked between the steps of starting, then by `run_blocks`
# while the session runs), rather than raising wherever the signal lands: a KeyboardInterrupt
# raised inside a library's import or texture loading was swallowed there, and the server went
# on serving.
STOP = Flag()


def _on_signal(signum: int) -> None:
    if STOP.is_set():  # a second Ctrl-C: say what is happening (stopping is not cut short)
        say("still stopping: committing what was played (every step the page showed is "
            "already on disk; a kill loses none of it)\n")
    STOP.set()


def _starting_stopped(console) -> None:
    console.print("\ninterrupted while starting: nothing recorded; run the same command again")
    exit_now(130)


def main(argv: list[str], prog: str) -> dict:
    console = Console(soft_wrap=True)
    c = config_io.cli(HumanConfig, argv, DESCRIPTION, f"{prog} human")
    STOP.clear()
    # what waits is committed on the way out; (called in process, by tests: the caller's
    # handlers back after)
    with on_signals(_on_signal):
        process.setup_compilation_cache()
        return run(c, f"{prog} human " + shlex.join(argv), console)
