"""Sweeps: lists of frameworks, back ends, compressions and node counts run as a cross
product into one results directory; what cannot run here is skipped with the reason
recorded; --resume runs only what has no ok record yet."""
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lab.common import results
from lab.host.errors import BenchError
from lab.host.request import checks as request
from lab.host.request import plan
from lab.host.settings import BenchSettings

REPO = Path(__file__).resolve().parent.parent


def test_lists_are_checked_before_anything_runs():
    assert request.parse_list("backend", "gloo, mpi,gloo", ("gloo", "mpi", "nccl")) == ["gloo", "mpi"]
    with pytest.raises(BenchError, match="unknown --compression 'zip'"):
        request.parse_list("compression", "none,zip", ("none", "fp16"))
    with pytest.raises(BenchError, match="--nodes takes whole numbers"):
        request.parse_list("nodes", "1,two")


def test_the_plan_is_the_cross_product():
    plans = plan.combinations(BenchSettings(np=[1, 2]), {
        "framework": ["horovod", "ddp"], "backend": ["gloo", "mpi", "nccl"], "compression": ["none", "int8"]})
    assert len(plans) == 12 and all(p.np == [1, 2] for p in plans)
    assert {(p.framework, p.backend, p.compression) for p in plans} == {
        (f, b, c) for f in ("horovod", "ddp") for b in ("gloo", "mpi", "nccl") for c in ("none", "int8")}


def test_a_sweep_crosses_the_strategy_first_and_the_nodes_last():
    """The order the runs happen in (and the report's rows first appear): the strategy varies
    slowest, then the framework, back end, compression, and the nodes fastest."""
    plans = plan.combinations(BenchSettings(np=[1]), {
        "nodes": [1, 2], "compression": ["none", "fp16"], "strategy": ["ddp", "zero1"]})
    assert [(p.strategy, p.compression, p.nodes) for p in plans] == [
        (s, c, n) for s in ("ddp", "zero1") for c in ("none", "fp16") for n in (1, 2)]


def sweep(tmp_path, *args):
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--np", "1", "--framework",
                         "ddp", "--max-steps", "8", "--warmup-steps", "2", "--results-dir", str(tmp_path),
                         "--run-id", "sweep", *args], cwd=REPO, capture_output=True, text=True, timeout=600)
    return cp, results.read_records(tmp_path / "sweep" / results.RESULTS_FILE)[0]


def test_a_sweep_skips_what_cannot_run_and_resumes_what_is_missing(tmp_path):
    cp, recs = sweep(tmp_path, "--backend", "gloo,nccl", "--compression", "none,fp16")
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    status = sorted((r["config"]["backend"], r["config"]["compression"], r["status"]) for r in recs)
    assert status == [("gloo", "fp16", "ok"), ("gloo", "none", "ok"),
                      ("nccl", "fp16", "skipped"), ("nccl", "none", "skipped")]
    skipped = [r for r in recs if r["status"] == "skipped"]
    assert all("GPUs only" in r["error"]["reason"] for r in skipped)
    assert "-- skipped ddp over nccl, compression none" in cp.stdout     # printed too
    # ... and under the table once, grouped by the reason, not as rows of it
    assert "SKIPPED" not in cp.stdout
    [line] = [x for x in cp.stdout.splitlines() if x.startswith("- ") and "GPUs only" in x]
    assert "2 combinations (compression none, fp16" in line, line
    before = [r["record_id"] for r in recs]

    cp, recs = sweep(tmp_path, "--backend", "gloo", "--compression", "none,fp16,int8", "--resume")
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    assert "ddp over gloo, compression none, 1 node(s): already recorded" in cp.stdout
    assert "ddp over gloo, compression fp16, 1 node(s): already recorded" in cp.stdout
    new = [r for r in recs if r["record_id"] not in before]
    assert [(r["config"]["compression"], r["status"]) for r in new] == [("int8", "ok")]
    assert [r["record_id"] for r in recs][:4] == before                 # nothing rewritten


def test_resume_needs_the_run_id(tmp_path):
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--resume", "--results-dir",
                         str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert cp.returncode == 2 and "--run-id" in cp.stderr and "Traceback" not in cp.stderr


def test_a_sweep_over_nodes_is_checked_where_its_most_nodes_run(tmp_path):
    """--nodes 1,2 runs its 2-node combinations on the simulated cluster: --local is
    refused there, and a --link spec no link takes is the request's error, both before
    anything runs (the 1-node baseline, unshaped: tests/test_plan.py)."""
    for args, words in [(["--local", "--link", "1gbit"], "--local is not honoured by the simulated cluster"),
                        (["--link", "1zbit"], "--link")]:
        bad = subprocess.run([sys.executable, "-m", "invoke", "bench", "--np", "1", "--framework", "ddp",
                              "--nodes", "1,2", *args, "--results-dir", str(tmp_path), "--run-id", "bad"],
                             capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr and words in bad.stderr, bad.stderr
        assert not (tmp_path / "bad").exists()


def test_repeats_are_interleaved_counted_by_resume_and_each_has_its_start_up(tmp_path):
    cp, recs = sweep(tmp_path, "--backend", "gloo", "--compression", "none,fp16", "--repeat", "2")
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    # Every combination once, then every one again.
    assert [(r["config"]["compression"], r["config"]["repeat"]) for r in recs] == [
        ("none", 0), ("fp16", 0), ("none", 1), ("fp16", 1)]
    assert re.search(r"-- run 1 of 4 \(ddp over gloo, none, np 1, repeat 1 of 2\): \d+ s so far\n", cp.stdout)
    assert re.search(r"-- run 4 of 4 \(ddp over gloo, fp16, np 1, repeat 2 of 2\): .* so far, "
                     r"about .* left", cp.stdout)
    for r in recs:
        f = r["figures"]
        phases = f["startup_phases_s"]
        assert set(phases) == {"launcher", "imports", "rendezvous", "data", "setup", "warmup"}
        assert all(v is not None and v >= 0 for v in phases.values())
        # The phases are consecutive spans from launch to the first timed step.
        assert sum(phases.values()) == pytest.approx(f["startup_s"], abs=0.01)
    before = [r["record_id"] for r in recs]
    # --resume with a third repeat runs only repeat 3 of each combination.
    cp, recs = sweep(tmp_path, "--backend", "gloo", "--compression", "none,fp16", "--repeat", "3",
                     "--resume")
    assert cp.returncode == 0, cp.stdout[-2000:] + cp.stderr[-2000:]
    assert "ddp over gloo, compression none, 1 node(s), repeat 2: already recorded" in cp.stdout
    new = [r for r in recs if r["record_id"] not in before]
    assert [(r["config"]["compression"], r["config"]["repeat"]) for r in new] == [("none", 2), ("fp16", 2)]
    assert "-- run 2 of 2" in cp.stdout


def test_repeat_must_be_at_least_one(tmp_path):
    cp, _ = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--repeat", "0",
                            "--results-dir", str(tmp_path)], cwd=REPO, capture_output=True,
                           text=True, timeout=120), None
    assert cp.returncode == 2 and "--repeat is how many times" in cp.stderr
    assert "Traceback" not in cp.stderr


def test_a_sweep_with_hosts_runs_on_the_hosts_not_here(tmp_path):
    """--hosts in a sweep goes to the hosts as a single run does (here: this machine, by
    its host name, over an SSH that does not let bench in, so every combination is skipped
    with that reason), never to local processes."""
    host = socket.gethostname()
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--hosts", f"{host}:1",
                         "--np", "1", "--framework", "ddp", "--compression", "none,fp16", "--max-steps", "8",
                         "--warmup-steps", "2", "--results-dir", str(tmp_path), "--run-id", "sweep"],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    recs = results.read_records(tmp_path / "sweep" / results.RESULTS_FILE)[0] \
        if (tmp_path / "sweep" / results.RESULTS_FILE).exists() else []
    assert [r["status"] for r in recs] == ["skipped", "skipped"], cp.stdout[-2000:]
    assert all(f"host {host} " in r["error"]["reason"] for r in recs)
    assert "Traceback" not in cp.stderr


def test_resume_after_real_ranks_with_framework_auto_runs_nothing_again(tmp_path):
    """--framework left at auto: the first run's ranks record the framework auto resolved
    to; the same command with --resume finds that record and starts no rank."""
    def run(*extra):
        return subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--np", "1",
                               "--max-steps", "3", "--warmup-steps", "1", "--results-dir", str(tmp_path),
                               "--run-id", "auto", *extra], cwd=REPO, capture_output=True, text=True,
                              timeout=600)
    first = run()
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    [rec] = results.read_records(tmp_path / "auto" / results.RESULTS_FILE)[0]
    assert rec["config"]["framework"] in ("horovod", "ddp")           # resolved, not "auto"
    again = run("--resume")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"-- {rec['config']['framework']} over gloo" in again.stdout
    assert "not run again (--resume)" in again.stdout and "== " not in again.stdout   # no launch
    assert len(results.read_records(tmp_path / "auto" / results.RESULTS_FILE)[0]) == 1
