"""Probes of the host: the Docker engine and its GPU runtime, the GPUs through NVML (or
nvidia-smi), their topology, the driver against the lab image's CUDA, shared memory,
memlock, NCCL_SOCKET_IFNAME and the lab images. Each returns a Result and never raises.
Only the standard library at import; the Docker SDK and NVML are imported inside."""
from __future__ import annotations

import os
import re
import resource

from envcheck.probes import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    ProbeError,
    Result,
    driver_supports,
    parse_nvidia_smi,
    probe,
    run_command,
)

GIB = 2**30
# The labels of an image that doctor shows (lab.host.images writes them).
IMAGE_FACTS = ("flavor", "torch_version", "horovod_version", "horovod_gpu_operations",
               "cuda_version", "cuda_archs", "nccl_version", "kit_version")


def _docker():
    """(client, None) or (None, why): the kit's one Docker connection (lab.host.docker_api)."""
    from lab.host import docker_api
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


@probe("gpus")
def probe_gpus(timeout: float = 15) -> Result:
    """GPUs and the driver through NVML; nvidia-smi when nvidia-ml-py is missing."""
    try:
        import pynvml
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
        except Exception as e:
            return Result("gpus", SKIP, None, f"no NVIDIA driver on this host (NVML: {e}); GPU checks are skipped")
        try:
            def s(v):
                return v.decode() if isinstance(v, bytes) else v
            devs = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                devs.append({"index": i, "name": s(pynvml.nvmlDeviceGetName(h)),
                             "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                             "compute_capability": f"{major}.{minor}"})
            return Result("gpus", PASS, {"driver": s(pynvml.nvmlSystemGetDriverVersion()),
                                         "count": len(devs), "devices": devs, "source": "NVML"})
        finally:
            pynvml.nvmlShutdown()
    try:
        out = run_command(["nvidia-smi"], timeout=timeout)
    except ProbeError as e:
        if "not found" in str(e):
            return Result("gpus", SKIP, None, "no NVIDIA driver on this host (no NVML, no nvidia-smi); GPU checks are skipped")
        raise
    try:
        value = parse_nvidia_smi(out)
    except ValueError as e:
        raise ProbeError(f"nvidia-smi printed something this kit cannot read: {e}") from None
    value["source"] = "nvidia-smi"
    return Result("gpus", PASS, value)


def _topology_level(pynvml, a, b) -> str:
    names = {0: "same board", 10: "one PCIe switch", 20: "several PCIe switches",
             30: "PCIe host bridge", 40: "NUMA node", 50: "across CPU sockets"}
    level = pynvml.nvmlDeviceGetTopologyCommonAncestor(a, b)
    return names.get(int(level), f"level {int(level)}")


@probe("gpu_topology")
def probe_gpu_topology(gpus: Result) -> Result:
    """For each GPU pair: NVLink links between them, else the PCIe path (NVML)."""
    if gpus.status != PASS or gpus.value.get("count", 0) < 2:
        return Result("gpu_topology", SKIP, None, "fewer than two GPUs: no GPU-to-GPU link to describe")
    if gpus.value.get("source") != "NVML":
        return Result("gpu_topology", SKIP, None, "needs NVML: pip install nvidia-ml-py")
    import pynvml
    pynvml.nvmlInit()
    try:
        n = pynvml.nvmlDeviceGetCount()
        hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        pairs = {}
        for i in range(n):
            for j in range(i + 1, n):
                links = 0
                for link in range(18):
                    try:
                        if not pynvml.nvmlDeviceGetNvLinkState(hs[i], link):
                            continue
                        peer = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(hs[i], link)
                        if peer.busId == pynvml.nvmlDeviceGetPciInfo(hs[j]).busId:
                            links += 1
                    except pynvml.NVMLError:
                        break
                pairs[f"{i}-{j}"] = f"NVLink x{links}" if links else _topology_level(pynvml, hs[i], hs[j])
        kinds = sorted(set(v.split(" x")[0] for v in pairs.values()))
        return {"pairs": pairs, "summary": ", ".join(kinds)}
    finally:
        pynvml.nvmlShutdown()


@probe("gpu_container_runtime")
def probe_gpu_runtime(gpus: Result) -> Result:
    """GPUs reach containers through the NVIDIA runtime or CDI devices."""
    if gpus.status != PASS or not gpus.value.get("count"):
        return Result("gpu_container_runtime", SKIP, None, "no GPU on this host")
    c, why = _docker()
    if c is None:
        return Result("gpu_container_runtime", SKIP, None, why)
    info = c.info()
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    cdi = [d for d in ("/etc/cdi", "/var/run/cdi") if os.path.isdir(d)
           and any("nvidia" in f for f in os.listdir(d))]
    if "nvidia" in runtimes or cdi:
        return Result("gpu_container_runtime", PASS, {"runtimes": runtimes, "cdi": cdi})
    return Result("gpu_container_runtime", FAIL, {"runtimes": runtimes},
                  "containers cannot see the GPUs: install the NVIDIA Container Toolkit and run "
                  "`sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker`")


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
def probe_memlock(gpus: Result | None = None) -> Result:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    value = "unlimited" if soft == resource.RLIM_INFINITY else soft
    if soft != resource.RLIM_INFINITY and gpus is not None and gpus.status == PASS and gpus.value.get("count"):
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
    from lab.host.docker_api import kit_images
    found = {tag: {k: v for k, v in labels.items() if k == "id" or k in IMAGE_FACTS}
             for tag, labels in kit_images(c).items()
             if not re.search(r"-\d+\.\d+\.\d+$", tag)}     # not the -<kit version> twin
    if not found:
        return Result("lab_images", WARN, None, "no lab image is built: `invoke build` "
                      "(or --flavor cpu); bench and doctor then use local processes")
    return Result("lab_images", PASS, found)


@probe("driver_for_image_cuda")
def probe_driver_for_image(gpus: Result, images: Result) -> Result:
    if gpus.status != PASS or not gpus.value.get("count"):
        return Result("driver_for_image_cuda", SKIP, None, "no GPU on this host")
    cudas = sorted({v.get("cuda_version") for v in (images.value or {}).values() if v.get("cuda_version")})
    if not cudas:
        return Result("driver_for_image_cuda", SKIP, None, "no GPU image is built")
    driver = gpus.value["driver"]
    worst, lines = PASS, []
    for cuda in cudas:
        status, line = driver_supports(driver, cuda)
        lines.append(line)
        worst = max(worst, status, key=[PASS, WARN, FAIL].index)
    return Result("driver_for_image_cuda", worst, {"driver": driver, "image_cuda": cudas},
                  "" if worst == PASS else "; ".join(lines))


def collect() -> list[Result]:
    from envcheck.probes import probe_cpu_model, probe_os
    gpus = probe_gpus()
    images = probe_lab_images()
    return [probe_os(), probe_cpu_model(), probe_docker_engine(), gpus, probe_gpu_topology(gpus),
            probe_gpu_runtime(gpus), images, probe_driver_for_image(gpus, images), probe_shm(),
            probe_memlock(gpus), probe_nccl_socket_ifname()]
