"""The environment manifest stored with every results record."""
from __future__ import annotations

from envcheck import probes


def _value(result):
    """A probe's value, or its status and reason when it did not pass."""
    if result.status == probes.PASS:
        return result.value
    return {"status": result.status, "reason": result.fix}


def _topology(gpus):
    from envcheck.host import probe_gpu_topology
    r = probe_gpu_topology(gpus)
    return r.value.get("summary") if r.status == probes.PASS else None


def _kit_path() -> str:
    """The folder of the `lab` package that runs (one folder: it is a regular package)."""
    import os

    import lab
    return os.path.dirname(os.path.abspath(lab.__file__))


def collect(hosts: list[str]) -> dict:
    """Everything the report's environment table needs, measured on rank 0's host;
    `hosts` is every rank's host name, by rank."""
    packages = _value(probes.probe_package_versions())
    torch_cuda = _value(probes.probe_torch_cuda())
    from envcheck.host import probe_gpus
    gpus = probe_gpus()
    manifest = {
        "hosts": hosts,
        "cpu_model": _value(probes.probe_cpu_model()),
        "os": _value(probes.probe_os()),
        "gpus": _value(gpus),
        "driver": gpus.value.get("driver") if gpus.status == probes.PASS else None,
        "mpi": _value(probes.probe_mpi_version()),
        "nics": _value(probes.probe_nics()),
        "gpu_topology": _topology(gpus),
        "image": probes.image_info(),
        # Which copy of the kit ran: the checkout's (mounted into the image unless
        # --frozen) or the image's own.
        "kit_path": _kit_path(),
    }
    if isinstance(packages, dict):
        manifest.update({k: packages.get(k) for k in ("torch", "torchvision", "horovod", "python")})
    if isinstance(torch_cuda, dict):
        manifest.update({"cuda": torch_cuda.get("cuda_build"), "cudnn": torch_cuda.get("cudnn"),
                         "nccl": torch_cuda.get("nccl")})
    return manifest
