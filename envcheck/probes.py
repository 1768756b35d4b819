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
import time
from dataclasses import asdict, dataclass

from lab.common import proc

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


@dataclass
class Result:
    name: str
    status: str
    value: object = None
    fix: str = ""
    seconds: float | None = None      # how long the probe took (set by @probe)

    def as_dict(self) -> dict:
        return asdict(self)


class ProbeError(Exception):
    """A probe's own failure; its message becomes the FAIL's fix line."""


def probe(name: str):
    """Decorator: the probe returns a Result; any exception becomes FAIL with the reason."""
    def wrap(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs) -> Result:
            t0 = time.monotonic()
            try:
                out = fn(*args, **kwargs)
            except ProbeError as e:
                out = Result(name, FAIL, None, str(e))
            except Exception as e:  # a probe must never take the report down
                out = Result(name, FAIL, None, f"probe crashed: {type(e).__name__}: {e}")
            if not isinstance(out, Result):
                out = Result(name, PASS, out)
            if out.seconds is None:
                out.seconds = round(time.monotonic() - t0, 2)
            return out
        run.probe_name = name
        return run
    return wrap


def run_command(argv: list[str], timeout: float = 10, env: dict | None = None) -> str:
    """Run a command (through the kit's process helper) and return its output;
    ProbeError when it is missing, fails, or outlives the timeout."""
    exe = shutil.which(argv[0])
    if exe is None:
        raise ProbeError(f"{argv[0]} not found on the PATH")
    # ENVCHECK_TIMEOUT_<COMMAND> (e.g. ENVCHECK_TIMEOUT_NVIDIA_SMI=5) sets one command's limit.
    key = "ENVCHECK_TIMEOUT_" + re.sub(r"[^A-Za-z0-9]", "_", os.path.basename(argv[0])).upper()
    if os.environ.get(key):
        timeout = float(os.environ[key])
    try:
        res = proc.run([exe, *argv[1:]], timeout=timeout, env=env, merge=False, grace=1.0)
    except proc.NotFound as e:
        raise ProbeError(str(e)) from None
    if res.timed_out:
        raise ProbeError(f"{' '.join(argv)} did not finish within {timeout:g} s")
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or [""]
        raise ProbeError(f"{' '.join(argv)} exited with {res.returncode}: {tail[0]}")
    return res.stdout + "\n" + res.stderr if res.stderr else res.stdout


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


def parse_ompi_info_cuda(text: str) -> bool:
    """Whether `ompi_info --parsable --all` says Open MPI was built with CUDA support.
    Open MPI 4.x names the parameter opal_built_with_cuda_support (older releases
    mpi_built_with_cuda_support); either one set to true is enough."""
    values = re.findall(r"^mca:[a-z]+:base:param:(?:opal|mpi)_built_with_cuda_support:value:(\w+)",
                        text, re.MULTILINE)
    if not values:
        raise ValueError("no built_with_cuda_support parameter in the ompi_info output")
    return "true" in values


def parse_nvidia_smi(text: str) -> dict:
    """The default `nvidia-smi` table: driver, the CUDA version the driver supports,
    and each GPU's index, name and memory."""
    head = re.search(r"Driver Version:\s*(\S+)\s+CUDA Version:\s*(\S+)", text)
    if not head:
        raise ValueError("no driver version in the nvidia-smi output")
    gpus = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^\|\s+(\d+)\s+(.+?)\s+(?:On|Off)\s+\|\s+([0-9A-Fa-f:.]+)", line)
        if m and i + 1 < len(lines):
            mem = re.search(r"(\d+)MiB\s*/\s*(\d+)MiB", lines[i + 1])
            gpus.append({"index": int(m.group(1)), "name": m.group(2).strip(),
                         "bus_id": m.group(3),
                         "memory_bytes": int(mem.group(2)) * 2**20 if mem else None})
    return {"driver": head.group(1), "driver_cuda": head.group(2), "count": len(gpus),
            "devices": gpus}


def driver_supports(driver: str, cuda: str, matrix: dict | None = None, archs: str = "",
                    capabilities=(), gpus=()) -> tuple[str, str]:
    """(PASS|WARN|FAIL, sentence): whether a driver runs a CUDA toolkit's binaries. The
    driver of the toolkit's GA release and the minor-version compatibility floor of each
    CUDA entry are the version matrix's (CUDA_X_Y_GA_DRIVER, CUDA_X_Y_COMPAT_DRIVER;
    lab.common.versions.driver_level). Between the two the lab image still starts: it
    sets NVIDIA_DISABLE_REQUIRE, without which the container toolkit would refuse it
    ("unsatisfied condition: cuda>=12.6") unless the driver is one of the branches
    nvidia/cuda's NVIDIA_REQUIRE_CUDA lists. There only cubins run (no PTX JIT): given
    the image's `archs` and the GPUs' `capabilities`, cubins for every GPU make it a
    PASS. Below the floor, a driver branch that nvidia/cuda's NVIDIA_REQUIRE_CUDA lists
    for the release runs it through CUDA forward compatibility (the image's cuda-compat;
    lab.common.versions.forward_compat) on data-center GPUs: a WARN that names the native
    option too. `gpus`: the GPUs (the NVML probe's devices: brand, else name); none known
    is a WARN as well, since the image may run. A FAIL (neither native nor forward
    compatibility) names the CUDA entry to build for this driver and these GPUs."""
    from lab.common import versions
    if matrix is None:
        try:
            matrix = versions.read()
        except OSError:
            matrix = {}
    prefix = "CUDA_" + cuda.replace(".", "_") + "_"
    full = matrix.get(prefix + "GA_DRIVER")
    floor = matrix.get(prefix + "COMPAT_DRIVER")
    level = versions.driver_level(matrix, driver, cuda)
    if level == "unknown":
        return WARN, f"no driver table entry for CUDA {cuda}"
    if level == "ga":
        return PASS, f"driver {driver} >= {full}, the driver of CUDA {cuda}'s GA release"
    if level == "compat":
        if archs and capabilities and all(versions.archs_cover(archs, c) for c in capabilities):
            return PASS, (f"driver {driver} runs CUDA {cuda} through minor-version compatibility "
                          f"(>= {floor}); the image has cubins for compute capability "
                          f"{', '.join(sorted(set(capabilities)))}, so no PTX JIT is needed")
        return WARN, (f"driver {driver} is older than CUDA {cuda}'s GA driver {full} and runs "
                      f"the image only through minor-version compatibility (no PTX JIT, so a GPU "
                      f"newer than the image's architectures fails): update the driver to {full} "
                      f"or newer")
    entry = versions.cuda_entry_for_driver(matrix, driver, capabilities) if matrix else None
    fix = (f"build the image for CUDA {entry} (invoke build --cuda {entry}), which this driver "
           f"runs" if entry else "update the driver, or build the image for an older CUDA (--cuda)")
    brands = versions.forward_compat_brands(cuda, driver)
    if brands:
        native = (f"or build --cuda {entry} to run natively (invoke build --cuda {entry})" if entry
                  else f"or update the driver to {full or floor} or newer to run natively")
        kinds = sorted({versions.gpu_brand(d) for d in gpus})
        branch = versions.version_tuple(driver)[0]
        if not kinds:
            return WARN, (f"driver {driver} (R{branch}) is older than CUDA {cuda} needs natively "
                          f"({full or floor}); it runs the image through CUDA forward compatibility "
                          f"(the image's cuda-compat) on a data-center GPU only: {native}")
        if all(k in versions.DATA_CENTER_BRANDS and k in brands for k in kinds):
            return WARN, (f"driver {driver} (R{branch}) runs CUDA {cuda} through CUDA forward "
                          f"compatibility (the image's cuda-compat) on a data-center GPU; {native}")
        if all(k in brands for k in kinds):
            return WARN, (f"driver {driver} (R{branch}) runs CUDA {cuda} through CUDA forward "
                          f"compatibility (the image's cuda-compat) only if these GPUs (brand "
                          f"{', '.join(kinds)}) are among the RTX server cards NVIDIA supports it "
                          f"on (else CUDA error 804); {native}")
        others = [k for k in kinds if k not in brands]
        return FAIL, (f"driver {driver} is too old for CUDA {cuda} (needs {full or floor}), and "
                      f"CUDA forward compatibility is for data-center GPUs, not brand "
                      f"{', '.join(others)}: {fix}")
    return FAIL, f"driver {driver} is too old for CUDA {cuda} (needs {full or floor}): {fix}"


# CUDA error 802, cudaErrorSystemNotReady ("system not yet initialized"; the driver
# API's CUDA_ERROR_SYSTEM_NOT_READY): the CUDA runtime API reference says the system is
# not ready to start any CUDA work and to ensure the system services are running. On
# NVSwitch boards (HGX/DGX A100, H100, H200, B200) that is NVIDIA's fabric manager, which
# sets up the NVSwitch fabric before any GPU is handed to CUDA. torch reports it as
# "Error 802: system not yet initialized" (c10/cuda/CUDAFunctions.cpp, a warning from
# torch.cuda.is_available(), a RuntimeError from device_count()/init); older torch as
# "cuda runtime error (802)".
CUDA_802 = re.compile(r"Error 802\b|error[ =(]*802\b|\(802\)|system not yet initialized|"
                      r"cudaErrorSystemNotReady|CUDA_ERROR_SYSTEM_NOT_READY")
FABRIC_MANAGER_FIX = ("CUDA error 802 (system not yet initialized): on an HGX/DGX board with "
                      "NVSwitch, NVIDIA's fabric manager must run before CUDA can use the GPUs: "
                      "install nvidia-fabricmanager of exactly the driver's version (the "
                      "nvidia-fabricmanager-<branch> package of the same release) and start it "
                      "(`sudo systemctl enable --now nvidia-fabricmanager`; `systemctl status "
                      "nvidia-fabricmanager` says why it stopped)")


def cuda_init_problem(text: str) -> str | None:
    """What to do about a CUDA initialisation failure torch printed, when it is one this
    kit knows (error 802: the fabric manager); None otherwise."""
    return FABRIC_MANAGER_FIX if CUDA_802.search(text or "") else None


def cuda_available() -> tuple[bool, str]:
    """(torch.cuda.is_available(), what CUDA's initialisation said on the way): torch
    turns a failed cudaGetDeviceCount into a warning and False, so the warning is kept.
    That warning is printed once per process (c10/cuda/CUDAFunctions.cpp warns from a
    once-only device count), so when an earlier torch.cuda call took it, a CUDA build
    that sees no GPU asks torch.cuda.init(): its RuntimeError carries the same error and
    is raised again on every call (torch/cuda/__init__.py, _lazy_init: torch._C._cuda_init()
    throws and _initialized stays False; torch 2.13.0). Never raises."""
    import warnings

    import torch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            avail = torch.cuda.is_available()
        except RuntimeError as e:          # some builds raise instead
            return False, str(e)
    said = " ".join(str(w.message) for w in caught)
    if not avail and not said and getattr(torch.version, "cuda", None):
        try:
            torch.cuda.init()
        except Exception as e:             # RuntimeError, or AssertionError of a broken build
            said = str(e)
    return avail, said


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


@probe("nics")
def probe_nics(root: str = "/sys/class/net") -> list:
    """Network interfaces other than loopback: driver, speed (Mb/s, when the driver
    reports it) and state."""
    out = []
    for name in sorted(os.listdir(root)):
        if name == "lo":
            continue
        base = os.path.join(root, name)

        def read(f):
            try:
                with open(os.path.join(base, f)) as fh:
                    return fh.read().strip()
            except OSError:
                return None
        driver = os.path.basename(os.path.realpath(os.path.join(base, "device", "driver"))) \
            if os.path.exists(os.path.join(base, "device", "driver")) else "virtual"
        speed = read("speed")
        out.append({"name": name, "driver": driver, "state": read("operstate"),
                    "speed_mbps": int(speed) if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else None})
    return out


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
    avail, said = cuda_available()
    out = {"cuda_build": torch.version.cuda, "cuda_available": avail, "cudnn": None, "nccl": None}
    if not avail and cuda_init_problem(said):
        out["cuda_init_error"] = said.strip().splitlines()[0][:300]
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
