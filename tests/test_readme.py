"""The manual's dataset, offline and LLM-play walkthrough, run as written (commands extracted from
the code blocks of docs/datasets.md, docs/offline.md and docs/llm.md, so the pages cannot drift
from what works), at smoke scale: flags appended to shrink sizes (a later flag overrides an
earlier one), and the two machine-specific values replaced: the weights folder (a tiny random
Qwen3 built here) and its layer. `runs/RUN` is a `train.py smoke` run, as the quick start makes
one (conftest's, shared by the tests that read one). Every other documented command is parsed
against its command's flags in tests/test_docs.py."""

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from command_runner import run_command
from conftest import LENGTHS, ROOT, console_script, subprocess_env

PAGES = ("docs/datasets.md", "docs/offline.md", "docs/llm.md")  # in the walkthrough's order

# Appended to the README's command whose words start with the key (the most specific match).
# Training and evaluation sizes match the smoke preset and one another, so the study's runs and
# evaluations reuse the programs the earlier commands compiled (persistent cache).
TRAIN = ["--num-updates", "100", "--updates-per-chunk", "50", "--checkpoint-every-updates", "50",
         "--batch-size", "64", "--policy.layer-width", "32"]
EVAL = ["--episodes", "2", "--max-steps", "30"]
GENERATE = ["--num-envs", "8", "--steps", "64", "--env.max-episode-steps", "16",
            "--block-steps", "16", "--shard-rows", "100"]
PIXELS = ["--updates-per-chunk", "2", "--checkpoint-every-updates", "2", "--policy.layer-width",
          "32", "--no-plot"]
SMOKE = {
    ("train.py", "cpu-pixels"): PIXELS + ["--env.num-envs", "8", "--ppo.num-steps", "4",
                                          "--ppo.update-epochs", "1", "--ppo.num-minibatches", "2",
                                          "--total-timesteps", "64"],
    ("offline.py", "awr", "cpu-pixels"): PIXELS + ["--num-updates", "4", "--batch-size", "16",
                                                   "--device-rows", "200"],
    ("label.py", "generate"): GENERATE,
    # (the program of test_label's SMOKE datasets and shared_data's: cut at 20, a pool of 2)
    ("label.py", "generate", "--out", "data/rand"): GENERATE + [
        "--env.max-episode-steps", "20", "--env.reset-pool", "2"],
    # (test_label's generate from the smoke run, epsilon 0.05 too, reads this program)
    ("label.py", "generate", "--out", "data/ppo"): GENERATE + ["--min-return", "0"],  # weak policy
    ("label.py", "label"): ["--batch", "16", *LENGTHS],  # (conftest's LENGTHS: two lengths)
    ("label.py", "label", "--imagine.tokens"): ["--batch", "16", "--imagine.tokens", "6"],
    ("offline.py", "awr"): TRAIN,
    ("offline.py", "awr", "--resume"): ["--num-updates", "150"],
    ("offline.py", "bc"): TRAIN,
    ("offline.py", "eval"): EVAL,
    ("offline.py", "eval", "--run", "runs/awr-l24", "--video"): EVAL + [
        "--video", "1", "--video-max-steps", "5"],
    ("offline.py", "probe"): ["--states", "6", "--warmup", "4", "--eval-episodes", "2",
                              "--eval-max-steps", "30"],
    ("offline.py", "study"): ["--preset", "smoke", "--num-updates", "100", "--seeds", "1",
                              "--episodes", "2", "--max-steps", "30", "--algos", "awr"],
    ("play.py", "llm"): ["--episodes", "2", "--max-steps", "4", "--block-steps", "2",
                         "--max-new-tokens", "4", "--video-max-steps", "2"],
    # (the random model's play as tests/test_player.py records it: the same program)
    ("play.py", "llm", "--record"): ["--episodes", "3", "--max-steps", "5", "--block-steps", "1",
                                     "--history", "1", "--max-new-tokens", "6", "--video", "1",
                                     "--video-max-steps", "2"],
}


def readme_commands() -> list[list[str]]:
    """Every `python X.py ...` command of the pages above, in order, continuation lines joined,
    comments and `--help` lines dropped (not the cluster examples: their paths are a
    cluster's)."""
    commands = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", (ROOT / page).read_text(), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if (words[:1] == ["python"] and words[1:2] != ["-m"] and "--help" not in words
                        and not any(w.startswith("/scratch") for w in words)):
                    commands.append(words[1:])
    return commands


def is_pixels(words: list[str]) -> bool:
    """A command of the walkthrough's frames part (PPO on frames, its dataset, AWR, eval,
    probe): run by tests/test_readme_pixels.py, beside the rest."""
    return any(w in ("cpu-pixels", "data/px", "runs/px", "runs/awr-px") for w in words)


def run_walkthrough(tmp_path: Path, pixels: bool, smoke_run: Path | None = None) -> None:
    """The README's commands of one part (frames, or the rest), in order, at smoke sizes; the
    rest reads `runs/RUN`, a copy of `smoke_run` (conftest's `train.py smoke`)."""
    from qwen_fixtures import build_tiny_qwen3

    env = subprocess_env()
    weights = tmp_path / "Qwen3-tiny"

    def run(words):
        p = run_command([sys.executable, *words], cwd=tmp_path, env=env, capture_output=True,
                        text=True, timeout=900)
        assert p.returncode == 0, (" ".join(words), p.stdout[-2000:], p.stderr[-3000:])
        return p

    commands = [w for w in readme_commands() if is_pixels(w) == pixels]
    if not pixels:
        build_tiny_qwen3(weights, layers=3, vocab=151_680, tokenizer=True)
        shutil.copytree(smoke_run, tmp_path / "runs" / "RUN")
        tools = {tuple(w[:2]) for w in commands}
        assert {("label.py", "generate"), ("label.py", "label"), ("label.py", "returns"),
                ("offline.py", "awr"), ("offline.py", "eval"), ("offline.py", "probe"),
                ("offline.py", "study"), ("play.py", "llm")} <= tools, tools
    for words in commands:
        words = [str(weights) if w.endswith("/models/Qwen3-4B") else w for w in words]
        words = [("2" if prev == "--llm.layer" else w) for prev, w in zip([""] + words, words)]
        run([str(ROOT / words[0]), *words[1:], *smoke_args(words)])


def smoke_args(words: list[str]) -> list[str]:
    keys = [k for k in SMOKE if tuple(words[:len(k)]) == k or (
        k[:2] == tuple(words[:2]) and all(w in words for w in k[2:]))]
    return SMOKE[max(keys, key=len)] if keys else []


@pytest.mark.slow
def test_readme_walkthrough_runs_as_written(smoke_run, tmp_path):
    """Every command but the frames part (tests/test_readme_pixels.py), in order; then what they
    wrote, the LLM-augmented offline run's normaliser against numpy among it, and a label set of
    another prompt refused in one line."""
    import jax

    from fused.data.store import Dataset
    from fused.rl.config import EnvConfig

    run_walkthrough(tmp_path, pixels=False, smoke_run=smoke_run)
    # the datasets page's Python example, as written, where the commands wrote data/ppo
    block = re.search(r"```python\n(.*?)```", (ROOT / "docs/datasets.md").read_text(),
                      re.S).group(1)
    scope: dict = {}
    previous = Path.cwd()
    try:
        import os

        os.chdir(tmp_path)
        exec(compile(block, "docs/datasets.md", "exec"), scope)
    finally:
        os.chdir(previous)
    assert len(scope["rows"]["action"]) == len(scope["raw"]) > 0
    # what the commands wrote for an LLM-augmented offline run (awr-l24, labels l24 at skip 25)
    evaluated = json.loads((tmp_path / "runs/awr-l24/eval.json").read_text())
    assert evaluated["llm"]["layer"] == 2 and evaluated["llm"]["skip_n"] == 25
    pol = check_normaliser(tmp_path / "data/ppo", "l24", tmp_path / "runs/awr-l24")
    assert pol.cfg.llm.skip_n == 25
    import imageio.v3 as iio

    from fused.rl.envs import make_env
    from fused.video import pixel_renderer

    frames = iio.imread(next((tmp_path / "runs/awr-l24/videos").glob("*.gif")))
    env_cfg = EnvConfig(name="Craftax-Classic-Symbolic-v1", num_envs=1)
    plain = pixel_renderer(env_cfg.name)(make_env(env_cfg).reset(jax.random.PRNGKey(0))[1])
    assert frames.shape[2] == plain.shape[1] + 420  # the observation text beside each frame
    probe = json.loads((tmp_path / "runs/awr-l24/probe.json").read_text())
    variants = {"real", "zero", "shuffle", "garbage"}
    assert all(set(v) == variants for v in probe["edits"].values())
    assert set(probe["ablations"]["zombie_adjacent"]) == variants - {"real"} | {"counterfactual"}
    assert "counterfactual" not in probe["ablations"]["food_low"]
    assert set(probe["eval"]) == {"real", "zero", "shuffle", "garbage-prompt"}
    # one table: the plain policy, prompt states and imagination states, each evaluated (the
    # last with the same imagination running in the fused evaluation)
    study = json.loads((tmp_path / "runs/study/study.json").read_text())
    assert set(study["variants"]) == {"awr-plain", "awr-l24", "awr-im24"}
    assert all(v["episodes"] == 2 for v in study["variants"].values())
    # imagination labels and the LLM's play
    assert Dataset(tmp_path / "data/ppo").card()["labels"]["im24"]["pool"] == "imagine:every:8"
    played = json.loads((tmp_path / "runs/qwen4b-play/eval.json").read_text())
    assert played["episodes"] == 2 and "invalid_action_rate" in played
    assert Dataset(tmp_path / "data/llm-play").manifest()["shards"]
    # a label set made with another prompt than the run's: a one-line error
    card = json.loads((tmp_path / "data/ppo/card.json").read_text())
    card["labels"]["l24"]["prompt_digest"] = "0" * 64
    (tmp_path / "data/ppo/card.json").write_text(json.dumps(card))
    p = run_command([sys.executable, str(ROOT / "offline.py"), "eval", "--run",
                     str(tmp_path / "runs/awr-l24"), *EVAL], cwd=tmp_path,
                    env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and p.stderr.splitlines()[-1].startswith("error: prompt_digest"), \
        p.stderr[-2000:]


def check_normaliser(data: Path, labels: str, run: Path):
    """The LLM state's normaliser in an offline run's checkpoint is the moments of the label
    set's states over the rows it trained on (those with a valid return), computed by numpy."""
    import numpy as np

    from fused.data.store import Dataset
    from fused.trained_policy import load_policy

    ds = Dataset(data)
    hidden, valid = [], []
    for name in ds.shard_names():
        lab = ds.read_labels(labels, name)
        hidden.append(lab["hidden"].astype(np.float64)[lab["label_row"]])
        valid.append(ds.read_returns("gamma0.99", name)["valid"])
    h = np.concatenate(hidden)[np.concatenate(valid)]
    pol = load_policy(run, 4)
    np.testing.assert_allclose(pol.inputs_state.norm.mean, h.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pol.inputs_state.norm.var, h.var(0), rtol=1e-4, atol=1e-6)
    return pol


def help_text(*words) -> str:
    p = run_command([sys.executable, str(ROOT / words[0]), *words[1:], "--help"],
                    env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", p.stdout).split())  # rich's box, spaces folded


@pytest.mark.parametrize("words, flags, absent", [
    (("train.py",), ["--ppo.num-steps INT", "--env.num-envs INT", "--resume"], []),
    (("label.py", "generate"), ["--shard-rows INT", "(default: 8192)", "--min-return"], []),
    pytest.param(("offline.py", "awr"), ["--data STR", "(required)", "--labels",
                                         "--device-rows"], ["--algo"], marks=pytest.mark.slow),
    pytest.param(("offline.py", "eval"), ["--run STR", "(required)", "--video INT"], [],
                 marks=pytest.mark.slow),
    pytest.param(("play.py", "llm"), ["--history INT", "--llm.weights", "--record", "--greedy"],
                 [], marks=pytest.mark.slow),
])
def test_help_lists_every_flag_as_paragraphs(words, flags, absent):
    """Without a preset, --help names the presets and lists every flag with the default
    preset's values; usage names the subcommand; docstrings read as sentences (tyro kept the
    source's line breaks); flags a command ignores are not offered."""
    text = help_text(*words)
    assert f"usage: python {' '.join(words)}" in text
    for flag in flags:
        assert flag in text, flag
    for flag in absent:
        assert flag not in text, flag
    if words[:2] not in (("offline.py", "eval"), ("play.py", "llm")):  # (no presets)
        assert "presets (name one first; default cpu): cpu:" in text
    # a docstring's lines joined: no line break before a continuation line's first word
    raw = run_command([sys.executable, str(ROOT / words[0]), *words[1:], "--help"],
                      env=subprocess_env(), capture_output=True, text=True).stdout
    lines = [re.sub(r"[│╭╮╰╯─]", "", x).strip() for x in raw.splitlines()]
    short = [x for x, nxt in zip(lines, lines[1:])
             if x and nxt and not x.startswith("-") and len(x) < 40 and nxt[0].islower()
             and not x.endswith((".", ":"))]
    assert not short, short[:3]


@pytest.mark.parametrize("script, commands", [
    ("craftax-label", ["generate", "label", "returns", "verify"]),
    pytest.param("craftax-offline", ["awr", "bc", "eval", "study", "probe"],
                 marks=pytest.mark.slow),
    pytest.param("craftax-play", ["llm"], marks=pytest.mark.slow)])
def test_console_scripts_list_their_commands_under_their_own_name(script, commands):
    """`craftax-X --help` exits 0 listing the subcommands as `craftax-X`, and a subcommand's
    usage names the console script too (not `python label.py`)."""
    exe = console_script(script)
    p = subprocess.run([exe, "--help"], env=subprocess_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith(f"usage: {script} ") and all(c in p.stdout for c in commands)
    sub = subprocess.run([exe, commands[0], "--help"], env=subprocess_env(),
                         capture_output=True, text=True, timeout=120)
    assert sub.returncode == 0 and f"usage: {script} {commands[0]}" in " ".join(
        sub.stdout.split()), sub.stdout[:500]
    none = subprocess.run([exe], env=subprocess_env(), capture_output=True, text=True,
                          timeout=120)
    assert none.returncode == 1 and none.stderr.startswith(f"usage: {script} ")


def test_wandb_follows_its_own_variables_unless_the_flag_is_given(monkeypatch):
    """The default preset names no wandb mode: WANDB_MODE / WANDB_DISABLED decide as wandb
    defines them, offline where unset; --wandb.mode wins over both."""
    from fused.commands.train import DEFAULT_PRESET, PRESETS
    from fused.runs.settings import WandbConfig

    assert PRESETS[DEFAULT_PRESET][1].wandb.mode is None
    for var in ("WANDB_MODE", "WANDB_DISABLED"):
        monkeypatch.delenv(var, raising=False)
    assert WandbConfig().resolved_mode == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert WandbConfig().resolved_mode == "disabled"
    assert WandbConfig(mode="offline").resolved_mode == "offline"
    monkeypatch.setenv("WANDB_MODE", "online")
    assert WandbConfig().resolved_mode == "online"
    monkeypatch.setenv("WANDB_DISABLED", "true")
    assert WandbConfig().resolved_mode == "disabled"


@pytest.mark.slow  # (8-12 s on 2 cores, among the fast lane's slowest: out of it)
def test_hints_name_the_command_as_the_user_ran_it(tmp_path):
    """A hint names the console scripts when the user ran one (`craftax-label ... ; create one
    with `craftax-label generate ...``), the scripts when run as `python label.py`."""
    for words, hint in (([console_script("craftax-label")], "`craftax-label generate --out"),
                        ([sys.executable, str(ROOT / "label.py")],
                         "`python label.py generate --out")):
        p = subprocess.run([*words, "label", "--data", str(tmp_path / "nothing")],
                           env=subprocess_env(), capture_output=True, text=True, timeout=120)
        assert p.returncode == 1 and hint in p.stderr, p.stderr[-1000:]
