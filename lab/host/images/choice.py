"""Choosing the built lab image a run goes in: by device, framework and back end, the
GPUs' compute capabilities and the driver. Asked at run time of the engine; builds
nothing (lab.host.images.build builds)."""
from __future__ import annotations

from envcheck.host import probe_gpus
from envcheck.probes import FAIL, PASS, WARN, driver_supports
from lab.common import docker_api, versions
from lab.common.docker_api import IMAGE_REPO, LABEL_PREFIX
from lab.common.versions import archs_cover
from lab.host.errors import RunnerError
from lab.host.images.build import cuda_entries


def candidate_images(device: str, framework: str, backend: str,
                     cudas: list[str] | None = None) -> list[str]:
    """The tags bench looks for, best first: the CPU image for CPU runs (a GPU image
    runs on a CPU too); for GPU runs with Horovod only the images whose GPU operations
    carry the back end (nccl: gpu-nccl, mpi: gpu-mpi; gloo fits neither and is refused
    by the request check, lab.common.kit.horovod_gpu_path_problem); DDP brings its own
    NCCL and Gloo, so any GPU image serves it. `cudas`: the matrix's CUDA entries, the
    default first (its images are gpu-nccl, the others gpu-nccl-cu126 and so on)."""
    cudas = cudas or [""]

    def gpu(ops):
        return [f"{IMAGE_REPO}:gpu-{ops}" + (f"-cu{c.replace('.', '')}" if i else "")
                for i, c in enumerate(cudas)]
    if device == "cpu":
        return [f"{IMAGE_REPO}:cpu", *gpu("nccl"), *gpu("mpi")]
    if framework == "horovod":
        return gpu("mpi") if backend == "mpi" else gpu("nccl")
    return [*gpu("nccl"), *gpu("mpi")]


def matrix_cudas() -> list[str]:
    """The matrix's CUDA entries, its default first."""
    m = versions.read()
    rest = [c for c in cuda_entries(m) if c != m["CUDA_DEFAULT"]]
    return [m["CUDA_DEFAULT"], *rest]


def host_gpu_capabilities() -> list[str]:
    """The compute capability of each GPU of this host (NVML), [] when none is seen or
    NVML is missing. Never raises (envcheck's probe)."""
    r = probe_gpus()
    return [d["compute_capability"] for d in (r.value or {}).get("devices", [])
            if d.get("compute_capability")] if r.status == "PASS" else []


def host_gpu_driver() -> str | None:
    """The NVIDIA driver version of this host (NVML or nvidia-smi), None when none is
    seen. Never raises (envcheck's probe)."""
    r = probe_gpus()
    return (r.value or {}).get("driver") if r.status == "PASS" else None


def host_gpu_devices() -> list[dict]:
    """The GPUs of this host as the NVML probe lists them (name, brand, compute
    capability, UUID), [] when none is seen. Never raises (envcheck's probe)."""
    r = probe_gpus()
    return list((r.value or {}).get("devices", [])) if r.status == "PASS" else []


def by_driver(images: list, driver: str | None, gpus=None, capabilities=()) -> tuple[list, list[str]]:
    """(the images this driver runs, best first; a sentence per image it cannot run).
    The verdict is envcheck.probes.driver_supports' (the version matrix's GA and
    minor-version-compatibility drivers, and CUDA forward compatibility on the driver
    branches nvidia/cuda lists, for data-center GPUs): PASS before WARN, FAIL left out, so
    a CUDA 12.6 image that runs natively goes before a CUDA 13.0 one that runs through
    forward compatibility, and the latter is still taken when it is the only one. The GPU
    images set NVIDIA_DISABLE_REQUIRE, so the container toolkit no longer refuses a
    too-old driver and the image would start with no usable GPU: the choice has to be
    made here. `gpus`: the host's GPUs (host_gpu_devices) when known; `capabilities`:
    theirs, against each image's cuda_archs label (cubins for every GPU make minor-version
    compatibility a PASS)."""
    if not driver:
        return list(images), []
    ranked, refused = [], []
    for i, img in enumerate(images):
        cuda = (img.labels or {}).get(LABEL_PREFIX + "cuda_version")
        archs = (img.labels or {}).get(LABEL_PREFIX + "cuda_archs", "")
        status, line = (driver_supports(driver, cuda, None, archs, capabilities, gpus or ())
                        if cuda else (PASS, ""))
        if status == FAIL:
            refused.append(f"{img.tags[0] if img.tags else img.short_id}: {line}")
        else:
            ranked.append((status != PASS, i, img))
    return [img for *_, img in sorted(ranked, key=lambda t: t[:2])], refused


def unfit_for(labels: dict, capabilities: list[str]) -> list[str]:
    """The capabilities among `capabilities` that an image (its labels) has no code for."""
    archs = (labels or {}).get(LABEL_PREFIX + "cuda_archs")
    if not archs:
        return []
    ptx = (labels or {}).get(LABEL_PREFIX + "cuda_ptx") == "1"
    return sorted({c for c in capabilities if not archs_cover(archs, c, ptx)})


def no_code_sentence(tag: str, labels: dict, missing: list[str]) -> str:
    entry = versions.cuda_entry_for(versions.read(), missing[0])
    fix = (f"build one that has: invoke build --cuda {entry}" if entry else
           "no CUDA entry of the matrix (docker/versions.env) covers it")
    return (f"{tag} has no GPU code for compute capability {', '.join(missing)} (the GPUs here; "
            f"it is built for {(labels or {}).get(LABEL_PREFIX + 'cuda_archs')}): {fix}")


def gpu_image(cli, tags: list[str], check: bool = True):
    """The first of `tags` built that has code for every GPU here (a V100, 7.0, needs the
    CUDA 12.6 image: the CUDA 13 builds start at 7.5) and that this driver runs (an R535
    or R560 driver cannot run CUDA 13); None when none is built. With check, RunnerError
    in one sentence when none fits; without (doctor reports it), the best there is."""
    built = [i for i in (docker_api.find_image(cli, [t]) for t in tags) if i is not None]
    if not built:
        return None
    caps = host_gpu_capabilities()
    fits = [i for i in built if not unfit_for(i.labels, caps)]
    if not fits and check:
        first = built[0]
        raise RunnerError(no_code_sentence(first.tags[0] if first.tags else tags[0], first.labels,
                                           unfit_for(first.labels, caps)))
    runs, refused = by_driver(fits, host_gpu_driver(), host_gpu_devices(), caps)
    if fits and not runs and check:
        raise RunnerError("the NVIDIA driver here runs none of the GPU images built ("
                          + "; ".join(refused) + ")")
    return (runs or fits or built)[0]


def driver_note(img) -> str | None:
    """One line when the chosen GPU image runs on this driver with a caveat (a WARN of
    envcheck.probes.driver_supports: CUDA forward compatibility, minor-version
    compatibility without PTX JIT), None otherwise. Never raises."""
    driver = host_gpu_driver()
    cuda = (getattr(img, "labels", None) or {}).get(LABEL_PREFIX + "cuda_version")
    if not driver or not cuda:
        return None
    try:
        archs = img.labels.get(LABEL_PREFIX + "cuda_archs", "")
        status, line = driver_supports(driver, cuda, None, archs, host_gpu_capabilities(),
                                       host_gpu_devices())
    except Exception:
        return None
    return line if status == WARN else None
