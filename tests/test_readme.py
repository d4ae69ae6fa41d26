"""The README's dataset and offline walkthrough, run as written (commands extracted from its code
blocks, so the README cannot drift from what works), at smoke scale: flags appended to shrink
sizes (a later flag overrides an earlier one), and the two machine-specific values replaced: the
weights folder (a tiny random Qwen3 built here) and its layer. `runs/RUN` is a `train.py smoke`
run made first, as the quick start makes one."""

import re
import shlex
import subprocess
import sys

import pytest

from conftest import ROOT, subprocess_env

SECTIONS = ("## Datasets and labels", "## Offline RL and evaluation")

# Appended to the README's command whose words start with the key (the most specific match).
# Training and evaluation sizes match the smoke preset and one another, so the study's runs and
# evaluations reuse the programs the earlier commands compiled (persistent cache).
TRAIN = ["--num-updates", "100", "--updates-per-chunk", "50", "--checkpoint-every-updates", "50",
         "--batch-size", "64", "--policy.layer-width", "32"]
EVAL = ["--episodes", "2", "--max-steps", "30"]
GENERATE = ["--num-envs", "8", "--steps", "64", "--env.max-episode-steps", "16",
            "--block-steps", "16", "--shard-rows", "100"]
SMOKE = {
    ("label.py", "generate"): GENERATE,
    ("label.py", "generate", "--out", "data/ppo"): GENERATE + ["--min-return", "0"],  # weak policy
    ("label.py", "label"): ["--batch", "16"],
    ("offline.py", "awr"): TRAIN,
    ("offline.py", "awr", "--resume"): ["--num-updates", "150"],
    ("offline.py", "bc"): TRAIN,
    ("offline.py", "eval"): EVAL,
    ("offline.py", "eval", "--run", "runs/awr-l24", "--video"): EVAL + [
        "--video", "1", "--video-max-steps", "5"],
    ("offline.py", "probe"): ["--states", "6", "--warmup", "4", "--eval-episodes", "2",
                              "--eval-max-steps", "30"],
    ("offline.py", "study"): ["--preset", "smoke", "--num-updates", "100", "--seeds", "1",
                              "--episodes", "2", "--max-steps", "30"],
}


def readme_commands() -> list[list[str]]:
    """Every `python ...` command of the README's sections above, continuation lines joined,
    comments and `--help` lines dropped."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for title in SECTIONS:
        section = text[text.index(title):]
        block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["python"] and "--help" not in words:
                commands.append(words[1:])
    return commands


def smoke_args(words: list[str]) -> list[str]:
    keys = [k for k in SMOKE if tuple(words[:len(k)]) == k or (
        k[:2] == tuple(words[:2]) and all(w in words for w in k[2:]))]
    return SMOKE[max(keys, key=len)] if keys else []


@pytest.mark.slow
def test_readme_walkthrough_runs_as_written(tmp_path):
    from qwen_fixtures import build_tiny_qwen3

    weights = tmp_path / "Qwen3-tiny"
    build_tiny_qwen3(weights, layers=3, vocab=151_680)
    env = subprocess_env()

    def run(words):
        p = subprocess.run([sys.executable, *words], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=900)
        assert p.returncode == 0, (" ".join(words), p.stdout[-2000:], p.stderr[-3000:])
        return p

    run([str(ROOT / "train.py"), "smoke", "--out-dir", "runs", "--run-name", "RUN"])
    commands = readme_commands()
    tools = {tuple(w[:2]) for w in commands}
    assert {("label.py", "generate"), ("label.py", "label"), ("label.py", "returns"),
            ("offline.py", "awr"), ("offline.py", "eval"), ("offline.py", "probe"),
            ("offline.py", "study")} <= tools, tools
    for words in commands:
        words = [str(weights) if w.endswith("/models/Qwen3-4B") else w for w in words]
        words = [("2" if prev == "--llm.layer" else w) for prev, w in zip([""] + words, words)]
        run([str(ROOT / words[0]), *words[1:], *smoke_args(words)])
    assert (tmp_path / "runs/awr-l24/eval.json").is_file()
    assert list((tmp_path / "runs/awr-l24/videos").glob("*.gif"))
    assert (tmp_path / "runs/awr-l24/probe.json").is_file()
    assert (tmp_path / "runs/study/study.json").is_file()


def help_text(*words) -> str:
    p = subprocess.run([sys.executable, str(ROOT / words[0]), *words[1:], "--help"],
                       env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", p.stdout).split())  # rich's box, spaces folded


@pytest.mark.parametrize("words, flags, absent", [
    (("train.py",), ["--ppo.num-steps INT", "--env.num-envs INT", "--resume"], []),
    (("label.py", "generate"), ["--shard-rows INT", "(default: 8192)", "--min-return"], []),
    (("offline.py", "awr"), ["--data STR", "(required)", "--labels", "--device-rows"],
     ["--algo"]),
    (("offline.py", "eval"), ["--run STR", "(required)", "--video INT"], []),
])
def test_help_lists_every_flag_as_paragraphs(words, flags, absent):
    """Without a preset, --help names the presets and lists every flag with the default
    preset's values; usage names the subcommand; docstrings read as sentences (tyro kept the
    source's line breaks); flags a command ignores are not offered."""
    text = help_text(*words)
    assert f"usage: {' '.join(words)}" in text
    for flag in flags:
        assert flag in text, flag
    for flag in absent:
        assert flag not in text, flag
    if words[0] != "offline.py" or words[1] != "eval":
        assert "presets (name one first; default cpu): cpu:" in text
    # a docstring's lines joined: no line break before a continuation line's first word
    raw = subprocess.run([sys.executable, str(ROOT / words[0]), *words[1:], "--help"],
                         env=subprocess_env(), capture_output=True, text=True).stdout
    lines = [re.sub(r"[│╭╮╰╯─]", "", x).strip() for x in raw.splitlines()]
    short = [x for x, nxt in zip(lines, lines[1:])
             if x and nxt and not x.startswith("-") and len(x) < 40 and nxt[0].islower()
             and not x.endswith((".", ":"))]
    assert not short, short[:3]
