"""The LLM player (`play.py llm`): its conversation is Qwen3's chat template token for token, its
reply rule on the device equals the rule in plain Python (regular expressions), and the command
plays, records a dataset label.py and offline.py take, and refuses bad input in one line."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from command_runner import run_command
from conftest import ROOT, console_script, subprocess_env

ENV = "Craftax-Classic-Symbolic-v1"


@pytest.fixture(scope="module")
def tok():
    from llm_jax.tokenizer import load_tokenizer

    return load_tokenizer()


def real_observations(n: int, env_name: str = ENV) -> np.ndarray:
    from fused.rl.envs import rollout_observations

    # (test_fused_llm's program of 64 observations, its seed aside: step 0 of its first n envs)
    return rollout_observations(env_name, 64, 0, 16)[:n]


@pytest.mark.parametrize("history, thinking", [  # the fast lane checks the first case
    (0, False), pytest.param(2, False, marks=pytest.mark.slow),
    pytest.param(1, True, marks=pytest.mark.slow)])
def test_conversation_is_the_chat_template_token_for_token(tok, history, thinking):
    """prefix + the assembled prompt == the official template's text of the same conversation
    (earlier turns with their replies, then the current observation), encoded at once."""
    from fused.llm.config import ModelConfig
    from fused.llm.player import PlayerSettings, assemble, make_player
    from fused.text.format import render_text
    from fused.text.prompt import play_messages
    from fused.text.render import render_tokens

    player = make_player(ModelConfig(), PlayerSettings(history=history, max_new_tokens=24,
                                                       thinking=thinking), ENV, rows=1)
    obs = real_observations(3)
    layout = player.renderer.layout
    texts = [render_text(layout, o) for o in obs]
    replies = ["The tree is right of me. Action: 5:DO", "Go left.\nAction: 1:LEFT"]
    tokens, lengths = render_tokens(player.renderer, jnp.asarray(obs))
    carry = player.policy.carry(1)
    earlier = list(zip(texts[:history], replies[:history]))  # oldest first, at the end
    for k, (i, reply) in enumerate(zip(range(history), replies)):
        slot = player.settings.history - history + k
        ids = tok.encode(reply)
        carry = carry._replace(
            obs=carry.obs.at[0, slot].set(tokens[i]),
            obs_len=carry.obs_len.at[0, slot].set(lengths[i]),
            reply=carry.reply.at[0, slot, :len(ids)].set(jnp.asarray(ids)),
            reply_len=carry.reply_len.at[0, slot].set(len(ids)))
    prompt, n = assemble(player, carry, tokens[2:3], lengths[2:3])
    ours = list(player.parts.prefix) + list(np.asarray(prompt[0, :int(n[0])]))
    text = tok.apply_chat_template(play_messages(ENV, earlier, texts[2]),
                                   add_generation_prompt=True, enable_thinking=thinking)
    assert ours == tok.encode(text)


def reply_corpus(tok, names, rng) -> list[list[int]]:
    """Replies as token ids: every action as an id (1-3 digits, zero-padded too), as NAME, as
    both; ids followed by every class of byte; several `Action:` marks; `</think>` as its token
    and spelt out of ordinary tokens, closed and unfinished; unicode (an Arabic-Indic digit
    among it); empty; every token of over TOKEN_BYTES bytes beside names, ids and marks; and
    random mixtures of all of these."""
    from fused.text.reply import TOKEN_BYTES, token_bytes

    enc = tok.encode
    plain = [n.split(":", 1)[1] for n in names]
    after = ["", "4", "42", "x", "Z", "_", " ", ",", ".", ":", ")", "\n", "`", "*", "-", "é",
             "中", "\u0663", " DO", "NOOP", " 7", "Action: 2"]
    texts = ["", " ", "nothing here", "\u0663", "Action:", "Action: ", "Action:\u0663",
             "action: 3", "ACTION: 3", "Action: -1", "Action: 1234", "Action: 99", "Action: 1 23",
             "Action: 3, 45", "Action: 5 Action: 7", "Action: 5\nAction: NOOP", "xDO DO_x  DO",
             "**Action:** 16", "Action:`3`", "Action: ``*`` 4", "DOWNWARD DOWN",
             "MAKE_WOOD_PICKAXE then Action: PLACE_TABLE", "<think>Action: 2</think>\n\nAction: 4",
             "<think>\nLEFT is best</think>\n\nI go RIGHT", "<think>\nLEFT, then Action: 3",
             "</think></think>DO", "Résumé: DO", "日本語 Action: 中 LEFT", "😀 Action: 😀 5"]
    for i, name in enumerate(plain):
        texts += [f"Action: {i}", f"Action: {i}:{name}", f"Action: {name}", name,
                  f"Action: {i:03d}", f"I will {name.lower()} then {name}.", f"Action: {name}x"]
    for digits in ("1", "7", "12", "16", "099", "123", "999"):
        texts += [f"Action: {digits}{a}" for a in after]
    ids = [enc(t) for t in texts]
    spelt = [enc("</"), enc("think"), enc(">")]  # </think> out of ordinary tokens
    assert tok.decode(sum(spelt, [])) == "</think>" and len(sum(spelt, [])) > 1
    ids += [enc("LEFT") + sum(spelt, []) + enc("Action: 3"), enc("Action: 2") + sum(spelt, []),
            sum(spelt, []) + enc(" UP")]
    long = [i for i, b in enumerate(token_bytes(tok)) if len(b) > TOKEN_BYTES
            and tok.tokenizer.id_to_token(i) is not None]
    assert len(long) > 1000
    for j, t in enumerate(long):
        ids.append([enc("Action: 5"), enc("DO"), enc("Action:"), enc("LEFT")][j % 4] + [t]
                   + [enc("DO"), enc(" 3"), enc("Action: 4"), enc("_UP")][j // 4 % 4])
    pieces = ([enc(n) for n in plain] + [enc(x) for x in ("Action:", " ", "x", "7", "12", ":",
                                                           "\n", "_", "do", "`", "é", "</think>")]
              + spelt + [[t] for t in long[:50]])
    for _ in range(600):
        ids.append(sum((pieces[k] for k in rng.integers(0, len(pieces), rng.integers(1, 10))),
                       []))
    return ids


@pytest.mark.slow
@pytest.mark.parametrize("env", [ENV, "Craftax-Symbolic-v1"])
def test_reply_rule_on_the_device_equals_the_reference(tok, env):
    """The device parser and the plain-Python rule (`parse_text` on the decoded text) agree on
    every reply of a generated corpus (`reply_corpus`), thinking off and on, with and without
    the end-of-turn token after the reply: the same action, invalid where the rule finds none
    (then NOOP), and unfinished thoughts counted. Fails with an id test on the 4th byte after
    the mark ("Action: 1 23")."""
    from fused.envspec import spec
    from fused.text.reply import DEFAULT_ACTION, make_parser, parse_replies, parse_text

    names = spec(env).action_names
    end = tok.token_id("<|im_end|>")
    rng = np.random.default_rng(0)
    corpus = reply_corpus(tok, names, rng)
    m = max(map(len, corpus)) + 1
    for thinking in (False, True):
        parser = make_parser(tok, names, (end,), thinking)
        run = jax.jit(lambda t, n: parse_replies(parser, t, n))
        for start in range(0, len(corpus), 1024):
            batch = corpus[start:start + 1024]
            tokens = np.full((len(batch), m), tok.pad_id, np.int32)
            num = np.zeros(len(batch), np.int32)
            for i, ids in enumerate(batch):
                stop = [end] if i % 2 else []  # half of them ended by the end-of-turn token
                tokens[i, :len(ids) + len(stop)] = ids + stop
                num[i] = len(ids) + len(stop)
            got = run(tokens, num)
            for i, ids in enumerate(batch):
                text = tok.decode(ids)
                want = parse_text(text, names, thinking)
                assert (bool(got.valid[i]), int(got.action[i])) == (
                    want is not None, DEFAULT_ACTION if want is None else want), (thinking, text)
                cut = thinking and "</think>" not in text
                assert bool(got.span.unfinished[i]) == cut, (thinking, text)


def test_history_keeps_the_answer_without_thinking_or_stop(tok):
    """What a turn keeps of its reply: the answer after </think> and its blank line, without
    the end-of-turn token (the pad id after it); a reply cut by the token limit is kept whole."""
    from fused.llm.config import ModelConfig
    from fused.llm.player import PlayerSettings, answer, make_player
    from fused.text.reply import answer_span

    player = make_player(ModelConfig(), PlayerSettings(history=1, max_new_tokens=16,
                                                       thinking=True), ENV, rows=3)
    end = tok.token_id("<|im_end|>")
    rows = [tok.encode("<think>\nhm</think>\n\nAction: 5:DO") + [end],
            tok.encode("Action: 1:LEFT") + [end], tok.encode("no stop here, cut")]
    reply = np.zeros((3, 16), np.int32)
    for i, r in enumerate(rows):
        reply[i, :len(r)] = r
    num = jnp.asarray([len(r) for r in rows])
    kept, n = answer(player, jnp.asarray(reply), answer_span(player.parser, jnp.asarray(reply),
                                                            num))
    got = [tok.decode(np.asarray(kept[i, :int(n[i])]), keep_special=True) for i in range(3)]
    assert got == ["Action: 5:DO", "Action: 1:LEFT", "no stop here, cut"]
    assert (np.asarray(kept[0, int(n[0]):]) == tok.pad_id).all()


def play_cmd(*args):
    return [sys.executable, str(ROOT / "play.py"), "llm", *args]


@pytest.mark.slow
def test_play_writes_eval_json_records_a_dataset_and_refuses_bad_input(tmp_path):
    """The tiny random Qwen3 plays 3 episodes (block of 1 step: every reply is kept): eval.json
    has offline.py eval's keys and the player's figures; each recorded action is the rule's
    reading of that step's reply (NOOP where it names none); the recording is a dataset that
    label.py verifies and returns (bootstrapping is refused: no critic); a video is written.
    Bad input is one line before any work."""
    from fused.data.store import Dataset
    from fused.envspec import spec
    from fused.text.reply import DEFAULT_ACTION, parse_text

    env = subprocess_env()
    data = tmp_path / "data"
    args = play_cmd("--episodes", "3", "--max-steps", "5", "--block-steps", "1", "--history",
                    "1", "--max-new-tokens", "6", "--out-dir", str(tmp_path), "--run-name", "r",
                    "--record", str(data), "--video", "1", "--video-max-steps", "2", "--seed", "3")
    p = subprocess.run([console_script("craftax-play"), *args[2:]], env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]  # (the console script: 0 once done)
    assert "RANDOM Qwen3" in p.stdout
    out = json.loads((tmp_path / "r" / "eval.json").read_text())
    for k in ("return_mean", "return_ci95", "episodes", "length_mean", "achievements",
              "tokens_per_s", "invalid_action_rate", "tokens_per_step"):
        assert k in out, k
    assert out["episodes"] == 3 and out["length_mean"] == 5 and out["censored"] == 3
    assert out["tokens_per_s"] > 0 and 0 <= out["invalid_action_rate"] <= 1
    assert 1 <= out["tokens_per_step"] <= 6 and out["unfinished_thought_rate"] == 0
    assert out["useful_tokens"] == round(out["tokens_per_step"] * 15)
    assert out["tokens_generated"] == out["useful_tokens"]  # every step counted: no cap crossed
    assert out["llm"]["sampling"]["greedy"] and out["llm"]["dtype"] == "float32"
    assert len(out["videos"]) == 1
    replies = json.loads((tmp_path / "r" / "replies.json").read_text())["replies"]
    ds = Dataset(data)
    rows = {k: np.concatenate([ds.read(n)[k] for n in ds.shard_names()])
            for k in ("action", "episode_id", "step")}
    assert len(rows["action"]) == 15 and sorted(set(rows["episode_id"])) == [0, 1, 2]
    names = spec(ENV).action_names
    invalid = 0
    for e in range(3):
        acts = rows["action"][rows["episode_id"] == e]
        for t, text in enumerate(replies[e]):
            want = parse_text(text, names)
            invalid += want is None
            assert acts[t] == (DEFAULT_ACTION if want is None else want), (e, t, text)
    assert invalid / 15 == pytest.approx(out["invalid_action_rate"])
    v = run_command([sys.executable, str(ROOT / "label.py"), "verify", "--data", str(data)],
                    env=env, capture_output=True, text=True, timeout=300)
    assert v.returncode == 0, v.stdout[-2000:]
    b = run_command([sys.executable, str(ROOT / "label.py"), "returns", "--data", str(data),
                     "--incomplete", "bootstrap"], env=env, capture_output=True, text=True,
                    timeout=300)
    assert b.returncode == 1 and b.stderr.count("\n") == 1 and "critic" in b.stderr
    r = run_command([sys.executable, str(ROOT / "label.py"), "returns", "--data", str(data)],
                    env=env, capture_output=True, text=True, timeout=300)
    warned = [x for x in r.stdout.splitlines() if x.startswith("warning:")]
    assert r.returncode == 0 and len(warned) == 1 and "no row" in warned[0], r.stdout
    # the video's return-to-go is label.py returns' of its episode (both at gamma 0.99), over
    # every step played (2 drawn of 5); the player has no critic: G_t alone
    z = np.load(Path(out["videos"][0]).with_suffix(".npz"))
    assert not z["critic"] and np.isnan(z["value"]).all() and z["gamma"] == out["video_gamma"]
    rtg = np.concatenate([ds.read_returns(f"gamma{out['video_gamma']:g}", n)["rtg"]
                          for n in ds.shard_names()])
    assert len(z["reward"]) == 5 and z["frames"] == 2
    np.testing.assert_allclose(z["return_to_go"], rtg[rows["episode_id"] == 0], atol=1e-6)
    assert Path(out["videos"][0]).with_suffix(".mp4").is_file()

    def error(*args):
        r = run_command(play_cmd(*args, "--out-dir", str(tmp_path)), env=env,
                        capture_output=True, text=True, timeout=300)
        assert r.returncode == 1 and r.stderr.startswith("error:"), r.stderr[-2000:]
        assert r.stderr.count("\n") == 1, r.stderr
        return r.stderr

    assert "--greedy with --temperature 0.3" in error("--greedy", "--temperature", "0.3")
    assert "context" in error("--history", "40", "--env.name", "Craftax-Symbolic-v1")
    assert "not empty" in error("--record", str(data), "--run-name", "r2")
    assert "--episodes 1" in error("--episodes", "1")
    assert "already holds a play" in error("--run-name", "r")
    # the whole memory (weights, every episode's KV cache, the prompt pass) before compiling
    msg = error("--llm.random-model", "qwen3-4b", "--episodes", "64", "--run-name", "big")
    assert "KV cache" in msg and "prompt KV copy" in msg and "--episodes" in msg, msg


@pytest.mark.slow
def test_play_interrupted_keeps_its_blocks_and_resumes_to_the_same_result(tmp_path):
    """Ctrl-C after the second block: exit 130 at once, a partial eval.json (the finished
    episodes, marked), replies.json and a partial recording; `--resume` goes on from the last
    block to the eval.json, replies, recorded rows and video frames (the first blocks' read back
    from R/progress/) an uninterrupted play gives; resuming a play that ended says so and
    changes nothing. (With --thinking, cut thoughts are invalid and counted: checked on
    tests/test_human.py's golden-shots play, which plays with --thinking, one play fewer.)"""
    import signal
    import time

    from fused.data.store import Dataset

    env = subprocess_env()
    args = ["--episodes", "3", "--max-steps", "9", "--block-steps", "2", "--history", "1",
            "--max-new-tokens", "6", "--temperature", "1.0", "--out-dir", str(tmp_path),
            "--video", "2", "--video-max-steps", "7"]
    full = run_command(play_cmd(*args, "--run-name", "full", "--record",
                                str(tmp_path / "d-full")),
                       env=env, capture_output=True, text=True, timeout=900)
    assert full.returncode == 0, full.stderr[-3000:]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        proc = subprocess.Popen(play_cmd(*args, "--run-name", "cut", "--record",
                                         str(tmp_path / "d-cut")),
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    lines = []
    deadline = time.time() + 600
    while time.time() < deadline and proc.poll() is None:
        lines.append(proc.stdout.readline())
        if lines[-1].strip().startswith("4 steps"):
            break
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, ("".join(lines) + stdout, stderr[-2000:])
    assert "Traceback" not in stderr and "--resume" in stdout.strip().splitlines()[-1]
    partial = json.loads((tmp_path / "cut" / "eval.json").read_text())
    assert partial["partial"] and partial["steps_played"] >= 4 and partial["episodes"] == 0
    assert json.loads((tmp_path / "cut" / "replies.json").read_text())["replies"][0]
    assert Dataset(tmp_path / "d-cut").card()["partial"]
    again = run_command(play_cmd("--resume", str(tmp_path / "cut")), env=env,
                        capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    a, b = (json.loads((tmp_path / r / "eval.json").read_text()) for r in ("full", "cut"))
    timing = {"run", "seconds", "tokens_per_s", "useful_tokens_per_s", "record", "resumed",
              "tokens_per_s_includes_compile", "command", "videos"}  # (and the run's paths)
    assert {k: v for k, v in a.items() if k not in timing} == {
        k: v for k, v in b.items() if k not in timing}
    assert a["tokens_generated"] > a["useful_tokens"]  # the last block passed the cap
    assert (json.loads((tmp_path / "full" / "replies.json").read_text())
            == json.loads((tmp_path / "cut" / "replies.json").read_text()))
    assert (Dataset(tmp_path / "d-full").manifest()["shards"]
            == Dataset(tmp_path / "d-cut").manifest()["shards"])
    import imageio.v3 as iio

    for gif in ("episode_000.gif", "episode_001.gif"):
        whole, resumed = (iio.imread(tmp_path / r / "videos" / gif) for r in ("full", "cut"))
        assert whole.shape[0] == 7 and np.array_equal(whole, resumed)
        # the numbers drawn: every step played, those after the last frame too (blocks that
        # drew nothing, read back from R/progress/)
        whole, resumed = (np.load(tmp_path / r / "videos" / gif.replace(".gif", ".npz"))
                          for r in ("full", "cut"))
        assert len(whole["reward"]) == 9 and whole.files == resumed.files
        for k in whole.files:
            np.testing.assert_array_equal(whole[k], resumed[k], err_msg=k)
    assert not Dataset(tmp_path / "d-cut").card()["partial"]
    done = run_command(play_cmd("--resume", str(tmp_path / "cut")), env=env,
                       capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "the play is complete" in done.stdout
