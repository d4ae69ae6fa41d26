"""scripts/machine_speed.py, with which `.ci/run` judges the suite's time: the suite's seconds
scaled by the reference job's seconds on the budget's machine over its mean seconds here, against
the budget (a warning over it, a failure past --fail-over times it); unscaled, said so, where the
job gave no time; bad input is one line."""

import contextlib
import importlib.util
import io
import subprocess
import sys

from conftest import ROOT

SCRIPT = str(ROOT / "scripts/machine_speed.py")
spec = importlib.util.spec_from_file_location("machine_speed", SCRIPT)
machine_speed = importlib.util.module_from_spec(spec)
spec.loader.exec_module(machine_speed)


def judge(*args) -> subprocess.CompletedProcess:
    """`python scripts/machine_speed.py judge ARGS`, run in this process (its output, and its
    exit status as the interpreter makes it of `sys.exit`'s argument: a message is printed to
    stderr, status 1)."""
    out, err = io.StringIO(), io.StringIO()
    command = [SCRIPT, "judge", *args]
    argv, sys.argv = sys.argv, command
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            machine_speed.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if isinstance(e.code, str):
            err.write(e.code + "\n")
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(command, code, out.getvalue(), err.getvalue())


def test_judge_scales_the_suite_by_the_machines_speed():
    ref = machine_speed.REFERENCE_SECONDS
    # a machine twice as slow as the budget's (runs of 1.5x and 2.5x): 2,400 s here is 1,200 s
    p = judge("--suite", "2400", "--speed", str(1.5 * ref), str(2.5 * ref), "--limit", "1200")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout.splitlines() == [
        f"suite: 2400 s here; the reference job took {1.5 * ref:.1f}, {2.5 * ref:.1f} s "
        f"({ref:.1f} s on the budget's machine), so 1200 s there (budget 1200 s)"]
    p = judge("--suite", "2404", "--speed", str(2 * ref), "--limit", "1200")
    assert p.returncode == 1 and "so 1202 s there (budget 1200 s)" in p.stdout, p.stdout
    assert p.stderr.strip().splitlines() == [
        "error: the suite would take 1202 s on the budget's machine, 2 s (0.2%) over its 1200 s "
        "budget; see --durations above"]
    # past the budget but within --fail-over: a warning, and CI passes; at it, still a warning
    for suite, line in (("2640", "1320 s on the budget's machine, 120 s (10.0%) over"),
                        ("2880", "1440 s on the budget's machine, 240 s (20.0%) over")):
        p = judge("--suite", suite, "--speed", str(2 * ref), "--limit", "1200", "--fail-over",
                  "1.2")
        assert p.returncode == 0 and p.stdout.splitlines()[1] == (
            f"warning: the suite would take {line} its 1200 s budget; see --durations above"), \
            p.stdout
    p = judge("--suite", "2904", "--speed", str(2 * ref), "--limit", "1200", "--fail-over", "1.2")
    assert p.returncode == 1 and p.stderr.strip() == (
        "error: the suite would take 1452 s on the budget's machine, 252 s (21.0%) over its "
        "1200 s budget (CI fails past 20%); see --durations above"), p.stderr
    # a faster machine: a stricter limit here
    p = judge("--suite", "1000", "--speed", str(ref / 2), "--limit", "1200")
    assert p.returncode == 1 and "so 2000 s there" in p.stdout, p.stdout
    # no time from the job (it failed): this machine's seconds as they are, said so
    p = judge("--suite", "1300", "--speed", "--limit", "1200", "--fail-over", "1.2")
    assert p.returncode == 0 and p.stdout.splitlines()[0] == (
        "suite: 1300 s here (budget 1200 s); warning: the reference job gave no time, so this "
        "machine's seconds are judged as the budget's machine's"), p.stdout
    for args, line in ((["--speed", "0"], "error: --speed [0.0]: seconds must be positive"),
                       (["--suite", "-5"], "error: --suite -5: seconds can not be negative"),
                       (["--limit", "0"], "error: --limit 0: seconds must be positive"),
                       (["--speed", "30", "--fail-over", "0.9"],
                        "error: --fail-over 0.9: at least 1 (the budget itself)")):
        p = judge("--suite", "1000", *args)
        assert p.returncode == 1 and p.stderr.strip() == line, p.stderr


def as_from_a_terminal():
    """SIGINT at its default, as a terminal's shell starts a command (the suite itself may run
    with it ignored, as a background job of a script does, and a Python started so ignores
    Ctrl-C)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_is_one_line_and_leaves_no_job_running():
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) as soon as the jobs have
    started (while their Python is still starting up): one line, exit 130, and neither job
    process left behind."""
    import os
    import signal
    import time

    p = subprocess.Popen([sys.executable, SCRIPT], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=as_from_a_terminal)
    jobs = []
    for _ in range(100):  # (the jobs started: the script's children)
        out = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                             text=True).stdout.split()
        if len(out) == 2:
            jobs = [int(x) for x in out]
            break
        time.sleep(0.05)
    assert len(jobs) == 2, jobs
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and out == "", (p.returncode, out)
    assert err.strip().splitlines() == ["interrupted: the reference job stopped, nothing timed"]
    time.sleep(0.5)
    assert not [j for j in jobs if os.path.exists(f"/proc/{j}")
                and open(f"/proc/{j}/stat").read().split()[2] != "Z"], jobs


def test_ctrl_c_while_a_job_starts_stops_every_job():
    """Ctrl-C delivered while a job is being started (inside `subprocess.Popen`, made certain
    here by sending it from there): the same one line and exit 130, and no job left running
    (looked up by session, which an orphaned job keeps)."""
    import time

    code = f"""
import os, runpy, signal, subprocess, sys
real = subprocess.Popen
class Popen(real):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
subprocess.Popen = Popen
sys.argv = [{SCRIPT!r}]
runpy.run_path({SCRIPT!r}, run_name="__main__")
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=as_from_a_terminal)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and out == "", (p.returncode, out, err)
    assert err.strip().splitlines() == ["interrupted: the reference job stopped, nothing timed"]
    time.sleep(0.5)
    ps = subprocess.run(["ps", "-o", "pid=,stat=", "-s", str(p.pid)], capture_output=True,
                        text=True).stdout.splitlines()
    left = [line for line in ps if line.split() and not line.split()[1].startswith("Z")]
    assert not left, left
