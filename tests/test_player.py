"""The LLM player (`play.py llm`): its conversation is Qwen3's chat template token for token, its
reply rule on the device equals the rule in plain Python (regular expressions), and the command
plays, records a dataset label.py and offline.py take, and refuses bad input in one line."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import ROOT, subprocess_env

ENV = "Craftax-Classic-Symbolic-v1"


@pytest.fixture(scope="module")
def tok():
    from llm_jax.tokenizer import load_tokenizer

    return load_tokenizer()


def real_observations(n: int, env_name: str = ENV) -> np.ndarray:
    from fused.rl.envs import rollout_observations

    return rollout_observations(env_name, n, 0, n)


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
                                                       thinking=thinking), ENV)
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


def test_reply_rule_on_the_device_equals_the_reference(tok):
    """Hand-made replies (ids, names, thinking, bad ids, whole-word edge cases) and random ones
    built from names, digits and filler: the device parser and the regular-expression rule give
    the same action, invalid where the rule finds none (then NOOP)."""
    from fused.envspec import spec
    from fused.text.reply import DEFAULT_ACTION, make_parser, parse_replies, parse_text

    names = spec(ENV).action_names
    parser = make_parser(tok, names)
    texts = ["A tree is right. Action: 5:DO", "Action: 12:MAKE_STONE_PICKAXE", "I go LEFT now",
             "nothing here", "Action:`3`", "Action: 99", "Action: MOVE", "Action: SLEEP please",
             "DOWNWARD DOWN", "Action: 1234", "<think>Action: 2</think>\n\nAction: 4:DOWN",
             "MAKE_WOOD_PICKAXE then Action: PLACE_TABLE", "Action: 5 Action: 7", "xDO DO_x  DO",
             "**Action:** 16", "action: 3", "Action: -1", ""]
    rng = np.random.default_rng(0)
    parts = [n.split(":")[1] for n in names] + ["Action:", " ", "x", "7", "12", ":", "\n",
                                                "_", "do", "`"]
    texts += ["".join(rng.choice(parts, rng.integers(1, 8))) for _ in range(150)]
    m = 64
    tokens = np.zeros((len(texts), m), np.int32)
    num = np.zeros(len(texts), np.int32)
    for i, t in enumerate(texts):
        ids = tok.encode(t)[:m]
        assert tok.decode(ids) == t
        tokens[i, :len(ids)], num[i] = ids, len(ids)
    action, valid = jax.jit(lambda t, n: parse_replies(parser, t, n))(tokens, num)
    for t, a, v in zip(texts, np.asarray(action), np.asarray(valid)):
        want = parse_text(t, names)
        assert (bool(v), int(a)) == ((want is not None),
                                     DEFAULT_ACTION if want is None else want), t


def test_history_keeps_the_answer_without_thinking_or_stop(tok):
    """What a turn keeps of its reply: the answer after </think> and its blank line, without
    the end-of-turn token; a reply cut by the token limit is kept whole."""
    from fused.llm.config import ModelConfig
    from fused.llm.player import PlayerSettings, answer, make_player

    player = make_player(ModelConfig(), PlayerSettings(history=1, max_new_tokens=16,
                                                       thinking=True), ENV)
    end = tok.tokenizer.token_to_id("<|im_end|>")
    rows = [tok.encode("<think>\nhm</think>\n\nAction: 5:DO") + [end],
            tok.encode("Action: 1:LEFT") + [end], tok.encode("no stop here, cut")]
    reply = np.zeros((3, 16), np.int32)
    for i, r in enumerate(rows):
        reply[i, :len(r)] = r
    kept, n = answer(player, jnp.asarray(reply), jnp.asarray([len(r) for r in rows]))
    got = [tok.decode(np.asarray(kept[i, :int(n[i])])) for i in range(3)]
    assert got == ["Action: 5:DO", "Action: 1:LEFT", "no stop here, cut"]


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
    p = subprocess.run(play_cmd("--episodes", "3", "--max-steps", "5", "--block-steps", "1",
                                "--history", "1", "--max-new-tokens", "6", "--out-dir",
                                str(tmp_path), "--run-name", "r", "--record", str(data),
                                "--video", "1", "--video-max-steps", "2", "--seed", "3"),
                       env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "RANDOM Qwen3" in p.stdout
    out = json.loads((tmp_path / "r" / "eval.json").read_text())
    for k in ("return_mean", "return_ci95", "episodes", "length_mean", "achievements",
              "tokens_per_s", "invalid_action_rate", "tokens_per_step"):
        assert k in out, k
    assert out["episodes"] == 3 and out["length_mean"] == 5 and out["censored"] == 3
    assert out["tokens_per_s"] > 0 and 0 <= out["invalid_action_rate"] <= 1
    assert 1 <= out["tokens_per_step"] <= 6
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
    v = subprocess.run([sys.executable, str(ROOT / "label.py"), "verify", "--data", str(data)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert v.returncode == 0, v.stdout[-2000:]
    b = subprocess.run([sys.executable, str(ROOT / "label.py"), "returns", "--data", str(data),
                        "--incomplete", "bootstrap"], env=env, capture_output=True, text=True,
                       timeout=300)
    assert b.returncode == 1 and b.stderr.count("\n") == 1 and "critic" in b.stderr

    def error(*args):
        r = subprocess.run(play_cmd(*args, "--out-dir", str(tmp_path)), env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 1 and r.stderr.startswith("error:"), r.stderr[-2000:]
        assert r.stderr.count("\n") == 1, r.stderr
        return r.stderr

    assert "--temperature" in error("--greedy", "--temperature", "0.3")
    assert "context" in error("--history", "40", "--env.name", "Craftax-Symbolic-v1")
    assert "not empty" in error("--record", str(data), "--run-name", "r2")
    assert "episodes" in error("--episodes", "1")
