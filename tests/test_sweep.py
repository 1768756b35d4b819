"""Sweeps: lists of frameworks, back ends, compressions and node counts run as a cross
product into one results directory; what cannot run here is skipped with the reason
recorded; --resume runs only what has no ok record yet."""
import subprocess
import sys
from pathlib import Path

import pytest

from lab.common import results
from lab.host import request
from lab.host import sweep as sweeps

REPO = Path(__file__).resolve().parent.parent


def test_lists_are_checked_before_anything_runs():
    assert request.parse_list("backend", "gloo, mpi,gloo", ("gloo", "mpi", "nccl")) == ["gloo", "mpi"]
    with pytest.raises(request.BenchError, match="unknown --compression 'zip'"):
        request.parse_list("compression", "none,zip", ("none", "fp16"))
    with pytest.raises(request.BenchError, match="--nodes takes whole numbers"):
        request.parse_list("nodes", "1,two")


def test_the_plan_is_the_cross_product():
    plans = sweeps.sweep_plan(request.BenchSettings(np=[1, 2]), {
        "framework": ["horovod", "ddp"], "backend": ["gloo", "mpi", "nccl"], "compression": ["none", "int8"]})
    assert len(plans) == 12 and all(p.np == [1, 2] for p in plans)
    assert {(p.framework, p.backend, p.compression) for p in plans} == {
        (f, b, c) for f in ("horovod", "ddp") for b in ("gloo", "mpi", "nccl") for c in ("none", "int8")}


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
    assert "SKIPPED" in cp.stdout                                        # and in the table
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


def test_link_is_checked_for_every_combination_of_a_local_sweep(tmp_path):
    cp = subprocess.run([sys.executable, "-m", "invoke", "bench", "--local", "--np", "1",
                         "--framework", "ddp", "--nodes", "1,2", "--link", "1gbit",
                         "--results-dir", str(tmp_path), "--run-id", "link"],
                        capture_output=True, text=True, timeout=300)
    recs = results.read_records(tmp_path / "link" / results.RESULTS_FILE)[0]
    assert [r["status"] for r in recs] == ["skipped", "skipped"], cp.stdout[-2000:]
    assert "--link shapes the links" in recs[0]["error"]["reason"]
    assert recs[0]["world"]["nodes"] == 1 and recs[1]["world"]["nodes"] == 2
