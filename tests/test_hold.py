"""One run at a time on this machine (lab.host.places.hold): a second run waits for the
first (saying which run holds it and how long it has waited) or refuses with --no-wait; a
holder that died frees it, and what it left running is stopped before the next run
starts; a --resume after a SIGKILLed bench records each run once. Real processes, real
benches: two `invoke bench --local` started one second apart, one killed with SIGKILL."""
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from lab.common import results
from lab.host.errors import BenchError
from lab.host.places import hold
from lab.host.request.plan import record_key

REPO = Path(__file__).resolve().parent.parent

HOLDER = """
import sys, time
from lab.host.places import hold
with hold.hold("this-machine", sys.argv[1], what="bench", place="local"):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
"""


@pytest.fixture
def holds(tmp_path, monkeypatch):
    """A hold folder shared by this test's processes (not the session's own)."""
    folder = tmp_path / "holds"
    monkeypatch.setenv(hold.HOLD_DIR_VAR, str(folder))
    return folder


def start_holder(run_id: str, seconds: float) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, run_id, str(seconds)], cwd=REPO,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_holder_waits_saying_who_holds_it_then_refuses_without_waiting(holds):
    first = start_holder("run-a", 3)
    lines = []
    t0 = time.monotonic()
    with hold.hold("this-machine", "run-b", echo=lines.append, poll_s=0.1):
        waited = time.monotonic() - t0
    first.wait()
    assert waited >= 2.5                         # the first held it for 3 s
    assert lines and "bench run-a (process" in lines[0] and f"{first.pid}" in lines[0]
    assert "waited" in lines[0] and "--no-wait" in lines[0]
    # --no-wait: one sentence naming the run that holds it, at once
    second = start_holder("run-c", 30)
    try:
        with pytest.raises(BenchError) as e:
            with hold.hold("this-machine", "run-d", wait=False):
                pass
        assert "run-c" in str(e.value) and "--no-wait" in str(e.value) and "\n" not in str(e.value)
        assert hold.holder_now("this-machine").run_id == "run-c"
    finally:
        second.kill()
        second.wait()
    # a holder killed with SIGKILL frees it at once (the kernel drops its flock)
    assert hold.holder_now("this-machine") is None
    with hold.hold("this-machine", "run-e", wait=False):
        assert hold.holder_now("this-machine").run_id == "run-e"     # held here (another fd)


def test_the_next_holder_stops_what_a_killed_holder_left_running(holds):
    """A holder killed mid-run leaves its launched processes (they carry its token); the
    next holder stops them before its own start. A process of a holder that ended
    properly is not touched."""
    script = """
import subprocess, sys, time
from lab.host.places import hold
with hold.hold("this-machine", "run-k", what="bench", place="local"):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(child.pid, flush=True)
    time.sleep(60)
"""
    p = subprocess.Popen([sys.executable, "-c", script], cwd=REPO,
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(p.stdout.readline())
    os.kill(p.pid, signal.SIGKILL)       # the holder alone, as `kill -9 <bench>` does
    p.wait()
    assert hold._alive(child)
    lines = []
    with hold.hold("this-machine", "run-n", echo=lines.append):
        assert not hold._alive(child)
    assert any("stopping 1 process(es)" in ln and "run-k" in ln for ln in lines), lines
    # run-n ended properly: the next holder stops nothing
    lines.clear()
    with hold.hold("this-machine", "run-m", echo=lines.append):
        pass
    assert not lines


def bench(results_dir, *extra, dry=False, **popen):
    argv = [sys.executable, "-m", "invoke", "bench", "--local", "--framework", "ddp", "--backend", "gloo",
            "--data", "synthetic", "--results-dir", str(results_dir), *extra]
    if dry:         # the command line only
        return argv
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **popen)


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_two_benches_started_a_second_apart_run_one_after_the_other(holds, tmp_path):
    """The first a sweep of two combinations: the second bench waits for the whole sweep
    (not for its first combination), and a third with --no-wait refuses in one sentence,
    recording nothing."""
    first = bench(tmp_path / "r", "--np", "2", "--compression", "none,fp16", "--max-steps", "60",
                  "--run-id", "first")
    time.sleep(1)
    second = bench(tmp_path / "r", "--np", "2", "--max-steps", "60", "--run-id", "second")
    time.sleep(1)
    third = subprocess.run([*bench(tmp_path / "r", dry=True), "--np", "2", "--run-id", "third", "--no-wait",
                            "--compression", "none,fp16"], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
    out1, _ = first.communicate(timeout=300)
    out2, _ = second.communicate(timeout=300)
    assert first.returncode == 0 and second.returncode == 0, out1[-1500:] + out2[-1500:]
    assert "waiting for this machine: bench first (process" in out2
    a = results.read_records(tmp_path / "r" / "first" / results.RESULTS_FILE)[0]
    b = results.read_records(tmp_path / "r" / "second" / results.RESULTS_FILE)[0]
    assert [r["status"] for r in a + b] == ["ok", "ok", "ok"]
    assert when(b[0]["started_at"]) >= max(when(r["finished_at"]) for r in a)
    assert third.returncode == 2, third.stdout + third.stderr
    assert "bench first (process" in third.stderr and "--no-wait" in third.stderr
    assert len(third.stderr.strip().splitlines()) == 1, third.stderr
    assert not (tmp_path / "r" / "third" / results.RESULTS_FILE).exists()


def test_resume_after_a_sigkilled_bench_stops_its_ranks_and_records_each_run_once(holds, tmp_path):
    argv = ("--np", "1,2", "--repeat", "2", "--max-steps", "150", "--run-id", "swept")
    rfile = tmp_path / "r" / "swept" / results.RESULTS_FILE
    killed = bench(tmp_path / "r", *argv)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(results.read_records(rfile)[0]) < 1:
        time.sleep(0.2)
    assert results.read_records(rfile)[0], "the first run never recorded"
    time.sleep(2)       # into the next launch: its ranks are running when bench dies
    token = json.loads((holds / "this-machine.hold").read_text())["token"]
    killed.kill()       # SIGKILL to bench alone: its launcher and ranks run on
    killed.wait()
    left = hold.left_processes(token)
    assert left, "no process of the killed bench was left running: the test saw nothing"
    resumed = bench(tmp_path / "r", *argv, "--resume")
    out, _ = resumed.communicate(timeout=400)
    assert resumed.returncode == 0, out[-2000:]
    assert not [p for p in left if hold._alive(p)]
    assert "process(es) that bench swept" in out and "left running when it was killed" in out
    recs = results.read_records(rfile)[0]
    keys = [record_key(r) for r in recs if r["status"] == "ok"]
    assert len(keys) == len(set(keys)) == 4, [(r["status"], r["world"]["np"], r["config"]["repeat"])
                                              for r in recs]


def test_invoke_down_refuses_while_a_run_holds_the_cluster(holds):
    """`invoke down` while a run on the cluster holds this machine: one sentence naming the
    run, exit 2, nothing removed (no engine is asked). A local run does not stop it."""
    cluster_run = HOLDER.replace('place="local"', 'place="cluster"')
    p = subprocess.Popen([sys.executable, "-c", cluster_run, "run-on-nodes", "60"], cwd=REPO,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        cp = subprocess.run([sys.executable, "-m", "invoke", "down"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
        assert cp.returncode == 2, cp.stdout + cp.stderr
        said = cp.stderr.strip()
        assert "run-on-nodes" in said and "--force" in said and "\n" not in said
    finally:
        p.kill()
        p.wait()
    assert hold.holder_now("this-machine") is None
