"""The template's environment table, built from every ok record's manifest (not the
last one's): each server the ranks ran on, each NIC, each package set, and where the
records differ (local processes with one torch, the image with another), the values with
the places that reported them."""
from __future__ import annotations

import re

from lab.common.kit import cudnn_version_text
from lab.report import summary
from lab.report.records import ok

# Docker names a container's host after its short id: such a host name is a throw-away
# container of the image, not a server.
CONTAINER_ID = re.compile(r"[0-9a-f]{12}")


def environment(records: list[dict]) -> list[tuple[str, str]]:
    """(item, value) rows, from the manifests of every ok record; an item whose records
    differ has a row per value, named with the places that reported it."""
    good = [r for r in ok(records) if isinstance(r.get("manifest"), dict)]
    if not good:
        return [("records", "no successful run: no environment to describe")]
    return [
        ("servers", servers(good)),
        *by_place("CPU", good, lambda m: str(m.get("cpu_model"))),
        ("NIC model and count", nics(good)),
        *by_place("GPU model and count", good, gpu_text),
        *by_place("GPU interconnect", good, lambda m: m.get("gpu_topology") or "n/a (fewer than two GPUs)"),
        *by_place("OS", good, lambda m: str(m.get("os"))),
        *by_place("GPU driver", good, lambda m: m.get("driver") or "n/a"),
        *by_place("framework packages", good, packages),
        *by_place("CUDA", good, lambda m: built_for(m, m.get("cuda")) or "n/a (CPU build of torch)"),
        *by_place("cuDNN", good, lambda m: built_for(m, cudnn_version_text(m["cudnn"]) if m.get("cudnn")
                                                     else None) or "n/a"),
        *by_place("NCCL", good, lambda m: str(m.get("nccl") or "n/a")),
        *by_place("MPI", good, mpi_text),
        *by_place("image", good, image_text),
    ]


def built_for(m: dict, version: str | None) -> str | None:
    """A CUDA library's version as torch reports it; on CPU ranks, said to be torch's build
    only (pip's default torch is a CUDA build that also runs on a CPU)."""
    if version and not gpu_devices(m):
        return f"{version} (torch's build; the ranks used no GPU)"
    return version


def differing(rows: list[tuple[str, str]]) -> list[str]:
    """The line under the table when some items differ between records."""
    items = list(dict.fromkeys(item.split(" (differs: ")[0] for item, _ in rows if " (differs: " in item))
    if not items:
        return []
    return [f"The records differ in {', '.join(items)}: such an item has a row per value, with the "
            f"places whose runs reported it."]


def by_place(item: str, good: list[dict], value) -> list[tuple[str, str]]:
    """[(item, the one value every record gives)], or a row per value:
    [('item (differs: local)', A), ('item (differs: image, cluster)', B)]."""
    seen: dict[str, list[str]] = {}
    for r in good:
        places = seen.setdefault(value(r["manifest"]), [])
        where = summary.place(r) or "unknown"
        if where not in places:
            places.append(where)
    if len(seen) == 1:
        return [(item, next(iter(seen)))]
    return [(f"{item} (differs: {', '.join(p)})", v) for v, p in seen.items()]


def servers(good: list[dict]) -> str:
    """The hosts the ranks ran on, less the image's throw-away containers (counted apart)."""
    names, containers = [], set()
    for r in good:
        for h in r["world"].get("hosts", []):
            if summary.place(r) == "image" and CONTAINER_ID.fullmatch(h):
                containers.add(h)
            elif h not in names:
                names.append(h)
    names.sort()
    text = f"{len(names)}: {', '.join(names)}" if names else "0"
    if containers:
        text += (f"; and {len(containers)} throw-away container(s) of the image on the machine that "
                 f"ran bench (their host names are container ids)")
    return text


def nics(good: list[dict]) -> str:
    """Every physical NIC any record saw (name, driver, speed), once; virtual ones (a
    container's veth) named only when no record saw a physical one."""
    physical, virtual = [], set()
    for r in good:
        for n in r["manifest"].get("nics") or []:
            if not isinstance(n, dict):
                continue
            if n.get("driver") == "virtual":
                virtual.add(n.get("name"))
                continue
            text = f"{n['name']} ({n['driver']}" + (f", {n['speed_mbps']} Mb/s" if n.get("speed_mbps") else "") + ")"
            if text not in physical:
                physical.append(text)
    if physical:
        return f"{len(physical)}: {', '.join(physical)}"
    if virtual:
        return (f"0 physical: the ranks saw only virtual interfaces ({', '.join(sorted(virtual))}: "
                f"a container's, whose host's NICs it cannot see)")
    return "none reported"


def gpu_devices(m: dict) -> list:
    """The GPUs a manifest reports its ranks saw (none: CPU ranks)."""
    gpus = m.get("gpus")
    return list(gpus.get("devices") or []) if isinstance(gpus, dict) else []


def gpu_text(m: dict) -> str:
    devices = gpu_devices(m)
    if devices:
        names = sorted({d["name"] for d in devices})
        return f"{m['gpus']['count']} x {', '.join(names)} per server"
    return "none (CPU ranks)"


def packages(m: dict) -> str:
    def v(name):
        return m.get(name) or "not installed"
    return (f"torch {v('torch')}, torchvision {v('torchvision')}, horovod {v('horovod')}, "
            f"python {m.get('python')}")


def mpi_text(m: dict) -> str:
    mpi = m.get("mpi")
    return f"{mpi['implementation']} {mpi['version']}" if isinstance(mpi, dict) and "version" in mpi else "n/a"


def image_text(m: dict) -> str:
    image = m.get("image") or {}
    labels = image.get("labels") or {}
    label_text = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in sorted(labels.items())
                           if k.endswith(("_version", "flavor", "gpu_operations")))
    return f"{(image.get('id') or 'none: local processes')[:19]}" + (f" ({label_text})" if label_text else "")
