"""Facts about the kit and the stack it drives, each stated once: where the checkout
is, the kit's version, where horovodrun is, how Horovod encodes its NCCL version, and
what pip's torch lacks. Standard library only."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import lab

# The checkout (or the installed copy) that holds lab/, envcheck/, docker/, compose.yaml.
REPO_ROOT = Path(lab.__file__).resolve().parent.parent
PACKAGES = ("lab", "envcheck")            # what a container gets from the checkout
DIST_NAME = "dl-lab-kit"                  # the distribution name in pyproject.toml

# pip's torch wheels are built without the MPI back end of torch.distributed
# (torch.distributed.is_mpi_available() is False for them); Horovod brings its own.
NO_MPI_IN_PIP_TORCH = ("pip's torch builds have no MPI back end; use --framework horovod "
                       "--backend mpi")


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


if __name__ == "__main__":
    # python -m lab.common.kit nccl-version CODE (the image's smoke test uses it)
    if sys.argv[1:2] == ["nccl-version"] and len(sys.argv) == 3:
        print(horovod_nccl_version(int(sys.argv[2])) or "none")
    else:
        sys.exit("usage: python -m lab.common.kit nccl-version CODE")
