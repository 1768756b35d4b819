"""Probes: small functions that each measure one fact of the environment and return a
Result; a probe never raises (a crash becomes a FAIL carrying the reason) and runs any
command under a timeout. Parsing is done by pure functions, tested on real outputs.
Rendering lives elsewhere.

Only the standard library is imported at module level: torch, Horovod and NVML are
imported inside the probes that need them.
"""
from __future__ import annotations

import functools
import json
import os
import platform
import re
import shutil
import signal
import subprocess
from dataclasses import asdict, dataclass

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


@dataclass
class Result:
    name: str
    status: str
    value: object = None
    fix: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


class ProbeError(Exception):
    """A probe's own failure; its message becomes the FAIL's fix line."""


def probe(name: str):
    """Decorator: the probe returns a Result; any exception becomes FAIL with the reason."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs) -> Result:
            try:
                out = fn(*args, **kwargs)
            except ProbeError as e:
                return Result(name, FAIL, None, str(e))
            except Exception as e:  # a probe must never take the report down
                return Result(name, FAIL, None, f"probe crashed: {type(e).__name__}: {e}")
            if isinstance(out, Result):
                return out
            return Result(name, PASS, out)
        run.probe_name = name
        return run
    return wrap


def run_command(argv: list[str], timeout: float = 10, env: dict | None = None) -> str:
    """Run a command and return its standard output; ProbeError when it is missing,
    fails, or outlives the timeout."""
    exe = shutil.which(argv[0])
    if exe is None:
        raise ProbeError(f"{argv[0]} not found on the PATH")
    # Own process group, so a timeout ends the command's children too (they would
    # otherwise hold its output pipe open past the timeout).
    proc = subprocess.Popen([exe, *argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, stdin=subprocess.DEVNULL,
                            start_new_session=True, errors="replace")
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise ProbeError(f"{' '.join(argv)} did not finish within {timeout:g} s") from None
    if proc.returncode != 0:
        tail = (err or out).strip().splitlines()[-1:] or [""]
        raise ProbeError(f"{' '.join(argv)} exited with {proc.returncode}: {tail[0]}")
    return out + err


# ---------------------------------------------------------------- parsers

def parse_mpirun_version(text: str) -> dict:
    """`mpirun --version` of Open MPI ("mpirun (Open MPI) 4.1.4") or MPICH/Hydra
    ("HYDRA build details:" ... "Version: 4.0.2") or Intel MPI."""
    m = re.search(r"\(Open MPI\)\s+(\S+)", text) or re.search(r"Open MPI\s+v?(\d\S*)", text)
    if m:
        return {"implementation": "Open MPI", "version": m.group(1)}
    if "HYDRA" in text:
        m = re.search(r"^\s*Version:\s*(\S+)", text, re.MULTILINE)
        if m:
            return {"implementation": "MPICH", "version": m.group(1)}
    m = re.search(r"Intel\(R\) MPI Library.*?Version\s+(\S+)", text)
    if m:
        return {"implementation": "Intel MPI", "version": m.group(1)}
    raise ValueError("not an mpirun --version output this kit knows")


def parse_cpu_model(cpuinfo: str) -> str:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model Name", "cpu model") and value.strip():
            return value.strip()
    raise ValueError("no CPU model name in /proc/cpuinfo")


def parse_os_release(text: str) -> str:
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        fields[key.strip()] = value.strip().strip('"')
    return fields.get("PRETTY_NAME") or fields.get("NAME") or "unknown"


# ---------------------------------------------------------------- probes

@probe("mpi")
def probe_mpi_version(timeout: float = 10) -> dict:
    return parse_mpirun_version(run_command(["mpirun", "--version"], timeout=timeout))


@probe("cpu")
def probe_cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return parse_cpu_model(f.read())
    except (OSError, ValueError):
        return platform.processor() or platform.machine()


@probe("os")
def probe_os() -> str:
    try:
        with open("/etc/os-release") as f:
            name = parse_os_release(f.read())
    except OSError:
        name = platform.system()
    return f"{name}, kernel {platform.release()}"


@probe("gpus")
def probe_nvml_gpus() -> Result:
    """GPUs and driver through NVML (nvidia-ml-py)."""
    try:
        import pynvml
    except ImportError:
        return Result("gpus", SKIP, None, "nvidia-ml-py is not installed: pip install nvidia-ml-py")
    try:
        pynvml.nvmlInit()
    except Exception as e:
        return Result("gpus", SKIP, None, f"no NVIDIA driver reachable through NVML ({e})")
    try:
        def s(v):
            return v.decode() if isinstance(v, bytes) else v
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            gpus.append({"index": i, "name": s(pynvml.nvmlDeviceGetName(h)),
                         "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                         "compute_capability": f"{major}.{minor}"})
        return {"driver": s(pynvml.nvmlSystemGetDriverVersion()), "count": len(gpus),
                "devices": gpus}
    finally:
        pynvml.nvmlShutdown()


@probe("python_packages")
def probe_package_versions(names=("torch", "torchvision", "horovod", "numpy")) -> dict:
    from importlib import metadata
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    out["python"] = platform.python_version()
    return out


@probe("torch_cuda")
def probe_torch_cuda() -> dict:
    """CUDA, cuDNN and NCCL as the installed torch sees them."""
    import torch
    out = {"cuda_build": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
           "cudnn": None, "nccl": None}
    if torch.backends.cudnn.is_available():
        out["cudnn"] = torch.backends.cudnn.version()
    if torch.cuda.is_available():
        try:
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
    return out


def image_info() -> dict | None:
    """The lab image's id and labels, as the container launcher passes them in."""
    image = os.environ.get("LAB_IMAGE_ID")
    if not image:
        return None
    raw = os.environ.get("LAB_IMAGE_LABELS", "")
    try:
        labels = json.loads(raw) if raw else {}
    except ValueError:
        labels = {"unparsed": raw}
    return {"id": image, "labels": labels}
