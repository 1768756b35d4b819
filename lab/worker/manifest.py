"""The environment manifest stored with every results record."""
from __future__ import annotations

import os

from envcheck import probes


def _value(result):
    """A probe's value, or its status and reason when it did not pass."""
    if result.status == probes.PASS:
        return result.value
    return {"status": result.status, "reason": result.fix}


def _topology(gpus):
    from envcheck.gpu import probe_gpu_topology
    r = probe_gpu_topology(gpus)
    return r.value.get("summary") if r.status == probes.PASS else None


def _kit_path() -> str:
    """The folder of the `lab` package that runs (one folder: it is a regular package)."""
    import lab
    return os.path.dirname(os.path.abspath(lab.__file__))


def collect(hosts: list[str], run_dir=None) -> dict:
    """Everything the report's environment table needs, measured on rank 0's host;
    `hosts` is every rank's host name, by rank. With `run_dir`, measured once per run
    folder: kept in <run_dir>/manifests/, one file per host, Python and its installed
    packages, visible GPUs and driver, image and copy of the kit (what the measurement
    depends on, _key; every launch of a sweep shares them), and read back by the launches
    after the first while those are unchanged."""
    import json
    import os
    if run_dir is None:
        return measure(hosts)
    path = os.path.join(str(run_dir), "manifests", f"{_key()}.json")
    try:
        with open(path) as f:
            return {**json.load(f), "hosts": hosts}
    except (OSError, ValueError):
        pass
    manifest = measure(hosts)
    try:
        import tempfile
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".manifest.")
        with os.fdopen(fd, "w") as f:
            json.dump({k: v for k, v in manifest.items() if k != "hosts"}, f)
        os.replace(tmp, path)
    except OSError:
        pass
    return manifest


def _key() -> str:
    """Names what a manifest depends on, read without importing a package: this host,
    this Python and its installed stack (lab.common.stack_facts: the site folders and the
    torch, Horovod and CUDA wheels in them), the GPUs it sees and the driver, mpirun, the
    image, the kit."""
    import hashlib
    import json
    import shutil
    import socket
    import sys

    from lab.common import stack_facts
    mpirun = shutil.which("mpirun")
    facts = {"host": socket.gethostname(), "python": sys.executable,
             "pythonpath": os.environ.get("PYTHONPATH"),
             "image": os.environ.get("LAB_IMAGE_ID", ""), "kit": _kit_path(),
             "site": stack_facts.python_facts(), "gpus": stack_facts.gpu_facts(),
             "mpirun": [mpirun, stack_facts.mtime(os.path.realpath(mpirun)) if mpirun else None]}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def measure(hosts: list[str]) -> dict:
    """The manifest measured now."""
    packages = _value(probes.probe_package_versions())
    torch_cuda = _value(probes.probe_torch_cuda())
    from envcheck.gpu import probe_gpus
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
