"""Every command in the README and the manual (docs/*.md) against the code: each command line of
their fenced bash blocks is parsed by its command's own parser (train.py, label.py, offline.py,
play.py, `python -m llm_jax`, `python -m fused.text.render`), a benchmark's or script's flags are
looked up in its --help or its source, and test files and scripts named exist. A documented flag
renamed in the code, or a command whose page names a flag it does not have, fails here; the
walkthroughs that run the commands at smoke sizes are tests/test_readme*.py."""

from __future__ import annotations

import re
import shlex
import sys

import pytest

from command_runner import run_command
from conftest import ROOT, subprocess_env

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands_of(text: str) -> list[list[str]]:
    """The command lines of a page's ```bash blocks: continuations joined, comments dropped,
    `a && b` as two commands, `srun` and `cd` left out."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.lstrip().startswith("#"):
                continue
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                command, words = words[:cut], words[cut + 1:]
                if command[:1] == ["srun"]:
                    command = command[1:]
                if command:
                    out.append(command)
    return out


def documented() -> list[tuple[str, list[str]]]:
    return [(p.relative_to(ROOT).as_posix(), c) for p in PAGES for c in commands_of(p.read_text())]


def without_resume(argv: list[str]) -> tuple[list[str], bool]:
    """argv without `--resume RUN` (a run folder the page names, not here), and whether it had
    one: the other flags are parsed against the command's config."""
    if "--resume" not in argv:
        return argv, False
    i = argv.index("--resume")
    return argv[:i] + argv[i + 2:], True


def parse_train(argv):
    from fused.commands.train import DEFAULT_PRESET, DESCRIPTION, PRESETS, TrainConfig
    from fused.runs import config_io

    rest, resumed = without_resume(argv)
    if resumed:
        return config_io.cli(TrainConfig, [a for a in rest if not a.startswith("--plan")])
    if "--plan" in rest:  # (the card after it is the planner's, not the config's)
        i = rest.index("--plan")
        rest = rest[:i] + rest[i + 2:]
    return config_io.parse(TrainConfig, PRESETS, DEFAULT_PRESET, rest, DESCRIPTION)


def parse_label(argv):
    from fused.commands.label import parse

    return parse(argv)


def parse_offline(argv):
    from fused.commands import offline
    from fused.commands.offline_eval import EvalConfig
    from fused.commands.offline_probe import ProbeConfig
    from fused.commands.offline_study import StudyConfig
    from fused.commands.offline_train import OfflineConfig
    from fused.runs import config_io

    cmd, rest = argv[0], argv[1:]
    if cmd in ("awr", "bc"):
        rest, resumed = without_resume(rest)
        return (config_io.cli(OfflineConfig, rest) if resumed
                else offline.parse_train(cmd, rest))
    cls = {"eval": EvalConfig, "probe": ProbeConfig, "study": StudyConfig}[cmd]
    return config_io.cli(cls, rest)


def parse_play(argv):
    from fused.commands.human import HumanConfig
    from fused.commands.play import PlayConfig
    from fused.runs import config_io

    rest, _ = without_resume(argv[1:])
    return config_io.cli({"llm": PlayConfig, "human": HumanConfig}[argv[0]], rest)


def parse_module(argv):
    if argv[0] == "llm_jax":
        from llm_jax.__main__ import parse

        return parse(argv[1:])
    if argv[0] == "fused.text.render":
        import tyro

        from fused.text.render import Check

        assert argv[1] == "check", argv
        return tyro.cli(Check, args=argv[2:])
    if argv[0] == "pytest":
        for word in argv[1:]:
            if word.startswith("tests/"):
                assert (ROOT / word.split("::")[0]).is_file(), word
        return argv
    raise AssertionError(f"no parser for python -m {argv[0]}")


PARSERS = {"train.py": parse_train, "label.py": parse_label, "offline.py": parse_offline,
           "play.py": parse_play}


def flags(words: list[str]) -> list[str]:
    return [w.split("=")[0] for w in words if w.startswith("--")]


_HELP: dict[str, str] = {}


def help_of(script: str) -> str:
    if script not in _HELP:
        p = run_command([sys.executable, str(ROOT / script), "--help"], cwd=ROOT,
                        env=subprocess_env(), capture_output=True, text=True, timeout=300)
        _HELP[script] = p.stdout + p.stderr
    return _HELP[script]


def check(words: list[str]) -> None:
    """Raises (AssertionError, SystemExit) where `words` cannot run as the page says."""
    if words[0] == "pip":
        assert words[1] == "install", words
        return
    if words[0] == "bash":
        script = ROOT / words[1]
        assert script.is_file(), words[1]
        known = script.read_text()
        if words[1] == "scripts/gpu_check.sh":  # (its flags after OUT are bench/gpu_check.py's)
            known += help_of("bench/gpu_check.py")
        for flag in flags(words[2:]):
            assert flag in known, f"{words[1]} has no {flag}"
        return
    assert words[0] == "python", words
    words = [w for w in words if w not in ("-h", "--help")]  # (the rest still parses)
    if words[1] == "-m":
        parse_module(words[2:])
        return
    script = words[1]
    if script in PARSERS:
        from fused.errors import ConfigError

        try:
            PARSERS[script](words[2:])
        except SystemExit as e:  # tyro's one line
            raise AssertionError(f"{' '.join(words)}: {e.code}") from None
        except ConfigError as e:  # a preset that is not one
            raise AssertionError(f"{' '.join(words)}: {e}") from None
        return
    assert script.startswith("bench/") and (ROOT / script).is_file(), script
    text = help_of(script)
    for flag in flags(words[2:]):
        assert flag in text or flag.replace("-", "_") in text, f"{script} has no {flag}"


def test_every_page_has_commands_and_every_command_parses():
    """Every command line of the README and docs/*.md (the checks above, in one process: the
    parsers are in-process calls; benchmarks' --help once each)."""
    found = documented()
    pages = {p for p, _ in found}
    assert {"README.md", "docs/training.md", "docs/datasets.md", "docs/offline.md",
            "docs/llm.md", "docs/human.md", "docs/gpu.md", "docs/development.md"} <= pages, pages
    failures = []
    for page, words in found:
        try:
            check(words)
        except (AssertionError, SystemExit, KeyError) as e:
            failures.append(f"{page}: {' '.join(words)}\n    {e}")
    assert not failures, "\n".join(failures)


def test_a_renamed_flag_or_an_unknown_command_fails():
    """The check fails on what a page could get wrong: a flag the command does not have (as after
    a rename), a preset that is not one, a benchmark flag, a test file that is not there."""
    for line in ("python train.py cpu --ppo.num-step 8", "python train.py cpux",
                 "python label.py returns --data d --gama 0.9",
                 "python offline.py eval --run r --episode 4",
                 "python play.py llm --llm.weight w", "python -m llm_jax encode --weight w",
                 "python -m pytest tests/test_nothing_here.py"):
        with pytest.raises((AssertionError, SystemExit)):
            check(shlex.split(line))
    check(shlex.split("python train.py cpu --ppo.num-steps 8"))


def test_the_readme_is_a_first_screen():
    """README.md at most 200 lines, its quick start the two commands, its links to pages that
    exist (and to sections of BENCHMARKS.md that exist)."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    quick = text[text.index("## Quick start"):]
    blocks = re.findall(r"```bash\n(.*?)```", quick, re.S)[:2]
    assert blocks == ["pip install -e . && python train.py\n",
                      'pip install -e ".[test]" && python -m pytest -q -n auto --dist loadscope\n']
    headings = {slug(h) for h in re.findall(r"^## (.+)$", (ROOT / "docs/BENCHMARKS.md")
                                            .read_text(), re.M)}
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#]+\.md)(#[^)]+)?\)", page.read_text()):
            path = (page.parent / target[0]).resolve()
            assert path.is_file(), (page.name, target)
            if target[1] and path.name == "BENCHMARKS.md":
                assert target[1][1:] in headings, (page.name, target)


def test_the_quick_starts_figures_are_the_measured_ones():
    """The quick start's "mean return rises from about A to about B" agrees with the learning
    table of BENCHMARKS (the cpu preset's first and last 10% of updates, mean of its seeds)."""
    first, last = map(float, re.search(r"rises from about (\d+(?:\.\d+)?) to\s+about (\d+(?:\.\d+)?)",
                                       (ROOT / "README.md").read_text()).groups())
    row = re.search(r"^\| `cpu` \(819,200 steps\) \| ([^|]+) \| ([^|]+) \|$",
                    (ROOT / "docs/BENCHMARKS.md").read_text(), re.M)
    measured = [sum(map(float, g.split("/"))) / 3 for g in row.groups()]
    assert abs(first - measured[0]) < 0.25 and abs(last - measured[1]) < 0.1, (first, last,
                                                                                  measured)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
