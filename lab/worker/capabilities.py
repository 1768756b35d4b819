"""`python -m lab.worker.capabilities`: what this Python can run, as one JSON line —
torch and its distributed back ends, the GPUs it sees, Horovod's controllers and GPU
operations, torchvision, mpirun. Runners run it where the ranks will run, so that a
request is checked against that stack before any rank starts. Never raises."""
from __future__ import annotations

import importlib.util
import json
import shutil


def collect() -> dict:
    out: dict = {}
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
                              "nccl": bool(hvd.nccl_built()),
                              "gpu_operations": horovod_gpu_operations(hvd)}
        except Exception as e:
            out["horovod_error"] = f"{type(e).__name__}: {e}"
    try:
        import torchvision
        out["torchvision"] = torchvision.__version__
    except Exception as e:
        out["torchvision_error"] = f"{type(e).__name__}: {e}".splitlines()[0]
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
    return out


if __name__ == "__main__":
    print(json.dumps(collect()))
