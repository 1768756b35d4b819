"""The GPUs through NVML (or nvidia-smi) and their topology: the probes a rank needs
(lab.worker.manifest) without the Docker probes beside them (envcheck.host). Each returns a
Result and never raises; NVML is imported inside."""
from __future__ import annotations

from envcheck.probes import (
    PASS,
    SKIP,
    ProbeError,
    Result,
    parse_nvidia_smi,
    probe,
    run_command,
)


@probe("gpus")
def probe_gpus(timeout: float = 15) -> Result:
    """GPUs and the driver through NVML; nvidia-smi's table when nvidia-ml-py is missing or
    NVML cannot be started. The kit's one look at the host's GPUs: doctor, the image
    choice (lab.host.images.choice) and the GPU count of the lab and acceptance
    (lab.host.suites.gpus) read it."""
    try:
        import pynvml
    except ImportError:
        pynvml = None
    nvml_error = None
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
        except Exception as e:
            nvml_error = e         # no driver or no libnvidia-ml: nvidia-smi below
        else:
            try:
                def s(v):
                    return v.decode() if isinstance(v, bytes) else v
                devs = [_device(pynvml, i, s) for i in range(pynvml.nvmlDeviceGetCount())]
                return Result("gpus", PASS, {"driver": s(pynvml.nvmlSystemGetDriverVersion()),
                                             "count": len(devs), "devices": devs, "source": "NVML"})
            finally:
                pynvml.nvmlShutdown()
    try:
        out = run_command(["nvidia-smi"], timeout=timeout)
    except ProbeError as e:
        if nvml_error is not None:
            return Result("gpus", SKIP, None, f"no NVIDIA driver on this host (NVML: {nvml_error}); "
                                              f"GPU checks are skipped")
        if "not found" in str(e):
            return Result("gpus", SKIP, None, "no NVIDIA driver on this host (no NVML, no nvidia-smi); GPU checks are skipped")
        raise
    try:
        value = parse_nvidia_smi(out)
    except ValueError as e:
        raise ProbeError(f"nvidia-smi printed something this kit cannot read: {e}") from None
    value["source"] = "nvidia-smi"
    return Result("gpus", PASS, value)


def _brand(pynvml, h) -> str:
    """The GPU's brand (nvmlDeviceGetBrand) as NVIDIA_REQUIRE_CUDA's brand= words name it
    (lab.common.versions.NVML_BRANDS); "unknown" where NVML or the bindings cannot say,
    and lab.common.versions.gpu_brand then reads the name."""
    from lab.common.versions import NVML_BRANDS
    try:
        value = int(pynvml.nvmlDeviceGetBrand(h))
    except Exception:              # NVMLError, or bindings without the call
        return "unknown"
    for const, word in NVML_BRANDS.items():
        if getattr(pynvml, const, None) == value:
            return word
    return "unknown"


def _c2c(pynvml, h) -> bool | None:
    """Whether the GPU's C2C link to the CPU is on (Grace: GH200, GB200), through
    nvmlDeviceGetC2cModeInfoV (nvidia-ml-py: isC2cEnabled); None where NVML cannot say."""
    try:
        return bool(pynvml.nvmlDeviceGetC2cModeInfoV(h).isC2cEnabled)
    except Exception:
        return None


def _uuid(pynvml, h, s) -> str | None:
    try:
        return s(pynvml.nvmlDeviceGetUUID(h))
    except Exception:
        return None


def _device(pynvml, i: int, s) -> dict:
    """One GPU as NVML describes it. A detail NVML cannot give (an error on that call, a
    lost GPU, memory info NotSupported) is None ("unknown" for the name): the GPU is still
    counted, so a GPU machine never reads as one without GPUs."""
    def ask(call, default=None):
        try:
            return call()
        except Exception:
            return default
    h = ask(lambda: pynvml.nvmlDeviceGetHandleByIndex(i))
    cc = ask(lambda: pynvml.nvmlDeviceGetCudaComputeCapability(h))
    dev = {"index": i, "name": ask(lambda: s(pynvml.nvmlDeviceGetName(h)), "unknown"),
           "memory_bytes": ask(lambda: int(pynvml.nvmlDeviceGetMemoryInfo(h).total)),
           "compute_capability": f"{cc[0]}.{cc[1]}" if cc else None,
           "brand": _brand(pynvml, h), "uuid": _uuid(pynvml, h, s), "c2c": _c2c(pynvml, h)}
    mig = _mig_uuids(pynvml, h, s)
    return {**dev, "mig_uuids": mig} if mig else dev       # MIG's UUIDs only where there are some


def _mig_uuids(pynvml, h, s) -> list[str]:
    """The UUIDs of a GPU's MIG devices (nvmlDeviceGetMaxMigDeviceCount,
    nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetUUID); [] without MIG, or where NVML
    or the bindings cannot say. CUDA_VISIBLE_DEVICES may name them."""
    out = []
    try:
        for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                out.append(s(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j))))
            except Exception:
                continue            # no MIG device at that index
    except Exception:
        pass                        # no MIG on this GPU or these bindings
    return out


def _topology_level(pynvml, a, b) -> str:
    names = {0: "same board", 10: "one PCIe switch", 20: "several PCIe switches",
             30: "PCIe host bridge", 40: "NUMA node", 50: "across CPU sockets"}
    level = pynvml.nvmlDeviceGetTopologyCommonAncestor(a, b)
    return names.get(int(level), f"level {int(level)}")


def _nvlinks(pynvml, h) -> list[tuple[str, str]]:
    """(kind, remote PCI bus id) of each active NVLink of a GPU; kind is "gpu",
    "switch" or "unknown" (nvmlDeviceGetNvLinkRemoteDeviceType: GPU 0, IBMNPU 1,
    SWITCH 2, nvml.h). Every link number up to the bindings' NVML_NVLINK_MAX_LINKS (12 in
    nvidia-ml-py 11.x, 18 in 12.x, 36 in 13.x) is asked; one that errs (not supported,
    past the GPU's count) is skipped, as NCCL's topology code (src/graph/xml.cc) does."""
    kinds = {getattr(pynvml, "NVML_NVLINK_DEVICE_TYPE_GPU", 0): "gpu",
             getattr(pynvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2): "switch"}
    out = []
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if not pynvml.nvmlDeviceGetNvLinkState(h, link):
                continue
            bus = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId
        except pynvml.NVMLError:
            continue
        try:
            kind = kinds.get(int(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)), "unknown")
        except (pynvml.NVMLError, AttributeError):
            kind = "unknown"              # older drivers or bindings
        out.append((kind, bus.decode() if isinstance(bus, bytes) else bus))
    return out


def _nvlink_p2p(pynvml, a, b) -> bool | None:
    """Whether NVML says a and b talk over NVLink, directly or through NVSwitch
    (nvmlDeviceGetP2PStatus with NVML_P2P_CAPS_INDEX_NVLINK = 2; NVML_P2P_STATUS_OK = 0);
    None when this NVML cannot say."""
    try:
        status = pynvml.nvmlDeviceGetP2PStatus(a, b, getattr(pynvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2))
    except (pynvml.NVMLError, AttributeError):
        return None
    return int(status) == getattr(pynvml, "NVML_P2P_STATUS_OK", 0)


# The rates a GPU collective's bus bandwidth is a share of (doctor prints the share):
# per direction, per GPU, the way nccl-tests' busbw compares with a link's speed.
#
# NVLink: NVML's common speed of the active links in MB/s (field
# NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON = 90 of nvmlDeviceGetFieldValues, nvml.h; an
# unsigned int, NVML_VALUE_TYPE_UNSIGNED_INT = 1; UCX's uct_cuda_base_get_nvlink_common_bw
# reads the same), the figure `nvidia-smi nvlink --status` prints: the links' signalling
# rate (26.562 GB/s a link on H100, 25.781 on V100), a little above NVIDIA's headline data
# rate (25 GB/s). Where NVML does not give it, no NVLink rate is claimed: the version
# NVML reports is no reliable generation (hwloc's topology-nvml.c and other readers of it
# correct H100 reporting NVLink 5), and a guess would be no reference.
NVLINK_FIELD_SPEED_MBPS = 90
NVML_VALUE_TYPE_UNSIGNED_INT = 1
# PCIe: per lane and direction, GB/s, at the link's maximum generation (the current one
# drops while the GPU idles; hwloc's NVML backend reads the maximum too): the PCI-SIG
# signalling rate (2.5, 5, 8, 16, 32, 64 GT/s) times its encoding (8b/10b to gen 2,
# 128b/130b gens 3 to 5; gen 6's FLIT mode carries 236 payload bytes in 256), over 8 bits.
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 8 * 128 / 130 / 8, 4: 16 * 128 / 130 / 8,
                 5: 32 * 128 / 130 / 8, 6: 64 * 236 / 256 / 8}


def _nvlink_rate(pynvml, h, active: int) -> float | None:
    """One active NVLink's rate per direction in GB/s as NVML gives it, or None."""
    if not active:
        return None
    try:
        [fv] = pynvml.nvmlDeviceGetFieldValues(h, [NVLINK_FIELD_SPEED_MBPS])
        if (int(fv.nvmlReturn) == 0 and int(fv.valueType) == NVML_VALUE_TYPE_UNSIGNED_INT
                and int(fv.value.uiVal) > 0):
            return int(fv.value.uiVal) / 1000
    except Exception:           # NVMLError, or bindings without field values
        pass
    return None


def _pcie(pynvml, h) -> dict | None:
    try:
        gen = int(pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h))
        width = int(pynvml.nvmlDeviceGetMaxPcieLinkWidth(h))
    except Exception:
        return None
    if gen not in PCIE_LANE_GBS or width < 1:
        return None
    return {"generation": gen, "width": width, "gbs": round(PCIE_LANE_GBS[gen] * width, 1)}


def interconnect_reference(rates: list[dict], pairs: dict[str, str]) -> dict | None:
    """What a collective between these GPUs can reach per direction: where every pair
    talks over NVLink (direct or through NVSwitch), each GPU's active links times their
    rate, the slowest GPU's; else (some pair goes over PCIe, as on PCIe boards with
    bridged pairs) the slowest GPU's PCIe link. {"name", "gbs"}, or None where NVML gave
    no rate for the path."""
    if pairs and all(p.startswith("NVLink") for p in pairs.values()):
        nv = [r.get("nvlink") for r in rates]
        if not all(n and n.get("gbs") for n in nv):
            return None
        low = min(nv, key=lambda n: n["gbs"])
        return {"name": f"NVLink, {low['links']} links x {low['gbs_per_link']:g} GB/s",
                "gbs": low["gbs"]}
    pcie = [r.get("pcie") for r in rates]
    if pcie and all(pcie):
        low = min(pcie, key=lambda p: p["gbs"])
        return {"name": f"PCIe gen {low['generation']} x{low['width']}", "gbs": low["gbs"]}
    return None


@probe("gpu_topology")
def probe_gpu_topology(gpus: Result) -> Result:
    """For each GPU pair: NVLink (direct links counted, or through NVSwitch), else the
    PCIe path (NVML). On NVSwitch boards (HGX/DGX A100, H100, B200) every link of a GPU
    ends at a switch, whose PCI bus id is no GPU's (NCCL's topology code, src/graph/
    xml.cc, treats such a remote as NVSwitch too), so a pair's NVLink is read from NVML's
    P2P status and the links' remote device type, not only from matching bus ids."""
    if gpus.status != PASS or gpus.value.get("count", 0) < 2:
        return Result("gpu_topology", SKIP, None, "fewer than two GPUs: no GPU-to-GPU link to describe")
    if gpus.value.get("source") != "NVML":
        return Result("gpu_topology", SKIP, None, "needs NVML: pip install nvidia-ml-py")
    import pynvml
    pynvml.nvmlInit()
    try:
        n = pynvml.nvmlDeviceGetCount()
        hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        bus = [pynvml.nvmlDeviceGetPciInfo(h).busId for h in hs]
        bus = [b.decode() if isinstance(b, bytes) else b for b in bus]
        links = [_nvlinks(pynvml, h) for h in hs]
        pairs = {}
        for i in range(n):
            for j in range(i + 1, n):
                direct = sum(1 for _, remote in links[i] if remote == bus[j])
                switched = sum(1 for kind, _ in links[i] if kind == "switch")
                p2p = _nvlink_p2p(pynvml, hs[i], hs[j])
                if direct:
                    pairs[f"{i}-{j}"] = f"NVLink x{direct}"
                elif switched and p2p is not False:
                    pairs[f"{i}-{j}"] = f"NVLink via NVSwitch ({switched} links from GPU {i})"
                elif p2p:
                    pairs[f"{i}-{j}"] = "NVLink"
                else:
                    pairs[f"{i}-{j}"] = _topology_level(pynvml, hs[i], hs[j])
        kinds = sorted({v.split(" x")[0].split(" (")[0] for v in pairs.values()})
        rates = []
        for i, h in enumerate(hs):
            per_link = _nvlink_rate(pynvml, h, len(links[i]))
            nvlink = ({"links": len(links[i]), "gbs_per_link": per_link,
                       "gbs": round(len(links[i]) * per_link, 1)} if per_link else None)
            rates.append({"nvlink": nvlink, "pcie": _pcie(pynvml, h)})
        reference = interconnect_reference(rates, pairs)
        summary = ", ".join(kinds)
        if reference:
            summary += f" ({reference['name']} = {reference['gbs']:g} GB/s per direction)"
        return {"pairs": pairs, "summary": summary, "rates": rates, "reference": reference}
    finally:
        pynvml.nvmlShutdown()
