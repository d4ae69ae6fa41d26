"""Golden examples (the prior system's layout, written by `play.py human --examples E`):
E/game_<time>/steps.jsonl, a line per step: {"env", "step", "episode_id", "observation" (the
text the LLM reads), "action", "action_name", "reward", "done", "frame"} with frame_<k>.png
beside it. `shots` picks few-shot turns for `play.py llm --examples E --shots N`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fused.envspec import SPECS
from fused.errors import ConfigError
from fused.human.game import text_twin
from fused.text.prompt import shot_reply
from fused.runs.invocation import command


def read_steps(folder: str | Path) -> list[dict]:
    """Every step of every game under `folder`, games in name (time) order; a line cut by a
    kill (the last of a file) is skipped."""
    root = Path(folder).expanduser()
    games = sorted(p for p in root.glob("game_*") if (p / "steps.jsonl").is_file())
    if not games:
        raise ConfigError(f"--examples {root}: no golden examples (game_*/steps.jsonl); record "
                          f"some with `{command('play.py')} human --out DATA --examples {root}`")
    out = []
    for g in games:
        for i, line in enumerate((g / "steps.jsonl").read_text().splitlines()):
            try:
                step = json.loads(line)
            except ValueError:
                continue
            if not isinstance(step, dict) or not {"env", "observation", "action",
                                                   "action_name"} <= set(step):
                continue  # not a step this format writes (another tool's line)
            out.append(dict(step, game=g.name, line=i))
    return out


def shots(folder: str | Path, n: int, env_name: str) -> tuple[list[tuple[str, str]], list]:
    """`n` (observation, reply) few-shot turns of `env_name`'s game (a text env and its pixel
    twin read the same text, so either's steps serve either): steps whose action is not NOOP,
    evenly spaced over everything recorded (first and last included), oldest first. Returns
    them and where each came from ([game, line])."""
    steps = [s for s in read_steps(folder)
             if s["env"] in SPECS and text_twin(s["env"]) == text_twin(env_name)]
    steps = [s for s in steps if s["action_name"] != "NOOP"]
    if len(steps) < n:
        raise ConfigError(f"--shots {n}: {Path(folder).expanduser()} holds {len(steps)} golden "
                          f"steps of {env_name} other than NOOP; record more with `python "
                          f"play.py human --env.name {env_name} --examples ...` or ask fewer")
    picked = [steps[int(i)] for i in np.round(np.linspace(0, len(steps) - 1, n))] if n else []
    return ([(s["observation"], shot_reply(f"{s['action']}:{s['action_name']}"))
             for s in picked], [[s["game"], s["line"]] for s in picked])
