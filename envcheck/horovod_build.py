"""Horovod's build as `horovodrun --check-build` prints it: the printed text parsed, and
the same facts read in one process from an imported horovod.torch (the doctor's horovod
row, envcheck.stack.probe_horovod). Standard library only."""
from __future__ import annotations

import os
import re


def parse_check_build(text: str) -> dict:
    """`horovodrun --check-build`: version and the [X]/[ ] lists of frameworks,
    controllers and tensor operations."""
    m = re.search(r"Horovod v(\S+):", text)
    if not m:
        raise ValueError("not a horovodrun --check-build output")
    out = {"version": m.group(1).rstrip(":")}
    section = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("Available "):
            section = s[len("Available "):].rstrip(":").lower().replace(" ", "_")
            out[section] = []
            continue
        b = re.match(r"^\[(X| )\]\s+(\S+)", s)
        if b and section and b.group(1) == "X":
            out[section].append(b.group(2))
    return out


# What `horovodrun --check-build` prints, from facts one process can read itself: Horovod
# 0.28.1's check_build (horovod/runner/launch.py) asks each fact of the first of
# tensorflow, torch, mxnet (horovod/common/util.py, EXTENSIONS) whose Horovod extension
# imports, each in a forked process of its own (_check_extension_lambda): six imports of
# torch, seconds each on a GPU host. Its tensor operations MPI and Gloo are its
# controllers' mpi_built() and gloo_built() again.
_FRAMEWORKS = (("tensorflow", "TensorFlow", "mpi_lib"), ("torch", "PyTorch", "mpi_lib_v2"),
               ("mxnet", "MXNet", "mpi_lib"))


def check_build_facts(hvd, version: str, frameworks: list[str]) -> dict:
    """parse_check_build's dict from an imported horovod.torch (`hvd`): the controllers
    and tensor operations its mpi_built(), gloo_built(), nccl_built(), ddl_built() and
    ccl_built() say, in check_build's order."""
    mpi, gloo = bool(hvd.mpi_built()), bool(hvd.gloo_built())
    ops = [name for name, built in (("NCCL", hvd.nccl_built()), ("DDL", hvd.ddl_built()),
                                    ("CCL", hvd.ccl_built()), ("MPI", mpi), ("Gloo", gloo)) if built]
    return {"version": version, "frameworks": frameworks,
            "controllers": [name for name, built in (("MPI", mpi), ("Gloo", gloo)) if built],
            "tensor_operations": ops}


def horovod_frameworks(horovod_dir: str) -> list[str]:
    """The frameworks whose package is installed and whose Horovod extension library was
    built (horovod/<framework>/mpi_lib*.so: the module setup.py builds and check_extension
    looks for), in check_build's order. check_build also loads each one (import
    horovod.<framework>), which this does not: a TensorFlow or MXNet upgraded after the
    build, whose library no longer loads, is listed here and not there."""
    import glob
    import importlib.util
    return [label for module, label, lib in _FRAMEWORKS
            if importlib.util.find_spec(module) is not None
            and glob.glob(os.path.join(horovod_dir, module, lib + ".*so"))]
