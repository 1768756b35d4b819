"""Each node of the simulated cluster with cores of its own while a run spans several
nodes, as servers have: the machine's physical cores (a core's hyper-threads stay
together) split into one equal, contiguous share per node (`docker update
--cpuset-cpus`: the Docker SDK's Container.update), the cores that do not divide left
unused, and all of them given back when the run ends (and at the start of the next run on
the cluster, after a run killed before it could).

Without it the nodes' ranks and their communication threads (Horovod's background
thread, Open MPI's and Gloo's progress) are scheduled on one another's cores, and a run
across nodes changes with where the scheduler happens to put them: on a 2-core VM,
Horovod's MNIST step across two nodes at 1 Gbit/s spread 1.52x (MPI) and 1.61x (Gloo)
over four runs with shared cores, 1.01x and 1.05x over the four runs interleaved with
them with a core each (`python -m lab.benchmarks.node_cores_bench`). LAB_NODE_CORES=shared
keeps the nodes on all the machine's cores; a run on one node has them all anyway.

The cores are those this process may use (os.sched_getaffinity): the cluster is on this
machine's Docker engine, and bench is to run unrestricted (not under taskset). Pure parts
first, then the edge."""
from __future__ import annotations

import os
from pathlib import Path

from lab.host.places.base import RunnerError

NODE_CORES_VAR = "LAB_NODE_CORES"
MODES = ("own", "shared")
TOPOLOGY = Path("/sys/devices/system/cpu")


def mode(environ=os.environ) -> str:
    """LAB_NODE_CORES: own (the default) or shared; anything else is refused in one sentence."""
    value = (environ.get(NODE_CORES_VAR) or "own").strip().lower()
    if value not in MODES:
        raise RunnerError(f"{NODE_CORES_VAR}={environ.get(NODE_CORES_VAR)!r} is neither own nor shared: "
                          f"set it to own (the default: each node has cores of its own during a run "
                          f"across nodes) or to shared (the nodes share all the machine's), or unset it")
    return value


def cpuset_text(cpus: list[int]) -> str:
    """The cpuset list form (cpuset(7)): [0, 1, 2, 5] -> "0-2,5"."""
    out, cpus = [], sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def cpuset_list(text: str) -> list[int]:
    """cpuset_text's inverse: "0-2,5" -> [0, 1, 2, 5]."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def physical_cores(cpus: list[int], siblings) -> list[list[int]]:
    """`cpus` grouped by physical core (siblings(cpu): the cpuset text of its core's
    hyper-threads, or None where unknown), in the order of each core's first cpu."""
    seen: dict[tuple, list[int]] = {}
    mine = set(cpus)
    for c in sorted(mine):
        text = siblings(c)
        group = tuple(sorted(mine & set(cpuset_list(text)))) if text else (c,)
        seen.setdefault(group or (c,), [])
    return [list(g) for g in sorted(seen, key=min)]


def shares(cores: list[list[int]], hosts: list[str]) -> dict[str, list[int]] | None:
    """Each host's own cpus: len(cores) // len(hosts) whole cores each, contiguous in
    order, the remainder unused (equal servers); None for fewer than 2 hosts or fewer
    cores than hosts (then the nodes share them all)."""
    if len(hosts) < 2 or len(cores) < len(hosts):
        return None
    size = len(cores) // len(hosts)
    return {h: sorted(c for core in cores[i * size:(i + 1) * size] for c in core) for i, h in enumerate(hosts)}


def _siblings(cpu: int) -> str | None:
    for name in ("core_cpus_list", "thread_siblings_list"):     # the newer name, then the older
        try:
            return (TOPOLOGY / f"cpu{cpu}" / "topology" / name).read_text().strip()
        except OSError:
            continue
    return None


def machine_cpus() -> list[int]:
    """The cpus this process may use (the cluster's engine is on this machine)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:      # not Linux
        return list(range(os.cpu_count() or 1))


def planned(hosts: list[str], environ=os.environ, siblings=_siblings) -> dict[str, str] | None:
    """Host -> its cpuset during a run on `hosts`, or None where they share the cores
    (LAB_NODE_CORES=shared, one node, fewer physical cores than nodes)."""
    if mode(environ) == "shared":
        return None
    split = shares(physical_cores(machine_cpus(), siblings), hosts)
    return {h: cpuset_text(c) for h, c in split.items()} if split else None


# ---------------------------------------------------------------- edge

def give(found: dict, cpusets: dict[str, str]) -> None:
    """Set each node's cpuset (host -> cpuset text) and check that the engine kept it (an
    engine without the cpuset controller drops it with a warning, not an error); a refusal
    is one sentence."""
    import docker.errors
    for host, text in cpusets.items():
        c = found[host]
        try:
            answer = c.update(cpuset_cpus=text) or {}
            c.reload()
        except docker.errors.APIError as e:
            raise RunnerError(f"giving {host} the cpus {text} failed ({e.explanation or e}): set "
                              f"{NODE_CORES_VAR}=shared to run with the nodes sharing the cores") from None
        kept = (c.attrs.get("HostConfig") or {}).get("CpusetCpus")
        if answer.get("Warnings") or kept != text:
            said = "; ".join(answer.get("Warnings") or []) or f"it kept {kept!r}"
            raise RunnerError(f"the Docker engine did not give {host} the cpus {text} ({said}): set "
                              f"{NODE_CORES_VAR}=shared to run with the nodes sharing the cores")


def give_back(found: dict) -> None:
    """Every node not on all the machine's cpus put back on them (never raises: it runs in
    a finally, and a node that stopped has nothing to give back)."""
    everything = cpuset_text(machine_cpus())
    for c in found.values():
        try:
            c.reload()
            if (c.attrs.get("HostConfig") or {}).get("CpusetCpus") not in ("", None, everything):
                c.update(cpuset_cpus=everything)
        except Exception:
            pass
