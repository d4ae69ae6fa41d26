"""`play.py human`: a person's play recorded as a label.py dataset. Against independent
references: Craftax's own Action enum for the keys, Craftax's env stepped directly for the
observations, label.py verify / returns and offline.py bc for the format; the server over
HTTP (a SIGKILL loses no acknowledged step) and in headless Chromium (the page's keys record
what they name)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import LENGTHS, ROOT, subprocess_env
from test_faults import one_line_error, read_only, run

ENV = "Craftax-Classic-Symbolic-v1"
# keys of a script: an episode of 4 steps (truncated), then a key that starts the next
# episode, then 3 steps of it; and what Craftax calls the actions taken
KEYS = ["d", "d", "space", "w", "q", "a", "a", "tab"]
TAKEN = ["RIGHT", "RIGHT", "DO", "UP", "LEFT", "LEFT", "SLEEP"]


def human(*args):
    from fused.commands.human import main

    return main(list(args), "python play.py")


@functools.cache
def craftax_env():
    """Craftax's own env, its reset and step jitted (as a program they are Craftax's code still;
    run op by op they compiled ~250 small programs, ~25 s a test)."""
    from craftax.craftax_env import make_craftax_env_from_name

    env = make_craftax_env_from_name(ENV, auto_reset=False)
    return env.default_params, jax.jit(env.reset_env), jax.jit(env.step_env)


def craftax_reference(seed: int, actions) -> np.ndarray:
    """The observations an episode of `seed` acts on, from Craftax's env itself (the
    documented keys: the world from fold_in(PRNGKey(seed), 0), step k from fold_in(.., k+1)).
    Compare with `same_obs`: compiled whole, a float feature can round 1 ulp apart."""
    p, reset, step = craftax_env()
    obs, state = reset(jax.random.fold_in(jax.random.PRNGKey(seed), 0), p)
    # (strongly typed, as the step's states come back: the reset's `player_direction` is weakly
    # typed, which made the step a second program, ~2 s to compile)
    state = jax.tree.map(lambda a: jnp.asarray(a, a.dtype), state)
    out = []
    for k, a in enumerate(actions):
        out.append(np.asarray(obs).reshape(-1))
        obs, state, *_ = step(jax.random.fold_in(jax.random.PRNGKey(seed), k + 1), state,
                              jnp.int32(a), p)
    return np.stack(out)


def same_obs(ours, reference) -> None:
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-6)


def read_all(root: Path) -> dict:
    from fused.data.store import Dataset

    ds = Dataset(root)
    parts = [ds.read(s["name"]) for s in ds.manifest()["shards"]]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


@pytest.fixture(scope="module")
def played(tmp_path_factory):
    """A scripted play of KEYS at seed 5 with episodes of 4 steps (the first crosses from the
    first shard of 3 rows into the second), golden examples beside."""
    d = tmp_path_factory.mktemp("human")
    script = d / "keys.txt"
    script.write_text("# a scripted session\n" + "\n".join(KEYS) + "\n\n")
    human("--out", str(d / "data"), "--script", str(script), "--seed", "5",
          "--env.max-episode-steps", "4", "--examples", str(d / "golden"), "--shard-rows", "3")
    return d


@pytest.mark.slow
def test_script_records_what_craftax_plays(played):
    """Rows, episodes and actions as Craftax names them; every observation equals the one
    Craftax's env gives from the episode's seed (in the card) and the actions before it (to
    float rounding: `same_obs`)."""
    from craftax.craftax_classic.constants import Action

    from fused.envspec import spec
    from fused.rl.obs_codec import ObsCodec

    cols = read_all(played / "data")
    assert cols["action"].tolist() == [Action[a].value for a in TAKEN]
    assert cols["episode_id"].tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert cols["step"].tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert cols["t"].tolist() == list(range(7))
    assert cols["truncated"].tolist() == [False] * 3 + [True] + [False] * 3
    assert not cols["terminated"].any()
    card = json.loads((played / "data" / "card.json").read_text())
    assert card["human"]["episodes"] == {"0": 5, "1": 6} and card["policy"] == "human"
    assert card["counts"] == {"rows": 7, "shards": 3, "episodes": 2, "last_episode": 1}
    manifest = json.loads((played / "data" / "manifest.json").read_text())
    assert [s["rows"] for s in manifest["shards"]] == [3, 1, 3]
    obs = ObsCodec(spec(ENV)).decode(np, cols)
    for ep, seed in ((0, 5), (1, 6)):
        rows = cols["episode_id"] == ep
        same_obs(obs[rows], craftax_reference(seed, cols["action"][rows]))
    # nothing waits in the journal after a clean exit
    assert not list((played / "data" / "work" / "human" / "steps").iterdir())


@pytest.mark.slow
def test_reopening_keeps_the_recordings_episode_length(played, tmp_path):
    """Going on without --env.max-episode-steps plays the episode length the card holds."""
    import shutil

    d = tmp_path / "data"
    shutil.copytree(played / "data", d)
    script = tmp_path / "keys.txt"
    script.write_text("a\na\na\n")  # the step that ends episode 1, a key that begins 2, a step
    human("--out", str(d), "--script", str(script))
    cols = read_all(d)
    assert cols["step"].tolist()[-3:] == [2, 3, 0]
    assert cols["truncated"].tolist()[-3:] == [False, True, False]
    assert json.loads((d / "card.json").read_text())["human"]["max_episode_steps"] == 4


@pytest.mark.slow
def test_golden_examples_hold_the_text_and_frame_of_each_step(played):
    from PIL import Image

    from fused.text.format import get_layout, render_text

    game = next((played / "golden").iterdir())
    lines = [json.loads(x) for x in (game / "steps.jsonl").read_text().splitlines()]
    cols = read_all(played / "data")
    from fused.envspec import spec
    from fused.rl.obs_codec import ObsCodec

    obs = ObsCodec(spec(ENV)).decode(np, cols)
    assert [x["action_name"] for x in lines] == TAKEN
    for x, o in zip(lines, obs):
        assert x["observation"] == render_text(get_layout(ENV), o)
        with Image.open(game / x["frame"]) as im:
            assert im.size == (9 * 16, 9 * 16) and im.mode == "RGB"
    assert [x["done"] for x in lines] == [False] * 3 + [True] + [False] * 3


@pytest.mark.slow
def test_recorded_play_is_a_dataset_for_label_and_offline(played, tmp_path):
    """`label.py verify`, `label.py returns`, `label.py label` (its history follows the
    episode that crosses shards) and `offline.py bc` take the recorded play."""
    import shutil

    d = str(tmp_path / "data")
    shutil.copytree(played / "data", d)
    p = run("label.py", "verify", "--data", d)
    assert p.returncode == 0 and "ok: 3 shards verified" in p.stdout, p.stdout + p.stderr
    # (at test_label's batch: the encoding program its labels compiled)
    p = run("label.py", "label", "--data", d, "--llm.skip-n", "2", "--batch", "16", *LENGTHS)
    assert p.returncode == 0, p.stderr[-3000:]
    manifest = json.loads(Path(d, "manifest.json").read_text())
    assert len(manifest["labels"]["hidden"]["shards"]) == 3
    p = run("label.py", "returns", "--data", d, "--gamma", "0.9")
    assert p.returncode == 0, p.stderr[-2000:]
    p = run("offline.py", "bc", "smoke", "--data", d, "--out-dir", str(tmp_path), "--run-name",
            "bc", "--num-updates", "5", "--batch-size", "4")
    assert p.returncode == 0, p.stderr[-3000:]
    metrics = [json.loads(x) for x in (tmp_path / "bc" / "metrics.jsonl").read_text().splitlines()]
    assert metrics and all(np.isfinite(m["loss"]) for m in metrics if "loss" in m)


def test_keys_are_noop_while_the_player_sleeps():
    """As Craftax's play script has it: asleep, every key takes NOOP."""
    from craftax.craftax_classic.constants import Action

    from fused.human.game import Game

    g = Game(ENV)
    g.new(0)
    assert g.action_of("w") == Action.UP.value and g.action_of("4") == \
        Action.MAKE_WOOD_SWORD.value and g.action_of("x") is None
    g.set(g.state.replace(is_sleeping=True), g.obs, 0, 0.0)
    assert g.action_of("w") == g.action_of("space") == Action.NOOP.value


@contextlib.contextmanager
def compiles(name: str):
    """The programs named `name` jax compiles inside the block (logged whether or not the
    persistent cache held them)."""
    import logging

    seen = []

    class Handler(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith(f"Finished XLA compilation of {name} "):
                seen.append(record.getMessage())

    handler, logger = Handler(), logging.getLogger("jax")
    logger.addHandler(handler)
    try:
        with jax.log_compiles(True):
            yield seen
    finally:
        logger.removeHandler(handler)


@pytest.mark.slow
def test_a_failed_game_save_or_a_removed_game_loses_no_recorded_row(tmp_path, monkeypatch):
    """A row journaled whose game save failed (a kill or a full disk between the two) is not
    committed, and reopening goes on from the saved game; with game.npz removed (as the
    errors advise) the journal's rows are committed and a new game begins; a first run
    stopped before its card leaves a folder that records afresh."""
    from fused.human.game import Game
    from fused.human.recorder import Recorder

    d = tmp_path / "d"
    with compiles("jit(step)") as steps:  # a new game's first steps: one program
        rec = Recorder(d, Game(ENV), 4, "test")
        for a in (2, 2, 5):
            rec.step(a)
    assert len(steps) == 1, steps

    def fail():
        raise OSError("disk full")

    monkeypatch.setattr(rec, "_save_game", fail)
    with pytest.raises(OSError):
        rec.step(3)
    rec.close()
    assert read_all(d)["t"].tolist() == [0, 1, 2]
    rec = Recorder(d, Game(ENV), 4, "test")
    assert rec.t == 3 and int(rec.game.state.timestep) == 3 and rec.resumed
    rec.step(1)
    rec.step(1)
    rec._lock_file.close()  # a kill: the two rows journaled, not committed
    (d / "work" / "human" / "game.npz").unlink()
    rec = Recorder(d, Game(ENV), 9, "test")
    assert read_all(d)["t"].tolist() == [0, 1, 2, 3, 4]
    assert (rec.episode_id, rec.game.seed, rec.t) == (1, 9, 5)
    rec.close()
    (tmp_path / "e" / "work" / "human").mkdir(parents=True)
    Recorder(tmp_path / "e", Game(ENV), 0, "test").close()
    assert json.loads((tmp_path / "e" / "card.json").read_text())["policy"] == "human"


@pytest.mark.slow
def test_recording_frames_goes_on_from_a_v1_recording(tmp_path):
    """On a pixel env the rows hold frames as pictures [H, W, 3]; a recording the v1 recorder
    left (a v1 card, its shards' and journal's frames flat) goes on: its journal is committed
    as pictures, its shards read as pictures, its card stays v1."""
    import shutil

    from fused.data.store import FORMAT_V1, Dataset, commit_group, read_group
    from fused.human.game import Game
    from fused.human.recorder import Recorder

    px = "Craftax-Classic-Pixels-v1"
    d = tmp_path / "d"
    rec = Recorder(d, Game(px), 3, "test")
    rec.step(2)
    rec.close()  # one shard
    rec = Recorder(d, Game(px), 3, "test")
    rec.step(2)
    rec.step(5)
    rec._lock_file.close()  # a kill: two rows in the journal
    frames = read_all(d)["frame"]
    assert frames.shape == (1, 63, 63, 3)
    # as the v1 recorder wrote it: flat frames in the shard and the journal, a v1 card
    ds = Dataset(d)
    manifest = ds.manifest()
    name = manifest["shards"][0]["name"]
    cols = read_group(ds.shard_dir(name))
    shutil.rmtree(ds.shard_dir(name))
    manifest["shards"][0] = commit_group(ds.shard_dir(name),
                                         dict(cols, frame=cols["frame"].reshape(1, -1)))
    ds.write_manifest(manifest)
    card = {k: v for k, v in ds.card().items() if k != "observation"}
    ds.write_card(dict(card, format=FORMAT_V1))
    journal = sorted((d / "work" / "human" / "steps").glob("*.npz"))
    waiting = []
    for p in journal:
        with np.load(p) as z:
            row = {k: z[k] for k in z.files}
        waiting.append(row["frame"])
        np.savez(p, **dict(row, frame=row["frame"].reshape(1, -1)))
    rec = Recorder(d, Game(px), 3, "test")  # commits the journal
    rec.step(1)
    rec.close()
    names = ds.shard_names()
    assert len(names) == 3 and ds.card()["format"] == FORMAT_V1
    assert read_group(ds.shard_dir(names[1]), ["frame"])["frame"].shape == (2, 63, 63, 3)
    cols = read_all(d)
    assert cols["frame"].shape == (4, 63, 63, 3) and cols["t"].tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(cols["frame"][:3], np.concatenate([frames] + waiting))


@pytest.mark.slow
def test_bad_input_ends_in_one_line(tmp_path, monkeypatch):
    """Each refusal is one line, made before a game is built (textures, compiles): the
    command's one line through play.py for a bad script key, the rest in process (a Game
    built for them would fail the test)."""
    from fused.commands import human as human_command
    from fused.errors import ConfigError

    bad = tmp_path / "bad.txt"
    bad.write_text("d\nspace\nx\n")  # x: no Classic action
    line = one_line_error(run("play.py", "human", "--out", str(tmp_path / "d"), "--script",
                              str(bad)))
    assert "line 3" in line and "'x'" in line
    assert not (tmp_path / "d").exists()
    ok = tmp_path / "ok.txt"
    ok.write_text("d\n")
    human("--out", str(tmp_path / "d"), "--script", str(ok))
    # a line of one space is the space key
    spaced = tmp_path / "spaced.txt"
    spaced.write_text("d\n \n")
    human("--out", str(tmp_path / "sp"), "--script", str(spaced))
    from craftax.craftax_classic.constants import Action

    assert read_all(tmp_path / "sp")["action"].tolist() == [Action.RIGHT.value, Action.DO.value]

    def no_game(*_, **__):
        raise AssertionError("a game was built before the refusal")

    monkeypatch.setattr(human_command, "Game", no_game)  # (where the command builds it)

    def refused(*args) -> str:
        with pytest.raises(ConfigError) as e:
            human(*args)
        assert "\n" not in str(e.value)
        return str(e.value)

    # another env's recording
    line = refused("--out", str(tmp_path / "d"), "--script", str(ok), "--env.name",
                   "Craftax-Symbolic-v1")
    assert "Craftax-Classic-Symbolic-v1" in line
    # another episode length than the recording's
    line = refused("--out", str(tmp_path / "d"), "--script", str(ok),
                   "--env.max-episode-steps", "5")
    assert "--env.max-episode-steps" in line and "unset" in line
    # a folder that is not a dataset
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    line = refused("--out", str(tmp_path / "other"), "--script", str(ok))
    assert "not a dataset" in line and (tmp_path / "other" / "notes.txt").read_text() == "mine"
    # golden examples inside the dataset
    line = refused("--out", str(tmp_path / "d"), "--script", str(ok), "--examples",
                   str(tmp_path / "d" / "golden"))
    assert "inside the dataset" in line
    # an unwritable parent
    (tmp_path / "ro").mkdir()
    with read_only(tmp_path / "ro"):
        line = refused("--out", str(tmp_path / "ro" / "d"), "--script", str(ok))
    assert "--out" in line
    assert not human_command.STOP.is_set()
    # SIGTERM while starting: one line, no traceback
    q = subprocess.Popen([sys.executable, str(ROOT / "play.py"), "human", "--out",
                          str(tmp_path / "term"), "--port", "0"], env=subprocess_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(4)
    q.send_signal(signal.SIGTERM)
    so, se = q.communicate(timeout=60)
    assert "Traceback" not in se and q.returncode in (0, 130, -signal.SIGTERM), (q.returncode,
                                                                         so, se)


def start_server(out: Path, *flags, port: int = 0) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, str(ROOT / "play.py"), "human", "--out", str(out),
                          "--port", str(port), *flags], env=subprocess_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    deadline = time.time() + 180
    seen = []
    while time.time() < deadline:
        line = p.stdout.readline()
        seen.append(line)
        m = re.search(r"open (http://\S+/)", line)
        if m:
            return p, m.group(1)
        if not line and p.poll() is not None:
            break
    p.kill()
    raise AssertionError("".join(seen))


def call(url: str, path: str, body: dict | None = None, **headers) -> tuple[int, dict]:
    req = urllib.request.Request(url.rstrip("/") + path,
                                 method="GET" if body is None else "POST",
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


@pytest.mark.slow
def test_server_survives_sigkill_tabs_a_second_recorder_and_restarts_on_its_port(tmp_path):
    """Steps acknowledged before a SIGKILL are all in the dataset after reopening, and the
    game goes on where it stood; a second tab takes the game over (the first is refused);
    a second recorder on the same dataset and a port in use each end in one line. After
    refused requests (the server closes those connections, leaving them in TIME_WAIT on its
    port), clients that leave mid-answer and Ctrl-C, the same command starts again on the same
    port at once; nothing on the console is a traceback; SIGTERM stops it with exit 0. (One
    dataset's servers for both checks: started, SIGKILLed; reopened, refusing, left by clients,
    Ctrl-C; started again on its port, SIGTERM. Formerly two tests, one server start fewer.)"""
    import socket

    out = tmp_path / "data"
    p, url = start_server(out, "--seed", "3")
    try:
        # nothing plays before a tab claims; only this machine's pages, in JSON
        code, err = call(url, "/key", {"key": "d", "tab": None})
        assert code == 409 and "another tab" in err["error"]
        port = url.rsplit(":", 1)[1].strip("/")
        assert call(url, "/state", Host=f"evil.example:{port}")[0] == 403
        assert call(url, "/state", Host="localhost:9000")[0] == 200  # an SSH tunnel's port
        assert call(url, "/state", Host=f"127.0.0.1.evil.example:{port}")[0] == 403
        assert call(url, "/claim", {}, Origin="http://evil.example")[0] == 403
        assert call(url, "/claim", {}, **{"Content-Type": "text/plain"})[0] == 415
        assert call(url, "/state")[1]["rows"] == 0
        _, first = call(url, "/claim", {})
        tab = first["tab"]
        for k in ["d", "d", "s", "space"]:
            code, v = call(url, "/key", {"key": k, "tab": tab})
            assert code == 200
        assert v["rows"] == 4 and v["step"] == 4
        _, second = call(url, "/claim", {})
        code, err = call(url, "/key", {"key": "a", "tab": tab})
        assert code == 409 and "another tab" in err["error"]
        tab = second["tab"]
        assert call(url, "/key", {"key": "a", "tab": tab})[1]["rows"] == 5
        assert call(url, "/key", {"key": "nope", "tab": tab})[1]["rows"] == 5
        # a second recorder on the same dataset
        ok = tmp_path / "ok.txt"
        ok.write_text("d\n")
        line = one_line_error(run("play.py", "human", "--out", str(out), "--script", str(ok)))
        assert "being recorded by" in line
        # a port in use
        port = int(url.rsplit(":", 1)[1].strip("/"))
        line = one_line_error(run("play.py", "human", "--out", str(tmp_path / "d2"), "--port",
                                  str(port)))
        assert f"{port}" in line and "--port" in line and not (tmp_path / "d2").exists()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    p, url = start_server(out)
    port = int(url.rsplit(":", 1)[1].strip("/"))
    try:
        _, v = call(url, "/claim", {})
        assert (v["rows"], v["step"], v["episode_id"], v["seed"]) == (5, 5, 0, 3)
        assert call(url, "/key", {"key": "w", "tab": v["tab"]})[1]["rows"] == 6
        code, err = call(url, "/new", {"seed": "../etc", "tab": v["tab"]})
        assert code == 400 and "seed" in err["error"]
        tab = v["tab"]
        code, v = call(url, "/new", {"seed": 11, "tab": tab})
        assert code == 200 and (v["episode_id"], v["seed"], v["step"]) == (1, 11, 0)
        assert call(url, "/key", {"key": "d", "tab": tab})[1]["rows"] == 7
        # refused requests (their connections closed by the server: TIME_WAIT on its port)
        for _ in range(3):
            assert call(url, "/state", Host=f"evil.example:{port}")[0] == 403
            assert call(url, "/claim", {}, **{"Content-Type": "text/plain"})[0] == 415
        for wait in (0.0, 0.05, 0.2):  # gone before, while and after the answer is made
            c = socket.create_connection(("127.0.0.1", port))
            c.sendall(f"GET /state HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            time.sleep(wait)
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()  # a reset, as a tab closed mid-answer
        assert call(url, "/state")[0] == 200
        os.killpg(p.pid, signal.SIGINT)
        said, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, said
    assert "Traceback" not in said and "Error" not in said, said
    p, again = start_server(out, port=port)  # (failed with "Address already in use")
    try:
        assert again == url and call(again, "/state")[0] == 200
        os.killpg(p.pid, signal.SIGTERM)
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    cols = read_all(out)
    assert cols["t"].tolist() == list(range(7))
    assert cols["step"].tolist() == list(range(6)) + [0]
    assert cols["episode_id"].tolist() == [0] * 6 + [1]
    from craftax.craftax_classic.constants import Action

    assert cols["action"].tolist() == [Action[a].value for a in
                                       ["RIGHT", "RIGHT", "DOWN", "DO", "LEFT", "UP", "RIGHT"]]
    from fused.envspec import spec
    from fused.rl.obs_codec import ObsCodec

    obs = ObsCodec(spec(ENV)).decode(np, cols)
    same_obs(obs[:6], craftax_reference(3, cols["action"][:6]))
    same_obs(obs[6:], craftax_reference(11, cols["action"][6:]))
    card = json.loads((out / "card.json").read_text())
    assert card["human"]["episodes"] == {"0": 3, "1": 11}
    assert (card["counts"]["rows"], card["counts"]["episodes"]) == (7, 2)
    assert run("label.py", "verify", "--data", str(out)).returncode == 0


def _have(kind: str) -> bool:
    from browser import BROWSERS

    return BROWSERS[kind]() is not None


@pytest.mark.slow
@pytest.mark.parametrize("kind", [
    pytest.param("chromium", marks=pytest.mark.skipif(
        not _have("chromium"), reason="no chromium (apt-get install chromium)")),
    pytest.param("firefox", marks=pytest.mark.skipif(
        not _have("firefox"), reason="no firefox (apt-get install firefox-esr)"))])
def test_page_in_a_headless_browser_records_the_keys_pressed(tmp_path, kind):
    """The page in real browsers (Chromium over DevTools, Firefox over WebDriver BiDi): keys
    pressed, the first ones typed at once, change the frame, the text and the step, and the
    dataset holds the actions those keys name, in order; the same keys from --script record
    the same rows."""
    from browser import open_page

    keys = ["d", "space", "space", "s", "tab", "w", "1"]
    out = tmp_path / "data"
    p, url = start_server(out, "--seed", "2")
    b = None
    try:
        b = open_page(kind, url, height=1040)
        b.wait("typeof lastView !== 'undefined' && lastView !== null"
               " && document.getElementById('frame').complete")
        frames = [b.eval("document.getElementById('frame').src")]
        for k in keys[:3]:  # typed while the steps before are on their way: queued, in order
            b.press(k)
        b.wait("lastView.rows >= 3", 60)
        for k in keys[3:]:
            n = b.eval("lastView.rows")
            b.press(k)
            b.wait(f"lastView.rows > {n}", 60)
            frames.append(b.eval("document.getElementById('frame').src"))
        assert b.eval("lastView.step") == len(keys)
        assert b.eval("document.getElementById('text').textContent").startswith("Map")
        assert len(set(frames)) > 1
        shot = b.screenshot()
        assert shot[:8] == b"\x89PNG\r\n\x1a\n"
        if os.environ.get("CRAFTAX_SCREENSHOT") and kind == "chromium":  # the README's picture
            Path(os.environ["CRAFTAX_SCREENSHOT"]).write_bytes(shot)
        # 40 keys at once: one on its way, 16 waiting, 23 not played, said where it stays
        b.eval("for (let i = 0; i < 40; i++) document.dispatchEvent("
               "new KeyboardEvent('keydown', {key: 's'})); 0")
        b.wait(f"lastView.rows === {len(keys) + 17} && !busy", 120)
        assert b.eval("document.getElementById('dropped').hidden") is False
        assert b.eval("document.getElementById('dropped').textContent").startswith(
            "23 keys not played (the last: s)")
    finally:
        if b is not None:
            b.close()
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=60)
    from craftax.craftax_classic.constants import Action

    cols = read_all(out)
    assert cols["action"].tolist() == [Action[a].value for a in ["RIGHT", "DO", "DO", "DOWN",
                                                                 "SLEEP", "UP",
                                                                 "MAKE_WOOD_PICKAXE"]
                                       + ["DOWN"] * 17]
    cols = {k: v[:len(keys)] for k, v in cols.items()}
    script = tmp_path / "keys.txt"
    script.write_text("\n".join(keys) + "\n")
    human("--out", str(tmp_path / "scripted"), "--script", str(script), "--seed", "2")
    again = read_all(tmp_path / "scripted")
    for k in ("obs_bits", "obs_aux", "action", "reward", "step", "episode_id"):
        np.testing.assert_array_equal(again[k], cols[k])


@pytest.mark.slow
def test_golden_shots_are_turns_of_the_chat_template_token_for_token(played):
    """`play.py llm --examples E --shots N`: N recorded steps (not NOOP, evenly spaced) become
    user / assistant turns after the system turn, in the prefix encoded once; the prefix and an
    assembled prompt equal the official chat template of that conversation, encoded at once."""
    import jax.numpy as jnp

    from fused.human.golden import shots
    from fused.llm.config import ModelConfig
    from fused.llm.player import PlayerSettings, assemble, make_player
    from fused.text.prompt import PLAY_INSTRUCTION, play_system
    from fused.text.render import render_tokens
    from llm_jax.tokenizer import load_tokenizer

    turns, where = shots(played / "golden", 2, ENV)
    lines = [json.loads(x) for x in next((played / "golden").iterdir()).joinpath(
        "steps.jsonl").read_text().splitlines()]
    assert [w[1] for w in where] == [0, 6]  # the first and the last of 7 steps
    assert turns[1] == (lines[6]["observation"], "Action: 6:SLEEP")
    player = make_player(ModelConfig(), PlayerSettings(history=0, max_new_tokens=8), ENV,
                         rows=1, shots=tuple(turns))
    from fused.envspec import spec
    from fused.rl.obs_codec import ObsCodec
    from fused.text.format import render_text

    obs = ObsCodec(spec(ENV)).decode(np, read_all(played / "data"))[3:4]
    tokens, lengths = render_tokens(player.renderer, jnp.asarray(obs))
    prompt, n = assemble(player, player.policy.carry(1), tokens, lengths)
    ours = list(player.parts.prefix) + list(np.asarray(prompt[0, :int(n[0])]))
    msgs = [{"role": "system", "content": play_system(ENV)}]
    for o, r in turns:
        msgs += [{"role": "user", "content": f"{o}\n\n{PLAY_INSTRUCTION}"},
                 {"role": "assistant", "content": r}]
    msgs.append({"role": "user", "content": f"{render_text(player.renderer.layout, obs[0])}"
                                            f"\n\n{PLAY_INSTRUCTION}"})
    tok = load_tokenizer()
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, enable_thinking=False)
    assert ours == tok.encode(text)
    assert "Action: 2:RIGHT" in tok.decode(player.parts.prefix)
    with pytest.raises(Exception, match="--shots 8"):
        shots(played / "golden", 8, ENV)
    # a line of another tool's (no env) is skipped, not a traceback
    game = next((played / "golden").iterdir())
    with open(game / "steps.jsonl", "a") as f:
        f.write(json.dumps({"observation": "x", "action": 1}) + "\n")
    assert shots(played / "golden", 2, ENV) == (turns, where)
    # the pixel env reads the same text: its player takes the same shots
    assert shots(played / "golden", 2, "Craftax-Classic-Pixels-v1") == (turns, where)


@pytest.mark.slow
def test_play_llm_with_golden_shots_records_them_and_refuses_bad_input(played, tmp_path):
    """`play.py llm --examples E --shots 3` on the pixel twin of the env the shots were
    recorded on (the LLM reads the same text; the recording stores frames). It plays with
    --thinking and replies of 4 tokens: every thought is cut, and cut thoughts are invalid
    actions and counted (test_player's check of --thinking, on this play rather than one of
    its own)."""
    from fused.data.store import Dataset

    run_ = tmp_path / "r"
    p = run("play.py", "llm", "--env.name", "Craftax-Classic-Pixels-v1", "--episodes", "2",
            "--max-steps", "2", "--max-new-tokens", "4", "--thinking", "--examples",
            str(played / "golden"), "--shots", "3", "--out-dir", str(tmp_path), "--run-name",
            "r", "--record", str(tmp_path / "played"))
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads((run_ / "eval.json").read_text())
    assert out["llm"]["shots"] == 3 and out["episodes"] == 2
    assert out["llm"]["thinking"]
    assert out["unfinished_thought_rate"] == out["invalid_action_rate"] == 1.0
    ds = Dataset(tmp_path / "played")
    assert ds.read(ds.shard_names()[0], ["frame"])["frame"].shape == (4, 63, 63, 3)
    used = json.loads((run_ / "shots.json").read_text())
    assert [w[1] for w in used["from"]] == [0, 3, 6] and len(used["turns"]) == 3
    assert "--shots 9" in one_line_error(run("play.py", "llm", "--examples",
                                             str(played / "golden"), "--shots", "9",
                                             "--out-dir", str(tmp_path)))
    assert "neither" in one_line_error(run("play.py", "llm", "--shots", "2", "--out-dir",
                                           str(tmp_path)))
