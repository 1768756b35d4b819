"""Probes of the host: the Docker engine and its GPU runtime, the GPUs through NVML (or
nvidia-smi), their topology, the driver against the lab image's CUDA, shared memory,
memlock, NCCL_SOCKET_IFNAME and the lab images. Each returns a Result and never raises.
Only the standard library at import; the Docker SDK and NVML are imported inside."""
from __future__ import annotations

import os
import re
import resource

from envcheck.gpu import probe_gpu_topology, probe_gpus  # noqa: F401 (doctor and tests ask host for them)
from envcheck.probes import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    Result,
    driver_supports,
    probe,
)

GIB = 2**30
# The labels of an image that doctor shows (lab.host.images writes them).
IMAGE_FACTS = ("flavor", "torch_version", "horovod_version", "horovod_gpu_operations",
               "cuda_version", "cuda_archs", "cuda_ptx", "nccl_version", "kit_version")


def _docker():
    """(client, None) or (None, why): the kit's one Docker connection (lab.common.docker_api)."""
    from lab.common import docker_api
    try:
        return docker_api.client(timeout=10), None
    except docker_api.DockerUnavailable as e:
        return None, str(e)


@probe("docker_engine")
def probe_docker_engine() -> Result:
    c, why = _docker()
    if c is None:
        return Result("docker_engine", SKIP, None,
                      f"{why}: container checks are skipped; start one (`sudo dockerd &`)")
    v = c.version()
    return Result("docker_engine", PASS, {"version": v.get("Version"), "api": v.get("ApiVersion")})



RUNTIME_HOOK = "nvidia-container-runtime-hook"
CDI_HOOK = "nvidia-cdi-hook"
# Where CDI specs are read from (the CDI spec's default directories, cncf-tags/
# container-device-interface SPEC.md: /etc/cdi static, /var/run/cdi dynamic; the NVIDIA
# container toolkit's `spec-dirs` default is the same pair).
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
# `nvidia-ctk cdi generate` writes kind nvidia.com/gpu by default (--vendor nvidia.com,
# --class gpu: nvidia-container-toolkit cmd/nvidia-ctk/cdi/generate/generate.go); moby's
# CDI path asks for "nvidia.com/gpu=<id>" (daemon/devices_nvidia_linux.go).
CDI_KIND = "nvidia.com/gpu"
RUNTIME_FIX = ("install the NVIDIA Container Toolkit so that dockerd finds "
               f"{RUNTIME_HOOK} (or {CDI_HOOK} with a CDI spec) on its PATH, then restart the "
               "engine (`sudo systemctl restart docker`)")


def cdi_specs(dirs=None) -> list[str]:
    """The CDI spec files (.yaml, .json) under `dirs` (CDI_DIRS) that declare NVIDIA's GPU kind."""
    found = []
    for d in CDI_DIRS if dirs is None else dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for n in names:
            if not n.endswith((".yaml", ".yml", ".json")):
                continue
            try:
                with open(os.path.join(d, n), errors="replace") as f:
                    text = f.read(65536)
            except OSError:
                continue
            if re.search(r'"?kind"?\s*:\s*"?' + re.escape(CDI_KIND) + r'"?\s*(,|$)', text, re.MULTILINE):
                found.append(os.path.join(d, n))
    return found


def runtime_without_image(cdi_dirs=None) -> Result:
    """No lab image to try a GPU container with: what dockerd would register, read from
    the same facts it reads. moby (daemon/devices_nvidia_linux.go, getNVIDIADeviceDrivers)
    gives the "gpu" capability when either nvidia-container-runtime-hook or nvidia-cdi-hook
    is on its PATH; through the CDI hook a request becomes nvidia.com/gpu=<id>, which
    needs a CDI spec of that kind (`nvidia-ctk cdi generate`)."""
    import shutil
    name = "gpu_container_runtime"
    hook = shutil.which(RUNTIME_HOOK)
    if hook:
        return Result(name, PASS, {"tried": None, "hook": hook})
    cdi_hook = shutil.which(CDI_HOOK)
    specs = cdi_specs(cdi_dirs)
    if cdi_hook and specs:
        return Result(name, PASS, {"tried": None, "hook": cdi_hook, "cdi_specs": specs})
    if cdi_hook:
        return Result(name, FAIL, {"tried": None, "hook": cdi_hook, "cdi_specs": []},
                      f"{CDI_HOOK} is installed but no CDI spec of kind {CDI_KIND} is in "
                      f"{' or '.join(cdi_dirs or CDI_DIRS)}: `sudo nvidia-ctk cdi generate "
                      f"--output=/etc/cdi/nvidia.yaml`")
    return Result(name, FAIL, {"tried": None, "hook": None},
                  f"no {RUNTIME_HOOK} or {CDI_HOOK} on the PATH and no lab image to try a GPU "
                  f"container with: {RUNTIME_FIX}")


@probe("gpu_container_runtime")
def probe_gpu_runtime(gpus: Result, images: Result | None = None, cdi_dirs=None) -> Result:
    """Whether `--gpus` works: what decides it is the engine, which registers the "gpu"
    capability only when nvidia-container-runtime-hook is on dockerd's PATH (moby
    daemon/nvidia_linux.go, v20.10-v28.2; devices_nvidia_linux.go from v28.3; from
    docker-v29.2 also through nvidia-cdi-hook and CDI); an "nvidia" runtime entry alone
    neither makes nor proves it. So a container of a lab image is started
    with every GPU (docker run --gpus all ... true), as bench's would be; without an image
    the hooks and CDI specs are looked for on this host (runtime_without_image)."""
    name = "gpu_container_runtime"
    if gpus.status != PASS or not gpus.value.get("count"):
        return Result(name, SKIP, None, "no GPU on this host")
    c, why = _docker()
    if c is None:
        return Result(name, SKIP, None, why)
    tags = sorted((images.value or {}) if images is not None and images.status == PASS else {},
                  key=lambda t: (":gpu" not in t, t))
    if not tags:
        return runtime_without_image(cdi_dirs)
    from docker.types import DeviceRequest

    import docker
    from lab.common import docker_api
    from lab.common.docker_api import MANAGED_BY
    # Starting a container with every GPU can take longer than the 10 s the other probes
    # allow (driver initialisation without persistence mode).
    c = docker_api.client(timeout=120)
    container = None
    try:
        container = c.containers.create(
            tags[0], ["true"], labels={MANAGED_BY: "doctor"},
            device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])])
        container.start()          # moby decides on the device request here
        code = container.wait(timeout=60).get("StatusCode")
    except docker.errors.APIError as e:
        text = str(getattr(e, "explanation", None) or e).strip()
        if "could not select device driver" in text:
            return Result(name, FAIL, {"tried": tags[0]},
                          f"the engine cannot give containers GPUs ({text}): {RUNTIME_FIX}")
        return Result(name, FAIL, {"tried": tags[0]},
                      f"a container with --gpus all did not start: {text[:300]}")
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except docker.errors.APIError:
                pass
    if code != 0:
        return Result(name, FAIL, {"tried": tags[0], "exit_code": code},
                      f"a container with --gpus all started but `true` ended with {code}")
    return Result(name, PASS, {"tried": tags[0]})


@probe("shm")
def probe_shm(path: str = "/dev/shm") -> Result:
    st = os.statvfs(path)
    size = st.f_frsize * st.f_blocks
    value = {"path": path, "bytes": size}
    if size < GIB:
        return Result("shm", WARN, value, f"{path} is {size / 2**20:.0f} MiB: NCCL needs more than "
                      f"Docker's 64 MB; give containers --shm-size=1g or more (bench gives 2 GB)")
    return Result("shm", PASS, value)


@probe("memlock")
def probe_memlock(gpus: int = 0, on_host: bool = False) -> Result:
    """The locked-memory limit of this process. Judged where the ranks run (the stack
    part, with the GPUs torch sees there): NCCL and InfiniBand pin host memory. On the
    host it is only shown: the lab's GPU containers get memlock unlimited
    (lab.host.places.image.job_spec; compose.gpu.yaml's ulimits), and a --local run is
    judged by the stack part, which runs here then."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    value = "unlimited" if soft == resource.RLIM_INFINITY else soft
    if on_host:
        return Result("memlock", PASS, value, "" if soft == resource.RLIM_INFINITY else
                      "judged where the ranks run (lab containers with GPUs get unlimited)")
    if soft != resource.RLIM_INFINITY and gpus:
        return Result("memlock", WARN, value, "NCCL and InfiniBand pin memory: raise the limit "
                      "(`ulimit -l unlimited`, or --ulimit memlock=-1 for containers)")
    return Result("memlock", PASS, value)


@probe("nccl_socket_ifname")
def probe_nccl_socket_ifname() -> Result:
    spec = os.environ.get("NCCL_SOCKET_IFNAME")
    if not spec:
        return Result("nccl_socket_ifname", SKIP, None, "NCCL_SOCKET_IFNAME is not set: NCCL picks an interface")
    have = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else []
    wanted = [w for w in spec.lstrip("^=").split(",") if w]
    exact = spec.startswith("=")
    exclude = spec.startswith("^")
    if exclude:
        return Result("nccl_socket_ifname", PASS, {"excludes": wanted, "interfaces": have})
    match = [w for w in wanted if any((i == w) if exact else i.startswith(w) for i in have)]
    if not match:
        return Result("nccl_socket_ifname", FAIL, {"set": spec, "interfaces": have},
                      f"NCCL_SOCKET_IFNAME={spec} names no interface here ({', '.join(have)}): "
                      f"set it to one of them or unset it")
    return Result("nccl_socket_ifname", PASS, {"set": spec, "matches": match})


@probe("lab_images")
def probe_lab_images() -> Result:
    c, why = _docker()
    if c is None:
        return Result("lab_images", SKIP, None, why)
    from lab.common.docker_api import kit_images
    found = {tag: {k: v for k, v in labels.items() if k == "id" or k in IMAGE_FACTS}
             for tag, labels in kit_images(c).items()
             if not re.search(r"-\d+\.\d+\.\d+$", tag)}     # not the -<kit version> twin
    if not found:
        return Result("lab_images", WARN, None, "no lab image is built: `invoke build` "
                      "(or --flavor cpu); bench and doctor then use local processes")
    return Result("lab_images", PASS, found)


def image_cuda(tag: str, labels: dict) -> str | None:
    """The CUDA a lab image was built for: its cuda_version label (lab.host.images.build.labels),
    else the tag's -cuXY suffix (images.build.tags names every CUDA but the default: -cu126)."""
    if labels.get("cuda_version"):
        return labels["cuda_version"]
    m = re.search(r"-cu(\d+)(\d)$", tag)
    return f"{m.group(1)}.{m.group(2)}" if m else None


@probe("driver_for_image_cuda")
def probe_driver_for_image(gpus: Result, images: Result) -> Result:
    """Whether this driver runs a lab GPU image: it passes when any built one runs (bench
    takes the one it runs: lab.host.images.choice.gpu_image); with none built, whether it runs
    what `invoke build` makes (the matrix's default CUDA), and if not, which --cuda to
    build, for this driver and these GPUs (lab.common.versions.cuda_entry_for_driver)."""
    if gpus.status != PASS or not gpus.value.get("count"):
        return Result("driver_for_image_cuda", SKIP, None, "no GPU on this host")
    from lab.common import versions
    driver = gpus.value["driver"]
    devices = gpus.value.get("devices", [])
    caps = [d["compute_capability"] for d in devices if d.get("compute_capability")]
    matrix = versions.read()
    built = {tag: (cuda, labels.get("cuda_archs", "")) for tag, labels in (images.value or {}).items()
             if (cuda := image_cuda(tag, labels))}
    if not built:
        default = matrix.get("CUDA_DEFAULT", "")
        status, line = driver_supports(driver, default, matrix, matrix.get(
            "CUDA_" + default.replace(".", "_") + "_ARCHS", ""), caps, devices)
        value = {"driver": driver, "image_cuda": [], "default_cuda": default}
        if status == PASS:
            return Result("driver_for_image_cuda", SKIP, value,
                          f"no GPU image is built; this driver runs CUDA {default}, what `invoke build` makes")
        entry = versions.cuda_entry_for_driver(matrix, driver, caps)
        fix = (f"build with `invoke build --cuda {entry}`" if entry and entry != default
               else "update the driver")
        return Result("driver_for_image_cuda", WARN, value,
                      f"no GPU image is built, and `invoke build` makes CUDA {default}: {line}; {fix}")
    verdicts = {tag: driver_supports(driver, cuda, matrix, archs, caps, devices)
                for tag, (cuda, archs) in sorted(built.items())}
    order = [PASS, WARN, FAIL]
    best = min((s for s, _ in verdicts.values()), key=order.index)
    value = {"driver": driver, "image_cuda": sorted({c for c, _ in built.values()}),
             "runs": sorted(t for t, (s, _) in verdicts.items() if s == best and best != FAIL)}
    if best == FAIL:
        return Result("driver_for_image_cuda", FAIL, value,
                      "; ".join(f"{t}: {line}" for t, (_, line) in verdicts.items()))
    others = [f"{t}: {line}" for t, (s, line) in verdicts.items() if s != best]
    lines = [f"{', '.join(value['runs'])}: {verdicts[value['runs'][0]][1]}"] if best == WARN else []
    note = "; ".join(lines + ([f"this driver runs {', '.join(value['runs'])}"] if others else []) + others)
    return Result("driver_for_image_cuda", best, value, note)


def collect() -> list[Result]:
    from envcheck import rdma
    from envcheck.probes import probe_cpu_model, probe_os
    gpus = probe_gpus()
    images = probe_lab_images()
    return [probe_os(), probe_cpu_model(), probe_docker_engine(), gpus, probe_gpu_topology(gpus),
            probe_gpu_runtime(gpus, images), images, probe_driver_for_image(gpus, images), probe_shm(),
            probe_memlock(on_host=True), probe_nccl_socket_ifname(), *rdma.collect(gpus)]
