"""oneCCL as Horovod's third CPU back end (`--backend ccl`, lab.common.ccl): refused where it
cannot run, run for real as local processes, in the lab image and across the simulated
cluster, each run's record saying what Horovod's own timeline showed carrying the all-reduce;
doctor's Horovod row lists CCL and its collectives include oneCCL's."""
import json
import os
import re
import subprocess
import sys

import pytest

from envcheck import stack as envstack
from envcheck.probes import PASS
from lab.common import ccl, results
from lab.common.config import ConfigError, RunConfig
from lab.common.docker_api import IMAGE_REPO
from tests.conftest import REPO, requires_mpirun

# The image the image and cluster tests run in: the CPU image, or another one named by
# LAB_IMAGE (compose.yaml's variable, which the cluster's nodes run too).
IMAGE = os.environ.get("LAB_IMAGE", f"{IMAGE_REPO}:cpu")


def _ccl_built() -> str | None:
    """Why this Horovod has no oneCCL operations (None: it has them)."""
    cp = subprocess.run([sys.executable, "-c", "import horovod.torch as h; print(h.ccl_built())"],
                        capture_output=True, text=True)
    if cp.returncode != 0:
        return "horovod.torch does not import: " + (cp.stderr.strip().splitlines() or [""])[-1]
    return None if cp.stdout.strip() == "True" else "this Horovod was built without oneCCL"


CCL_MISSING = _ccl_built()
requires_ccl = pytest.mark.skipif(CCL_MISSING is not None, reason=CCL_MISSING or "")


def invoke(*args, timeout=900, env=None):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def records_of(out: str) -> list[dict]:
    m = re.search(r"records: (\S+results\.jsonl)", out)
    assert m, out[-3000:]
    return results.read_records(m.group(1))[0]


def check_ccl_records(records: list[dict], nps: list[int]) -> None:
    """Each run: ok, asked for ccl, and its ranks saw CCL_ALLREDUCE on Horovod's timeline."""
    assert [r["world"]["np"] for r in records] == nps
    for r in records:
        assert r["status"] == "ok", r.get("error")
        assert r["config"]["framework"] == "horovod" and r["config"]["backend"] == "ccl"
        assert r["world"]["controller"] == "ccl"
        assert r["world"]["allreduce_ops"]["ops"] == ["CCL_ALLREDUCE"]


# ---- refused before any rank starts

def test_ddp_over_ccl_is_refused_in_one_sentence():
    with pytest.raises(ConfigError) as e:
        RunConfig(framework="ddp", backend="ccl").check()
    assert str(e.value) == ccl.DDP_REFUSAL and "oneccl_bindings_for_pytorch" in str(e.value)
    with pytest.raises(ConfigError, match="--device cpu"):
        RunConfig(framework="horovod", backend="ccl", device="cuda").check()
    RunConfig(framework="horovod", backend="ccl").check()     # what runs


def test_fp16_compression_over_ccl_is_refused_and_8_bit_runs():
    """Horovod's CPU CCL operations have no float16 type: every rank would throw."""
    with pytest.raises(ConfigError, match="no float16 tensors.*--compression int8 or none"):
        RunConfig(framework="horovod", backend="ccl", compression="fp16").check()
    for codec in ("none", "int8", "int8-naive"):
        RunConfig(framework="horovod", backend="ccl", compression=codec).check()
    RunConfig(framework="horovod", backend="gloo", compression="fp16").check()


def test_bench_refuses_ddp_over_ccl_before_any_rank(tmp_path):
    cp = invoke("bench", "--local", "--np", "2", "--framework", "ddp", "--backend", "ccl",
                "--results-dir", str(tmp_path))
    assert cp.returncode != 0 and "Traceback" not in cp.stderr
    assert "oneccl_bindings_for_pytorch, which is not on the package index" in cp.stdout + cp.stderr
    assert not list(tmp_path.glob("*/results.jsonl")) or all(
        r["status"] != "ok" for p in tmp_path.glob("*/results.jsonl") for r in results.read_records(p)[0])


def test_the_ranks_own_choice_wins_and_the_users_transport_too():
    env = ccl.rank_env({"FI_PROVIDER": "sockets", "HOROVOD_CPU_OPERATIONS": "MPI"})
    assert env["HOROVOD_CPU_OPERATIONS"] == "CCL" and "FI_PROVIDER" not in env
    assert env["CCL_ATL_TRANSPORT"] == "ofi" and env["HOROVOD_TIMELINE"] == "DYNAMIC"


def test_an_mpi_rank_names_mpis_operations_unless_told_otherwise():
    assert ccl.horovod_env("mpi", {}) == {"HOROVOD_CPU_OPERATIONS": "MPI"}
    assert ccl.horovod_env("mpi", {"HOROVOD_CPU_OPERATIONS": "gloo"}) == {}
    assert ccl.horovod_env("gloo", {}) == {}
    assert ccl.horovod_env("ccl", {})["HOROVOD_CPU_OPERATIONS"] == "CCL"


def test_the_workers_cores_are_the_ranks_own():
    """One core per local rank from the rank's own CPU set (a container's, a job's), the last
    ones, wrapping round when it has fewer cores than ranks."""
    assert ccl.worker_affinity(range(8), 2) == "6,7"
    assert ccl.worker_affinity({1}, 2) == "1,1"
    assert ccl.worker_affinity({2, 3}, 1) == "3"
    env = ccl.rank_env({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, cores={4, 5, 6})
    assert env["CCL_WORKER_AFFINITY"] == "5,6"


def test_the_timeline_names_the_operations_not_the_negotiation():
    text = ('[{"name": "NEGOTIATE_ALLREDUCE", "ph": "B"}, {"name": "CCL_ALLREDUCE", "ph": "B"},\n'
            '{"name": "MEMCPY_IN_FUSION_BUFFER", "ph": "B"}, {"name": "CCL_ALLREDUCE", "ph": "E"}')
    assert ccl.ops_in_timeline(text) == ["CCL_ALLREDUCE"]
    assert ccl.ops_in_timeline('{"name": "MPI_ALLREDUCE"}') == ["MPI_ALLREDUCE"]


# ---- the timeline check tells the operations apart (the same check, under MPI's)

@requires_ccl
@requires_mpirun
def test_a_run_that_names_no_cpu_operations_runs_mpis_and_the_check_says_so():
    """A rank that names no HOROVOD_CPU_OPERATIONS runs MPI's operations, as before oneCCL was
    built (install-horovod.sh gives MPI as the build-time default, defined as a number so
    that Horovod's #if reads it), and the same timeline check then sees MPI_ALLREDUCE: a run
    that fell back to MPI would fail the ccl check."""
    code = ("import os, json, horovod.torch as hvd; import torch; from lab.common.ccl import allreduce_ops; "
            "hvd.init(); seen = allreduce_ops(hvd, torch, hvd.rank()); "
            "print('SEEN ' + json.dumps(seen['ops'])) if hvd.rank() == 0 else None; hvd.shutdown()")
    cp = subprocess.run([*envstack._mpirun(2), sys.executable, "-c", code],
                        capture_output=True, text=True, timeout=300, cwd=REPO,
                        env={**{k: v for k, v in os.environ.items() if k != "HOROVOD_CPU_OPERATIONS"},
                             "HOROVOD_TIMELINE": "DYNAMIC", "OMP_NUM_THREADS": "1"})
    line = [ln for ln in cp.stdout.splitlines() if ln.startswith("SEEN ")]
    assert line, cp.stdout[-2000:] + cp.stderr[-2000:]
    assert json.loads(line[0][5:]) == ["MPI_ALLREDUCE"]


# ---- runs

@requires_ccl
@requires_mpirun
def test_bench_runs_horovod_over_ccl_as_local_processes(tmp_path):
    cp = invoke("bench", "--local", "--np", "1,2", "--framework", "horovod", "--backend", "ccl",
                "--max-steps", "15", "--results-dir", str(tmp_path))
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    check_ccl_records(records_of(cp.stdout), [1, 2])


def _image_has_ccl() -> str | None:
    try:
        import docker
        client = docker.from_env(timeout=60)
        client.ping()
        client.images.get(IMAGE)
    except Exception as e:
        return f"needs a Docker engine and {IMAGE} ({type(e).__name__})"
    return None


@pytest.mark.skipif(_image_has_ccl() is not None, reason=_image_has_ccl() or "")
def test_bench_runs_horovod_over_ccl_in_the_image(tmp_path):
    cp = invoke("bench", "--image", IMAGE, "--np", "1,2", "--framework", "horovod", "--backend", "ccl",
                "--max-steps", "15", "--results-dir", str(tmp_path))
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-2000:]
    assert f"running in the image {IMAGE}" in cp.stdout
    check_ccl_records(records_of(cp.stdout), [1, 2])


# ---- doctor

@requires_ccl
@requires_mpirun
def test_doctor_lists_ccl_and_times_its_collectives():
    hvd = envstack.probe_horovod()
    assert hvd.status == PASS and "CCL" in hvd.value["tensor_operations"]
    assert {"MPI", "Gloo"} <= set(hvd.value["tensor_operations"])        # one build holds all three
    r = envstack.probe_collectives_ccl(hvd, 2)
    assert r.status == PASS, r.fix
    assert r.value["backend"] == "ccl (Horovod)" and r.value["ranks"] == 2
    assert "reducescatter" not in r.value["ops"] and "reduce" not in r.value["ops"]
    sweep = r.value["ops"]["allreduce"]
    assert sweep and all(p["busbw_gbs"] > 0 for p in sweep)
