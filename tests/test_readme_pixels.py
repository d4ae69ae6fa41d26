"""The README walkthrough's frames part, run as written at smoke sizes (beside the rest,
tests/test_readme.py, so the two run in parallel): PPO with the CNN (finite losses,
checkpoints), its dataset stored as bytes, AWR on it streamed in windows and evaluated, the
probe rendering its edited states as frames."""

import json

import numpy as np
import pytest

from test_readme import run_walkthrough


@pytest.mark.slow
def test_readme_frames_walkthrough_runs_as_written(tmp_path):
    from fused.data.store import Dataset

    run_walkthrough(tmp_path, pixels=True)
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
