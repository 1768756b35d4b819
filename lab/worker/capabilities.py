"""`python -m lab.worker.capabilities`: what this Python can run, as one JSON line —
torch and its distributed back ends, the GPUs it sees, Horovod's controllers and GPU
operations, torchvision, mpirun. Runners run it where the ranks will run, so that a
request is checked against that stack before any rank starts. Never raises."""
from __future__ import annotations

import importlib.util
import json
import shutil


def _horovod_version() -> str | None:
    import horovod
    return getattr(horovod, "__version__", None)


def _mpi_version() -> str | None:
    """mpirun's first line ("mpirun (Open MPI) 4.1.4"), or None."""
    import subprocess
    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.strip().splitlines() or [None])[0]


def model_needs() -> list[str]:
    """The packages the registered models need beyond torch (lab.models' ModelSpec.needs):
    the host refuses a model whose package does not import here (lab.host.request.checks.check_request)."""
    from lab import models
    return sorted({p for n in models.names() for p in models.get(n).needs})


def depends_on() -> list[str]:
    """What this answer was read from, for the host's cache of it (lab.host.places.stack_cache):
    the interpreter, the folders on the Python path (an installation adds or removes
    packages there; not the kit's own checkout), the user site folder and its parent
    whether or not they exist yet (`pip install --user` makes them), the probed packages'
    folders and build records, and mpirun, or the PATH's folders where there is none."""
    import os
    import sys

    from lab.common.kit import REPO_ROOT
    from lab.common.stack_facts import user_site_folders
    paths = [os.path.realpath(sys.executable)]
    paths += [p for p in sys.path if p and os.path.isdir(p)
              and os.path.realpath(p) != str(REPO_ROOT)]
    paths += user_site_folders()
    for name in ("torch", "horovod", "torchvision", "deepspeed", *model_needs()):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            folder = list(spec.submodule_search_locations)[0]
            paths += [folder, os.path.join(folder, "version.py")]
    mpirun = shutil.which("mpirun")
    paths += [os.path.realpath(mpirun)] if mpirun else [
        d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    return list(dict.fromkeys(paths))


def collect() -> dict:
    import platform

    from lab.common.kit import cores, kit_version
    out: dict = {"python": platform.python_version(), "kit": kit_version(), "cores": cores()}
    try:
        import torch
        import torch.distributed as dist
        out["torch"] = torch.__version__
        out["cuda_available"] = torch.cuda.is_available()
        out["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
        out["ddp_backends"] = {"gloo": dist.is_gloo_available(), "mpi": dist.is_mpi_available(),
                               "nccl": dist.is_nccl_available()}
    except Exception as e:
        out["torch_error"] = f"{type(e).__name__}: {e}"
    if importlib.util.find_spec("horovod") is not None:
        try:
            import horovod.torch as hvd

            from lab.common.kit import horovod_gpu_operations
            out["horovod"] = {"gloo": bool(hvd.gloo_built()), "mpi": bool(hvd.mpi_built()),
                              "nccl": bool(hvd.nccl_built()), "ccl": bool(hvd.ccl_built()),
                              "gpu_operations": horovod_gpu_operations(hvd),
                              "version": getattr(hvd, "__version__", None) or _horovod_version()}
        except Exception as e:
            out["horovod_error"] = f"{type(e).__name__}: {e}"
    try:
        import torchvision
        out["torchvision"] = torchvision.__version__
    except Exception as e:
        out["torchvision_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    for name in model_needs():      # what a registered model needs beyond torch (ModelSpec.needs)
        if name not in out:
            try:
                out[name] = getattr(importlib.import_module(name), "__version__", "installed")
            except Exception as e:
                out[f"{name}_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
    try:
        import torch.distributed.rpc as rpc
        out["rpc"] = bool(rpc.is_available())
    except Exception:
        out["rpc"] = False
    # DeepSpeed is not imported here (seconds, and it logs): installed is what is probed;
    # a DeepSpeed that then fails to import is the rank's one-sentence failure.
    if importlib.util.find_spec("deepspeed") is not None:
        try:
            from importlib.metadata import version
            out["deepspeed"] = version("deepspeed")
        except Exception as e:
            out["deepspeed_error"] = f"{type(e).__name__}: {e}"
    out["mpirun"] = shutil.which("mpirun") is not None
    out["mpi_version"] = _mpi_version() if out["mpirun"] else None
    out["depends_on"] = depends_on()
    return out


if __name__ == "__main__":
    print(json.dumps(collect()))
