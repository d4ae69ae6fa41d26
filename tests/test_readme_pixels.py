"""The README walkthrough's frames part, run as written at smoke sizes (beside the rest,
tests/test_readme.py, so the two run in parallel): PPO with the CNN (finite losses,
checkpoints), its dataset stored as bytes, AWR on it streamed in windows and evaluated, the
probe rendering its edited states as frames. The walkthrough runs once for the module; its
dataset of frames is also the one the offline commands' checks on frames read
(test_a_dataset_of_frames_through_offline), rather than a second `label.py generate` of its
own."""

import json
import sys

import numpy as np
import pytest

from command_runner import run_command
from conftest import ROOT, subprocess_env
from test_readme import run_walkthrough


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory):
    """The folder the walkthrough's frames part ran in, its commands in order, as written
    (each must exit 0): runs/px, data/px, runs/awr-px."""
    folder = tmp_path_factory.mktemp("readme-pixels")
    run_walkthrough(folder, pixels=True)
    return folder


@pytest.mark.slow
def test_readme_frames_walkthrough_runs_as_written(walkthrough):
    """The frames part's commands (the `walkthrough` fixture) run as written; then what they
    wrote: PPO's metrics and checkpoint, the probe's edits, the dataset's frames as bytes, the
    AWR run's config and evaluation."""
    from fused.data.store import Dataset

    tmp_path = walkthrough
    rows = [json.loads(x) for x in (tmp_path / "runs/px/metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(np.isfinite(r["loss/value"]) for r in rows)
    assert [c.name for c in (tmp_path / "runs/px/checkpoints").iterdir()] == ["2"]
    edits = json.loads((tmp_path / "runs/px/probe.json").read_text())["edits"]
    assert len(edits) >= 6 and all(np.isfinite(e["real"]["value_change"]) for e in edits.values())
    assert sum(abs(e["real"]["value_change"]) > 1e-4 for e in edits.values()) >= len(edits) // 2
    px = Dataset(tmp_path / "data/px")
    assert px.card()["env"] == "Craftax-Classic-Pixels-v1"
    assert px.read(px.manifest()["shards"][0]["name"], ["frame"])["frame"].dtype == np.uint8
    cfg = json.loads((tmp_path / "runs/awr-px/config.json").read_text())
    assert cfg["agent"]["policy"]["kind"] == "auto" and cfg["device_rows"] == 200
    assert json.loads((tmp_path / "runs/awr-px/eval.json").read_text())["episodes"] == 2


@pytest.mark.slow
def test_a_dataset_of_frames_through_offline(walkthrough, tmp_path):
    """label.py generate on Craftax-Classic-Pixels (the walkthrough's data/px: 8 envs x 64
    steps of its PPO policy, shards of 100 rows) writes frames as uint8 in compressed chunks;
    verify and returns take it as any dataset; offline.py bc trains the CNN on it, streamed
    in windows; a text label set of frames is refused in one line. (AWR on frames, streamed,
    and its evaluation: the walkthrough's.) Moved from tests/test_pixels.py, whose random-play
    dataset of its own cost one more `label.py generate` (~16 CPU s)."""
    import zarr
    from PIL import Image

    data = walkthrough / "data/px"

    def run(script, *args, ok=True):
        p = run_command([sys.executable, str(ROOT / script), *args], env=subprocess_env(),
                        capture_output=True, text=True, timeout=600)
        assert (p.returncode == 0) == ok, p.stdout[-1500:] + p.stderr[-3000:]
        return p

    manifest = json.loads((data / "manifest.json").read_text())
    rows = sum(s["rows"] for s in manifest["shards"])
    assert rows == 8 * 64 and [s["rows"] for s in manifest["shards"]] == [100] * 5 + [12]
    shard = data / "shards" / manifest["shards"][0]["name"]
    frame = zarr.open_group(str(shard), mode="r")["frame"]
    assert frame.dtype == np.uint8 and frame.shape == (100, 63, 63, 3)  # pictures, as stored
    stored = sum(f.stat().st_size for f in (shard / "frame").rglob("*") if f.is_file())
    assert stored < frame.nbytes / 2  # compressed: frames repeat their textures
    x = np.asarray(frame[:])
    assert x.std() > 10 and (x[1:] != x[:-1]).any(axis=(1, 2, 3)).mean() > 0.5  # they move
    assert Image.fromarray(x[0]).size == (63, 63)  # an image to Pillow as it comes
    card = json.loads((data / "card.json").read_text())
    assert card["format"] == "craftax-fused/trajectories/v2"
    assert card["observation"] == {"frame": {"shape": [63, 63, 3], "dtype": "uint8",
                                             "layout": "HWC RGB, round(255 x)"}}
    run("label.py", "verify", "--data", str(data))
    run("label.py", "returns", "--data", str(data))  # (as the walkthrough's, gamma 0.99: kept)
    run("offline.py", "bc", "smoke", "--data", str(data), "--out-dir", str(tmp_path),
        "--run-name", "bc", "--num-updates", "4", "--updates-per-chunk", "2",
        "--checkpoint-every-updates", "2", "--device-rows", "128", "--batch-size", "16")
    cfg = json.loads((tmp_path / "bc" / "config.json").read_text())
    assert cfg["agent"]["env"]["name"] == "Craftax-Classic-Pixels-v1"
    metrics = [json.loads(x) for x in
               (tmp_path / "bc" / "metrics.jsonl").read_text().splitlines()]
    assert [m["update"] for m in metrics] == [1, 2, 3, 4]
    assert all(np.isfinite(m["loss/actor"]) for m in metrics)
    p = run("label.py", "label", "--data", str(data), "--name", "t", "--llm.random-model",
            "tiny", ok=False)
    assert "no text observation" in p.stderr and "Traceback" not in p.stderr
