"""Each node of the simulated cluster with cores of its own while a run spans several
nodes, as servers have: the machine's cores split into one contiguous share per node
(`docker update --cpuset-cpus`, the Docker SDK's Container.update), all of them given
back when the run ends.

Without it the nodes' ranks and their communication threads (Horovod's background
thread, Open MPI's and Gloo's progress) are scheduled on one another's cores, and a run
across two nodes varies with where the scheduler happens to put them: on a 2-core VM,
Horovod over MPI's MNIST step across two nodes at 1 Gbit/s took 3.6 to 5.9 ms in four
runs with shared cores and 3.6 to 4.1 ms in the four runs interleaved with them with a
core each (`python -m lab.host.node_cores_bench`). LAB_NODE_CORES=shared keeps the
nodes on all the machine's cores (as before); a run on one node has them all anyway.

The shares are of the cores this process may use (os.sched_getaffinity): the cluster is
on this machine's Docker engine. Pure parts first, then the edge."""
from __future__ import annotations

import os

from lab.host.places.base import RunnerError

NODE_CORES_VAR = "LAB_NODE_CORES"
MODES = ("own", "shared")


def mode(environ=os.environ) -> str:
    """LAB_NODE_CORES: own (the default) or shared; anything else is refused in one sentence."""
    value = (environ.get(NODE_CORES_VAR) or "own").strip().lower()
    if value not in MODES:
        raise RunnerError(f"{NODE_CORES_VAR}={environ.get(NODE_CORES_VAR)!r} is neither own nor shared: "
                          f"unset it (each node has cores of its own during a run across nodes) or "
                          f"set it to shared")
    return value


def shares(cpus: list[int], hosts: list[str]) -> dict[str, list[int]] | None:
    """Each host's own cores: `cpus` in order, split into len(hosts) contiguous runs, the
    first ones one core larger where they do not divide; None for fewer than 2 hosts or
    fewer cpus than hosts (then the nodes share them all)."""
    if len(hosts) < 2 or len(cpus) < len(hosts):
        return None
    cpus, out, start = sorted(cpus), {}, 0
    size, extra = divmod(len(cpus), len(hosts))
    for i, h in enumerate(hosts):
        end = start + size + (1 if i < extra else 0)
        out[h] = cpus[start:end]
        start = end
    return out


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


def machine_cpus() -> list[int]:
    """The cores this process may use (the cluster's engine is on this machine)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:      # not Linux
        return list(range(os.cpu_count() or 1))


def planned(hosts: list[str], environ=os.environ) -> dict[str, str] | None:
    """Host -> its cpuset during a run on `hosts`, or None where they share the cores
    (LAB_NODE_CORES=shared, one node, fewer cores than nodes)."""
    if mode(environ) == "shared":
        return None
    split = shares(machine_cpus(), hosts)
    return {h: cpuset_text(c) for h, c in split.items()} if split else None


# ---------------------------------------------------------------- edge

def give(found: dict, cpusets: dict[str, str]) -> None:
    """Set each node's cpuset (host -> cpuset text); a refusal of the engine is one sentence."""
    import docker.errors
    for host, text in cpusets.items():
        try:
            found[host].update(cpuset_cpus=text)
        except docker.errors.APIError as e:
            raise RunnerError(f"giving {host} the cores {text} failed ({e.explanation or e}): set "
                              f"{NODE_CORES_VAR}=shared to run with the nodes sharing the cores") from None


def give_back(found: dict) -> None:
    """Every node on all the machine's cores again (never raises: it runs in a finally)."""
    everything = cpuset_text(machine_cpus())
    for c in found.values():
        try:
            c.update(cpuset_cpus=everything)
        except Exception:       # a node that stopped: nothing to give back
            pass
