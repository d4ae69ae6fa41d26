"""scripts/machine_speed.py, with which `.ci/run` judges the suite's time: the suite's seconds
scaled by the reference job's seconds on the budget's machine over its seconds here (the mean of
its runs), against the limit; bad input is one line."""

import subprocess
import sys

from conftest import ROOT

SCRIPT = str(ROOT / "scripts/machine_speed.py")


def judge(*args):
    return subprocess.run([sys.executable, SCRIPT, "judge", *args], capture_output=True,
                          text=True, timeout=60)


def test_judge_scales_the_suite_by_the_machines_speed():
    import importlib.util

    spec = importlib.util.spec_from_file_location("machine_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ref = module.REFERENCE_SECONDS
    # a machine twice as slow as the budget's (runs of 1.5x and 2.5x): 2,400 s here is 1,200 s
    p = judge("--suite", "2400", "--speed", str(1.5 * ref), str(2.5 * ref), "--limit", "1200")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("suite: 2400 s here;") and "so 1200 s there" in p.stdout, p.stdout
    p = judge("--suite", "2404", "--speed", str(2 * ref), "--limit", "1200")
    assert p.returncode == 1 and "so 1202 s there (limit 1200 s)" in p.stdout, p.stdout
    assert p.stderr.strip().splitlines() == [
        "error: the suite would take 1202 s on the budget's machine, over its 1200 s budget; "
        "see --durations above"]
    # a faster machine: a stricter limit here
    p = judge("--suite", "1000", "--speed", str(ref / 2), "--limit", "1200")
    assert p.returncode == 1 and "so 2000 s there" in p.stdout, p.stdout
    p = judge("--suite", "1000", "--speed", "0")
    assert p.returncode == 1 and p.stderr.strip() == (
        "error: --speed [0.0]: seconds must be positive")
