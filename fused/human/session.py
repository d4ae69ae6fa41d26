"""A person's session: the game, its recorder and, with `--examples`, the golden examples the
prior system's recorder wrote (`E/game_<time>/steps.jsonl`: per step the text observation the
LLM would read, the action taken, the reward, and the frame as a PNG beside it). The page and
`--script` both play through `press`, so a script records exactly what the page would."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from fused.human.game import Game
from fused.human.keys import key_name
from fused.human.recorder import Recorder
from fused.runs.files import atomic_write


class Session:
    def __init__(self, game: Game, recorder: Recorder, examples: str | Path | None = None,
                 say=print):
        self.game, self.recorder, self.say = game, recorder, say
        self.lock = threading.Lock()
        self.message = ""  # the last thing that happened, for the page
        self.broken: str | None = None  # a write failed: no more steps
        self.examples = None
        if examples is not None:
            for p in Path(examples).glob("game_*/.*.tmp*"):  # a frame cut by a kill
                p.unlink()
            self.examples = Path(examples) / time.strftime("game_%Y%m%d-%H%M%S")
            k = 1
            while self.examples.exists():  # two sessions in one second
                self.examples = Path(examples) / (time.strftime("game_%Y%m%d-%H%M%S") + f"-{k}")
                k += 1
            self.example_count = 0  # (the folder is made at the first step played)

    def press(self, raw: str) -> bool:
        """One key: a step if it is a game key (True), nothing otherwise. After an episode
        ended, any key starts the next one (at the next seed) without a step."""
        key = key_name(raw)
        with self.lock:
            if self.broken:
                raise OSError(self.broken)
            if self.game.over:
                self.recorder.next_episode()
                self.message = (f"episode {self.recorder.episode_id} begins (seed "
                                f"{self.game.seed})")
                return False
            action = self.game.action_of(key)
            if action is None:
                self.message = f"{key!r} is not a game key"
                return False
            text = self.game.text() if self.examples else None
            frame = self.game.frame_png() if self.examples else None
            try:
                row = self.recorder.step(action)
                if self.examples:
                    self._example(text, frame, row)
            except OSError as e:
                self.broken = f"recording failed: {e}; steps are no longer recorded: stop " \
                              "the server (everything before this step is kept)"
                self.say(self.broken)
                raise OSError(self.broken) from None
            name = self.game.action_names[action]
            r = float(row["reward"][0])
            self.message = f"{key} -> {name}" + (f", reward {r:+.1f}" if r else "")
            if self.game.over:
                why = "ended (died or won)" if bool(row["terminated"][0]) else "reached its limit"
                self.message = (f"episode {self.recorder.episode_id} {why}: return "
                                f"{self.game.episode_return:.1f}; any key starts the next")
                self.say(self.message)
            return True

    def new_game(self, seed: int) -> None:
        with self.lock:
            if self.broken:
                raise OSError(self.broken)
            self.recorder.new_game(seed)
            self.message = f"new game: episode {self.recorder.episode_id}, seed {seed}"
            self.say(self.message)

    def _example(self, text: str, frame: bytes, row: dict) -> None:
        k = self.example_count
        self.examples.mkdir(parents=True, exist_ok=True)
        png = f"frame_{k:06d}.png"
        atomic_write(self.examples / png, frame)
        line = {"env": self.game.name, "step": int(row["step"][0]), "episode_id": int(row["episode_id"][0]),
                "observation": text, "action": int(row["action"][0]),
                "action_name": self.game.action_names[int(row["action"][0])],
                "reward": float(row["reward"][0]), "done": bool(row["terminated"][0]
                                                                 or row["truncated"][0]),
                "frame": png}
        with open(self.examples / "steps.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        self.example_count += 1

    def view(self) -> dict:
        with self.lock:
            v = self.game.view()
            v.update(frame_png=self.game.frame_png(), episode_id=self.recorder.episode_id,
                     rows=self.recorder.t, message=self.broken or self.message,
                     keys={k: self.game.action_names[a] for k, a in self.game.keys.items()},
                     data=str(self.recorder.ds.root))
            return v
