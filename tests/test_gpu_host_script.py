"""docker/gpu-host-mpi.sh, the script for a lent GPU host (CUDA-aware Open MPI, Horovod with
MPI GPU operations, doctor and runs over it), checked where there is no GPU: its syntax,
shellcheck (as .ci/run runs it on docker/*.sh), and its dry mode (DRY=1), which prints the
planned commands and time boxes and runs none of them. It has not run on a GPU."""
import ast
import os
import re
import shutil
import subprocess

import pytest
from conftest import REPO

SCRIPT = REPO / "docker" / "gpu-host-mpi.sh"


def test_the_script_parses():
    cp = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert cp.returncode == 0, cp.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_the_script_is_shellcheck_clean():
    cp = subprocess.run(["shellcheck", str(SCRIPT)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stdout + cp.stderr


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    """The dry run, with a stand-in CUDA toolkit (an empty include/cuda.h: install-openmpi.sh's
    CONFIGURE_ONLY=1 checks that much before printing configure's arguments)."""
    tmp = tmp_path_factory.mktemp("gpu-host-mpi")
    (tmp / "cuda" / "include").mkdir(parents=True)
    (tmp / "cuda" / "include" / "cuda.h").write_text("")
    # CUDA_ARCHS unset: .ci/run exports 75 for the image builds, and the script's own default
    # (90, a lent H100/H200) is what is checked here.
    env = {k: v for k, v in os.environ.items() if k != "CUDA_ARCHS"}
    env = {**env, "DRY": "1", "CUDA_HOME": str(tmp / "cuda"), "OUT": str(tmp / "out"),
           "WORK": str(tmp / "work"), "RESULTS": str(tmp / "results")}
    cp = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    return cp, tmp


def test_the_dry_run_plans_the_stack_and_runs_nothing(dry):
    cp, tmp = dry
    assert cp.returncode == 0, (cp.stdout + cp.stderr)[-3000:]
    out = cp.stdout
    # What it prints goes to OUT/log.txt as well.
    assert (tmp / "out" / "log.txt").read_text() == out
    # Open MPI: configure's arguments (install-openmpi.sh's own CONFIGURE_ONLY=1), from the
    # staged tarball into a prefix under /tmp with 16 jobs.
    assert f"--with-cuda={tmp / 'cuda'}" in out and "--without-ucx" in out
    ompi = next(line for line in out.splitlines() if "install-openmpi.sh" in line and "$" in line)
    assert "OPENMPI_TARBALL=" in ompi and ".gpu/openmpi_4.1.4.orig.tar.xz" in ompi
    assert "PREFIX=/tmp/" in ompi and "JOBS=16" in ompi
    # Horovod with MPI GPU operations against the host's python, offline, for sm_90.
    hvd = next(line for line in out.splitlines() if "install-horovod.sh" in line and "$" in line)
    for word in ("HOROVOD_GPU_OPERATIONS=MPI", "PIP_NO_INDEX=1", "HOROVOD_BUILD_CUDA_CC_LIST=90",
                 "HOROVOD_SDIST=", ".gpu/horovod-0.28.1.tar.gz"):
        assert word in hvd, (word, hvd)
    assert "HOROVOD_WITHOUT_MPI" not in out
    # doctor, the probe at np 2 on one GPU, and the runs over Horovod's MPI GPU path.
    assert "-m invoke doctor --local" in out
    assert "mpi_gpu_allreduce_np.py 2" in out
    benches = [line for line in out.splitlines() if "-m invoke bench" in line]
    assert len(benches) == 2
    for line in benches:
        assert "--local --device cuda --framework horovod --backend mpi --np 1,2" in line
    assert "--model mnist --data digits" in benches[0]
    assert "--model resnet50" in benches[1] and "--batch-size 64" in benches[1]
    assert re.search(r"mpirun -np 2 .*-mca pml ob1 .*hvd_gpu_allreduce\.py", out)
    # Order: builds, doctor, MNIST, then the rest.
    order = [out.index(s) for s in ("install-openmpi.sh", "install-horovod.sh", "invoke doctor",
                                    "--model mnist", "hvd_gpu_allreduce.py", "--model resnet50",
                                    "results.tgz")]
    assert order == sorted(order)
    # Time boxes: every step has one, the total is within the 15 minutes of a lent GPU.
    total = int(re.search(r"total time box: (\d+)s", out).group(1))
    assert total <= 15 * 60
    boxes = [int(b) for b in re.findall(r"^=== .*: box (\d+)s", out, re.MULTILINE)]
    assert len(boxes) == 7 and all(0 < b <= total for b in boxes)
    # Nothing ran: no build log, no results.
    assert not (tmp / "out" / "openmpi-build.log").exists() and not (tmp / "results").exists()
    assert "rc=" not in out


def test_the_helpers_it_writes_are_python_using_doctors_own_functions(dry):
    """The np 2 probe reuses doctor's mpirun line and output parser (envcheck.stack), so the
    names it calls must exist there."""
    _, tmp = dry
    probe = (tmp / "work" / "mpi_gpu_allreduce_np.py").read_text()
    ast.parse(probe)
    ast.parse((tmp / "work" / "hvd_gpu_allreduce.py").read_text())
    from envcheck import stack
    for name in re.findall(r"\bstack\.(\w+)", probe):
        assert hasattr(stack, name), name
    assert "envcheck.mpi_hello" in probe and "--gpu" in probe


def test_without_the_staged_sources_it_stops_naming_them(tmp_path):
    cp = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                        env={**os.environ, "STAGE": str(tmp_path / "none"), "OUT": str(tmp_path / "out"),
                             "WORK": str(tmp_path / "work"), "RESULTS": str(tmp_path / "results"),
                             "PY": "true"})
    assert cp.returncode == 2, cp.stdout[-2000:]
    assert f"MISSING {tmp_path / 'none'}/openmpi_4.1.4.orig.tar.xz" in cp.stdout
