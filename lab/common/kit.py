"""Facts about the kit and the stack it drives, each stated once: where the checkout
is, the kit's version, where horovodrun is, how Horovod encodes its NCCL version, and
what pip's torch lacks. Standard library only."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import lab
from lab.common import ccl

# The checkout (or the installed copy) that holds lab/, envcheck/, docker/, compose.yaml.
REPO_ROOT = Path(lab.__file__).resolve().parent.parent
PACKAGES = ("lab", "envcheck")            # what a container gets from the checkout
DIST_NAME = "dl-lab-kit"                  # the distribution name in pyproject.toml

# pip's torch wheels are built without the MPI back end of torch.distributed
# (torch.distributed.is_mpi_available() is False for them); Horovod brings its own.
NO_MPI_IN_PIP_TORCH = ("pip's torch builds have no MPI back end; use --framework horovod "
                       "--backend mpi")


def cudnn_version_text(number) -> str:
    """torch.backends.cudnn.version()'s number as a version: cuDNN 9 encodes
    major*10000 + minor*100 + patch (cudnn_version.h: CUDNN_VERSION), cuDNN 8 and before
    major*1000 + minor*100 + patch; anything else as it was given."""
    if not isinstance(number, int) or isinstance(number, bool) or number <= 0:
        return str(number)
    if number >= 90000:
        major, rest = divmod(number, 10000)
    else:
        major, rest = divmod(number, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def kit_version() -> str:
    """The installed kit's version (pyproject.toml's, through the package metadata)."""
    from importlib import metadata
    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        return "0"


def horovodrun(python: str = sys.executable) -> str:
    """horovodrun beside the interpreter (a virtual environment's), else on the PATH."""
    here = os.path.join(os.path.dirname(python), "horovodrun")
    return here if os.path.exists(here) else (shutil.which("horovodrun") or "horovodrun")


def horovod_nccl_version(code: int) -> str | None:
    """hvd.nccl_built() returns NCCL_VERSION_CODE (major*10000 + minor*100 + patch for
    NCCL >= 2.9, nccl.h), or 0 when Horovod was built without NCCL: '2.29.7' or None."""
    if not code:
        return None
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


# Horovod's record of how docker/install-horovod.sh built it, beside the package.
HOROVOD_BUILD_RECORD = "lab_build.json"


def horovod_gpu_operations(hvd) -> str | None:
    """How this Horovod moves GPU tensors: "NCCL", "MPI" (CUDA-aware MPI) or None (it
    copies them to host memory first). The library tells NCCL (nccl_built() is NCCL's
    version code) but not MPI: a build with MPI GPU operations and one without any are
    both CUDA without NCCL (horovod/common/basics.py; HOROVOD_GPU_ALLREDUCE is only a C
    define), so install-horovod.sh's build record says which."""
    if hvd.nccl_built():
        return "NCCL"
    import json

    import horovod
    path = os.path.join(os.path.dirname(horovod.__file__), HOROVOD_BUILD_RECORD)
    try:
        with open(path) as f:
            ops = json.load(f).get("gpu_operations")
    except (OSError, ValueError):
        return None
    return ops if ops in ("NCCL", "MPI") else None


def horovod_controller(backend: str) -> str:
    """The Horovod controller (horovodrun --gloo or --mpi) that carries a back end: nccl
    runs under Gloo's, ccl under lab.common.ccl.CONTROLLER, gloo and mpi under their own."""
    return {"nccl": "gloo", "ccl": ccl.CONTROLLER}.get(backend, backend)


def horovod_gpu_path_problem(gpu_operations: str | None, backend: str) -> str | None:
    """Why Horovod with these GPU operations cannot honestly run `backend` on GPU
    tensors, or None. From Horovod 0.28.1's horovod/common/operations.cc: NCCL's
    operations are registered whatever the controller and come first (so gloo or mpi
    would move the gradients through NCCL while the record said gloo or mpi);
    MPI_GPUAllreduce is registered only when the MPI context is enabled, and under
    --gloo GlooAllreduce, whose Enabled() is always true (ops/gloo_operations.cc), would
    be handed GPU memory by mpi_ops_v2.cc's DoAllreduce."""
    if gpu_operations == "NCCL" and backend in ("gloo", "mpi"):
        return (f"this Horovod moves GPU tensors through NCCL whatever the controller, so "
                f"--backend {backend} --device cuda would measure NCCL: use --backend nccl, "
                f"or for MPI's own GPU path an image built with --gpu-ops MPI "
                f"(dl-lab-kit:gpu-mpi) and --backend mpi")
    if gpu_operations == "MPI" and backend != "mpi":
        return (f"this Horovod does its GPU operations over CUDA-aware MPI, which runs only "
                f"under the MPI controller (under {backend} Gloo's CPU code would be handed "
                f"GPU memory): use --backend mpi, or an image built with --gpu-ops NCCL "
                f"(dl-lab-kit:gpu-nccl) for --backend nccl")
    return None


if __name__ == "__main__":
    # python -m lab.common.kit nccl-version CODE (the image's smoke test uses it)
    if sys.argv[1:2] == ["nccl-version"] and len(sys.argv) == 3:
        print(horovod_nccl_version(int(sys.argv[2])) or "none")
    else:
        sys.exit("usage: python -m lab.common.kit nccl-version CODE")


def cores() -> int:
    """The cores this process may run on (its affinity: a container's --cpuset, a Slurm
    allocation), else the machine's."""
    import os
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
