"""GPUDirect RDMA readiness (seed 001, step 5): the InfiniBand/RoCE devices and their
ports, the peer-memory module that lets a NIC read GPU memory, where each GPU sits
from its nearest NIC, the NCCL variables that steer it, and (where the ranks run)
the user-space verbs libraries NCCL and Open MPI need. Each probe returns a Result
and never raises; the parsers are pure and tested on captured outputs
(tests/fixtures/README.md). Only the standard library."""
from __future__ import annotations

import ctypes.util
import glob
import os
import re

from envcheck.probes import FAIL, PASS, SKIP, WARN, ProbeError, Result, probe, run_command

IB_ROOT = "/sys/class/infiniband"
# NCCL's test for GPUDirect RDMA through a peer-memory module (ncclIbGdrSupport in
# src/transport/net_ib.cc, net_ib/gdr.cc in later releases: the first three files) and
# UCX's (uct/ib/base/ib_md.c, which also reads /sys/module/nv_peer_mem): nv_peer_mem
# (the legacy Mellanox module) registers memory_peers/nv_mem, nvidia_peermem (part of
# the NVIDIA driver) has its own module directory.
PEERMEM_FILES = ("/sys/kernel/mm/memory_peers/nv_mem/version",
                 "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
                 "/sys/module/nvidia_peermem/version",
                 "/sys/module/nv_peer_mem/version")
# NCCL's path types, nearest first, as its topology code numbers them (NCCL v2.29.7:
# src/graph/topo.h PATH_LOC 0 ... PATH_SYS 9; src/graph/topo.cc topoPathTypeStr, the
# names NCCL_NET_GDR_LEVEL takes). P2C (6) is a GPU reaching a NIC through its C2C link to
# the CPU and the CPU's PCIe (Grace: GH200, GB200; src/graph/paths.cc, mergePathType).
# ncclTopoCheckGdr disables GPUDirect RDMA when "distance > netGdrLevel".
NCCL_PATHS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")
# nvidia-smi topo -m's levels as NCCL paths: NCCL has no NODE, it models a NUMA node as
# one CPU (src/graph/topo.cc), so a path between two host bridges of one NUMA node is PHB.
SMI_TO_NCCL = {"PIX": "PIX", "PXB": "PXB", "NODE": "PHB", "PHB": "PHB", "SYS": "SYS"}
# NCCL's default level (src/graph/paths.cc, ncclTopoCheckGdr, v2.29.2 and later: "int
# netGdrLevel = ncclParamNetGdrC2c() ? PATH_P2C : PATH_PXB", NCCL_PARAM(NetGdrC2c,
# "NET_GDR_C2C", 1)): P2C, PXB with NCCL_NET_GDR_C2C=0. Off C2C systems no GPU-NIC path
# is P2C, so P2C and PXB let the same NICs through there. (2.27 and 2.28 kept PXB and
# counted a P2C path as C2C instead: the same NICs.) The kit's NCCL is 2.29 (versions.env).
NCCL_DEFAULT_GDR_LEVEL = "P2C"
NCCL_RDMA_VARS = ("NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_C2C", "NCCL_IB_HCA", "NCCL_IB_DISABLE",
                  "NCCL_NET_GDR_READ")
# ncclGetLevel's old numbers: levelsOldToNew = {LOC, PIX, PXB, PHB, SYS, SYS}; a number
# past 5 is capped at 5 (maxOldLevel).
OLD_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS", "SYS")


def default_gdr_level(environ) -> str:
    """NCCL's level when NCCL_NET_GDR_LEVEL is unset or ignored: P2C, or PXB when
    NCCL_NET_GDR_C2C is 0 (an integer, as NCCL_PARAM reads it: strtoll)."""
    m = re.match(r"\s*[-+]?\d+", environ.get("NCCL_NET_GDR_C2C", ""))
    return "PXB" if m and int(m.group()) == 0 else NCCL_DEFAULT_GDR_LEVEL


# A level below PIX (LOC, NVL, NVB, C2C; 0 on the old scale) turns GPUDirect RDMA off:
# a GPU's path to a NIC always crosses PCIe (PIX or farther; a PXN path is judged by the
# intermediate GPU's own PCIe path), so ncclTopoCheckGdr's "distance > netGdrLevel" holds
# for every GPU (src/graph/paths.cc).
GDR_OFF = ("GPUDirect RDMA is off by NCCL_NET_GDR_LEVEL={raw}: NCCL stages every GPU's network "
           "traffic through host memory; unset it (NCCL's default is P2C: NICs under the GPU's "
           "PCIe switches, and on C2C systems such as Grace those behind the GPU's own CPU) to "
           "use it")


def _rank(level: str) -> int:
    """The NCCL path number of a level (an NCCL name or nvidia-smi's), past SYS if unknown."""
    level = SMI_TO_NCCL.get(level, level)
    return NCCL_PATHS.index(level) if level in NCCL_PATHS else len(NCCL_PATHS)


# ---------------------------------------------------------------- parsers

def read_ports(root: str = IB_ROOT) -> list[dict]:
    """Each port of each RDMA device under /sys/class/infiniband: state, phys_state,
    link_layer and rate are the files the kernel writes (Documentation/ABI/stable/
    sysfs-class-infiniband; state is "4: ACTIVE", phys_state "5: LinkUp")."""
    out = []
    for dev in sorted(os.listdir(root)):
        ports = os.path.join(root, dev, "ports")
        for port in sorted(os.listdir(ports), key=lambda p: int(p) if p.isdigit() else 0) \
                if os.path.isdir(ports) else []:
            def read(name, base=os.path.join(ports, port)):
                try:
                    with open(os.path.join(base, name)) as f:
                        return f.read().strip()
                except OSError:
                    return None
            state = read("state") or ""
            out.append({"device": dev, "port": int(port) if port.isdigit() else port,
                        "state": state.split(":")[-1].strip() or None,
                        "phys_state": (read("phys_state") or "").split(":")[-1].strip() or None,
                        "link_layer": read("link_layer"), "rate": read("rate")})
    return out


def parse_ibv_devinfo(text: str) -> list[dict]:
    """`ibv_devinfo` (rdma-core): per hca_id, each port's state ("PORT_ACTIVE (4)") and
    link layer."""
    out, dev, port = [], None, None
    for line in text.splitlines():
        s = line.strip()
        if m := re.match(r"hca_id:\s*(\S+)", s):
            dev, port = m.group(1), None
        elif (m := re.match(r"port:\s*(\d+)", s)) and dev:
            port = {"device": dev, "port": int(m.group(1)), "state": None, "phys_state": None,
                    "link_layer": None, "rate": None}
            out.append(port)
        elif port is not None and (m := re.match(r"state:\s*PORT_(\w+)", s)):
            port["state"] = m.group(1)
        elif port is not None and (m := re.match(r"phys_state:\s*(\w+)", s)):
            port["phys_state"] = m.group(1)
        elif port is not None and (m := re.match(r"link_layer:\s*(\S+)", s)):
            port["link_layer"] = m.group(1)
    if not out:
        raise ValueError("no hca_id with a port in the ibv_devinfo output")
    return out


def parse_topo_matrix(text: str) -> dict:
    """`nvidia-smi topo -m` (NVML's topology): {gpu: {nic device: level}} read from the
    GPU rows and the NIC legend ("NIC0: mlx5_0")."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # The header names the columns (GPU0 GPU1 ... NIC0 ...); the GPU0 row has X after it.
    head = next((ln for ln in lines if ln.split()[:1] == ["GPU0"] and ln.split()[1:2] != ["X"]), None)
    if head is None:
        raise ValueError("no GPU0 column in the nvidia-smi topo -m output")
    cols = [c for c in head.split() if re.fullmatch(r"(GPU|NIC)\d+", c)]
    legend = dict(re.findall(r"^\s*(NIC\d+):\s*(\S+)", text, re.MULTILINE))
    out = {}
    for ln in lines:
        cells = ln.split()
        if cells and re.fullmatch(r"GPU\d+", cells[0]) and len(cells) > len(cols):
            row = dict(zip(cols, cells[1:1 + len(cols)]))
            out[cells[0]] = {legend.get(c, c): v for c, v in row.items() if c.startswith("NIC")}
    if not out:
        raise ValueError("no GPU rows in the nvidia-smi topo -m output")
    return out


def parse_ompi_transports(text: str) -> dict:
    """Which RDMA-capable transports an Open MPI has (`ompi_info --parsable --all`): the
    UCX PML and the openib BTL (Open MPI 4.1's two verbs paths)."""
    return {"ucx": bool(re.search(r"^mca:pml:ucx:", text, re.MULTILINE)),
            "openib": bool(re.search(r"^mca:btl:openib:", text, re.MULTILINE))}


# ---------------------------------------------------------------- probes

NO_DEVICE = ("no InfiniBand/RoCE device (nothing in /sys/class/infiniband): NCCL and MPI use "
             "TCP sockets; GPUDirect RDMA needs an RDMA NIC and its driver (e.g. mlx5_ib)")


@probe("rdma_devices")
def probe_rdma_devices(root: str = IB_ROOT) -> Result:
    """The RDMA devices and their ports, from sysfs (or `ibv_devinfo` where sysfs has
    no such class but the tool is installed)."""
    if os.path.isdir(root) and os.listdir(root):
        ports = read_ports(root)
    else:
        try:
            ports = parse_ibv_devinfo(run_command(["ibv_devinfo"], timeout=10))
        except (ProbeError, ValueError):
            return Result("rdma_devices", SKIP, None, NO_DEVICE)
    if not ports:
        return Result("rdma_devices", SKIP, None, NO_DEVICE)
    active = [p for p in ports if p["state"] == "ACTIVE"]
    value = {"ports": ports, "active": [f"{p['device']}:{p['port']}" for p in active]}
    if not active:
        return Result("rdma_devices", FAIL, value,
                      "no RDMA port is ACTIVE: check the cable and link (`ibstat`); an "
                      "InfiniBand fabric also needs a subnet manager (opensm)")
    return Result("rdma_devices", PASS, value)


def _devices(devices: Result) -> list[str]:
    return sorted({p["device"] for p in (devices.value or {}).get("ports", [])}) \
        if devices.status in (PASS, FAIL) and devices.value else []


@probe("gpudirect_peermem")
def probe_peermem(gpus: Result, devices: Result, files=PEERMEM_FILES) -> Result:
    if gpus.status != PASS or not (gpus.value or {}).get("count"):
        return Result("gpudirect_peermem", SKIP, None, "no GPU on this host")
    if not _devices(devices):
        return Result("gpudirect_peermem", SKIP, None, "no RDMA device: nothing to read GPU memory")
    loaded = [f for f in files if os.path.exists(f)]
    if loaded:
        return Result("gpudirect_peermem", PASS, {"loaded": loaded})
    return Result("gpudirect_peermem", WARN, {"loaded": []},
                  "no peer-memory module (nvidia_peermem or nv_peer_mem) is loaded, so NCCL's "
                  "GPUDirect RDMA through it is off: `sudo modprobe nvidia_peermem` (NCCL 2.13+ "
                  "can use DMA-BUF instead where the kernel and driver support it)")


def _gdr_level(environ) -> tuple[str, str | None]:
    """(level, problem): NCCL_NET_GDR_LEVEL as NCCL v2.29.7 reads it (src/graph/paths.cc,
    ncclGetLevel): one of topoPathTypeStr's names up to SYS compared with strcmp (case
    matters), else, when it starts with a digit, strtol on the old scale (0 LOC, 1 PIX,
    2 PXB, 3 PHB, 4 and more SYS); anything else is ignored and NCCL's default holds."""
    raw = environ.get("NCCL_NET_GDR_LEVEL", "")
    default = default_gdr_level(environ)
    if not raw:
        return default, None
    if raw in NCCL_PATHS:
        return raw, None
    if raw[0].isdigit():
        return OLD_LEVELS[min(int(re.match(r"\d+", raw).group()), len(OLD_LEVELS) - 1)], None
    hint = (f" (NCCL compares names exactly: write {raw.upper()})"
            if raw.upper() in NCCL_PATHS else "")
    return default, (f"NCCL_NET_GDR_LEVEL={raw} is none of {', '.join(NCCL_PATHS)} nor a number: "
                     f"NCCL ignores it and uses its default, {default}{hint}")


def _c2c(gpus: Result, gpu: str) -> bool:
    """Whether NVML says GPU<n> of the topology matrix has C2C on (the NVML probe's "c2c")."""
    devices = (gpus.value or {}).get("devices") or []
    i = int(gpu[3:]) if gpu[3:].isdigit() else -1
    return any(d.get("index") == i and d.get("c2c") for d in devices)


@probe("gpu_nic_affinity")
def probe_gpu_nic_affinity(gpus: Result, devices: Result, topo: str | None = None,
                           environ=None, timeout: float = 30) -> Result:
    """Each GPU's nearest RDMA NIC as NVML sees the PCIe tree (`nvidia-smi topo -m`),
    against the level up to which NCCL uses GPUDirect RDMA (NCCL_NET_GDR_LEVEL)."""
    environ = os.environ if environ is None else environ
    if gpus.status != PASS or not (gpus.value or {}).get("count"):
        return Result("gpu_nic_affinity", SKIP, None, "no GPU on this host")
    nics = _devices(devices)
    if not nics:
        return Result("gpu_nic_affinity", SKIP, None, "no RDMA device")
    text = topo if topo is not None else run_command(["nvidia-smi", "topo", "-m"], timeout=timeout)
    try:
        matrix = parse_topo_matrix(text)
    except ValueError as e:
        raise ProbeError(f"nvidia-smi topo -m: {e}") from None
    limit, problem = _gdr_level(environ)
    raw = environ.get("NCCL_NET_GDR_LEVEL", "")
    off = GDR_OFF.format(raw=raw) if _rank(limit) < _rank("PIX") else ""
    nearest = {}
    for gpu, row in matrix.items():
        levels = {nic: lvl for nic, lvl in row.items() if nic in nics}
        if levels:
            nic = min(levels, key=lambda n: _rank(levels[n]))
            nearest[gpu] = {"nic": nic, "level": levels[nic]}
            # A C2C GPU (Grace) reaches a NIC of its own CPU (PHB, or NODE: one NUMA node)
            # through P2C: NCCL's mergePathType(PHB, C2C) (src/graph/paths.cc), set for the
            # GPU's nearest NIC only.
            if _c2c(gpus, gpu) and SMI_TO_NCCL.get(levels[nic]) == "PHB":
                nearest[gpu]["nccl_path"] = "P2C"
    far = {g: v for g, v in nearest.items()
           if _rank(v.get("nccl_path") or v["level"]) > _rank(limit)}
    value = {"nearest": nearest, "gdr_level": limit}
    if not nearest:
        return Result("gpu_nic_affinity", SKIP, value, "nvidia-smi topo -m lists none of the RDMA devices")
    if off:
        return Result("gpu_nic_affinity", WARN, value, off)
    if far:
        return Result("gpu_nic_affinity", WARN, value, "; ".join(
            f"{g}'s nearest NIC {v['nic']} is {v['level']}" for g, v in far.items())
            + (f": beyond NCCL_NET_GDR_LEVEL={raw} ({limit})" if raw and not problem
               else f": beyond NCCL's default level {limit} (off C2C systems: PXB)")
            + ", NCCL stages those GPUs' traffic through host memory (put GPU and NIC under one "
              "PCIe switch, or raise NCCL_NET_GDR_LEVEL, often slower)")
    return Result("gpu_nic_affinity", PASS, value)


@probe("nccl_rdma_settings")
def probe_nccl_rdma_settings(devices: Result, environ=None) -> Result:
    """NCCL_IB_DISABLE, NCCL_IB_HCA and NCCL_NET_GDR_LEVEL against the devices present
    (NCCL docs, env.rst: NCCL_IB_HCA takes `^` to exclude, `=` for exact names, and
    `dev:port` entries; otherwise each entry is a name prefix)."""
    environ = os.environ if environ is None else environ
    nics = _devices(devices)
    value = {k: environ[k] for k in NCCL_RDMA_VARS if k in environ}
    if not nics:
        return Result("nccl_rdma_settings", SKIP, value or None, "no RDMA device")
    level, problem = _gdr_level(environ)
    if problem:
        return Result("nccl_rdma_settings", FAIL, value, problem)
    if _rank(level) < _rank("PIX"):
        return Result("nccl_rdma_settings", WARN, value,
                      GDR_OFF.format(raw=environ["NCCL_NET_GDR_LEVEL"]))
    if environ.get("NCCL_IB_DISABLE", "0").strip() not in ("", "0"):
        return Result("nccl_rdma_settings", WARN, value,
                      "NCCL_IB_DISABLE is set: NCCL uses TCP sockets although RDMA devices are "
                      "here; unset it to use them")
    spec = environ.get("NCCL_IB_HCA", "").strip()
    if spec and not spec.startswith("^"):
        exact = spec.startswith("=")
        wanted = [w.split(":")[0] for w in spec.lstrip("=").split(",") if w]
        if not any((n == w) if exact else n.startswith(w) for w in wanted for n in nics):
            return Result("nccl_rdma_settings", FAIL, value,
                          f"NCCL_IB_HCA={spec} names none of the RDMA devices here "
                          f"({', '.join(nics)}): set it to one of them or unset it")
    return Result("nccl_rdma_settings", PASS, value or {
        "defaults": f"every device; GDR up to {level} (NCCL's default: P2C, PXB with NCCL_NET_GDR_C2C=0)"})


@probe("verbs_libraries")
def probe_verbs_libraries(ompi_info: str | None = None, root: str = IB_ROOT,
                          provider_globs=("/usr/lib/*/libibverbs/lib*-rdmav*.so",
                                          "/usr/lib64/libibverbs/lib*-rdmav*.so")) -> Result:
    """Where the ranks run: libibverbs (NCCL dlopens libibverbs.so, then libibverbs.so.1:
    src/misc/ibvwrap.cc, ibvsymbols.cc in later releases), a provider for the NIC (rdma-core's ibverbs-providers), and
    an Open MPI with a verbs transport (UCX or openib)."""
    lib = ctypes.util.find_library("ibverbs")
    providers = sorted({os.path.basename(p) for g in provider_globs for p in glob.glob(g)})
    transports = None
    if ompi_info is None:
        try:
            ompi_info = run_command(["ompi_info", "--parsable", "--all"], timeout=30)
        except ProbeError:
            ompi_info = ""
    if ompi_info:
        transports = parse_ompi_transports(ompi_info)
    value = {"libibverbs": lib, "providers": providers, "open_mpi": transports}
    missing = []
    if not lib:
        missing.append("libibverbs (NCCL's IB transport)")
    if not providers:
        missing.append("a verbs provider (ibverbs-providers)")
    if transports is not None and not any(transports.values()):
        missing.append("an Open MPI transport over verbs (built without UCX or openib)")
    here = os.path.isdir(root) and bool(os.listdir(root))
    if not missing:
        return Result("verbs_libraries", PASS, value)
    if not here:
        return Result("verbs_libraries", SKIP, value, "no RDMA device visible here; lacking for "
                      "one: " + ", ".join(missing))
    return Result("verbs_libraries", WARN, value, "RDMA devices are here but the ranks lack "
                  + ", ".join(missing) + ": NCCL and MPI fall back to TCP")


def collect(gpus: Result) -> list[Result]:
    """The host's GPUDirect RDMA checks."""
    devices = probe_rdma_devices()
    return [devices, probe_peermem(gpus, devices), probe_gpu_nic_affinity(gpus, devices),
            probe_nccl_rdma_settings(devices)]
