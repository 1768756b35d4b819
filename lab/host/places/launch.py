"""Launch commands, built by pure functions: settings in, argv out. Nothing here
starts a process (the runners of lab.host.places.base do that)."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from lab.common import heartbeat, kit
from lab.common.config import framework_of
from lab.host.places import hold


class HostsError(ValueError):
    """A host list that cannot be parsed; the message says the expected form."""


def rendezvous_port(key: str) -> int:
    """29500 plus a number from 0 to 499 taken from the run (its id and attempt): two
    runs that share a first host do not meet at each other's rendezvous (the compose
    cluster and your servers; Slurm's scripts take it from the job id)."""
    import zlib
    return 29500 + zlib.crc32(key.encode()) % 500


def ranks_per_node(np: int, nodes: int) -> int:
    """The even-spread rule, the one place it is written: np ranks over `nodes` nodes,
    the same number on each (the compose cluster, Slurm's --ntasks-per-node)."""
    if nodes < 1:
        raise HostsError("--nodes must be at least 1")
    if np % nodes:
        raise HostsError(f"--np {np} does not spread evenly over {nodes} nodes: use a multiple of {nodes}")
    return np // nodes


@dataclass(frozen=True)
class Host:
    name: str
    slots: int


def parse_hosts(spec: str) -> list[Host]:
    """Parse Horovod's host syntax "node1:2,node2:2" (a host without ":N" has 1 slot)."""
    hosts = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            raise HostsError(f"empty host in {spec!r}: write hosts as node1:2,node2:2")
        name, sep, slots = part.partition(":")
        if not name:
            raise HostsError(f"missing host name in {part!r}: write hosts as node1:2,node2:2")
        try:
            n = int(slots) if sep else 1
        except ValueError:
            raise HostsError(f"slots of {name!r} must be a whole number, not {slots!r}") from None
        if n < 1:
            raise HostsError(f"{name!r} needs at least 1 slot")
        if any(h.name == name for h in hosts):
            raise HostsError(f"host {name!r} is listed twice")
        hosts.append(Host(name, n))
    return hosts


def format_hosts(hosts: list[Host]) -> str:
    return ",".join(f"{h.name}:{h.slots}" for h in hosts)


def local_hosts(np: int) -> list[Host]:
    return [Host("localhost", np)]


def worker_command(worker_args: list[str], python: str = sys.executable) -> list[str]:
    return [python, "-m", "lab.worker.train", *worker_args]


def horovod_command(np: int, hosts: list[Host], controller: str, worker_args: list[str],
                    python: str = sys.executable, horovodrun: str = "horovodrun") -> list[str]:
    """horovodrun over Gloo or MPI. (NCCL is not a Horovod controller: tensors go
    through NCCL when Horovod was built with HOROVOD_GPU_OPERATIONS=NCCL.)"""
    if controller not in ("gloo", "mpi"):
        raise ValueError(f"Horovod's controller is gloo or mpi, not {controller!r}")
    slots = sum(h.slots for h in hosts)
    if np > slots:
        raise HostsError(f"{np} processes but the hosts offer {slots} slots: "
                         f"lower --np or give hosts more slots")
    return [horovodrun, "-np", str(np), "-H", format_hosts(hosts), f"--{controller}",
            *worker_command(worker_args, python)]


def lean_horovodrun(cmd: list[str], stack: dict | None, python: str) -> list[str]:
    """`cmd` (horovodrun ...) started through lab.host.launchers.horovod, horovodrun's two
    checks of what Horovod was built with (each forks a child importing torch: 3 of the
    4 s a 2-rank horovodrun took to start in the cluster's image here, 2026-11-29) answered
    from the stack probe bench ran where the ranks run. Unchanged where the probe found no
    Horovod (or was not run) or `cmd` is not horovodrun."""
    hvd = (stack or {}).get("horovod")
    if not hvd or not cmd or os.path.basename(cmd[0]) != "horovodrun":
        return cmd
    built = ",".join(c for c in ("gloo", "mpi") if hvd.get(c))
    return [python, "-m", "lab.host.launchers.horovod", f"--built={built}", *cmd[1:]]


def ddp_command(nproc_per_node: int, worker_args: list[str], nnodes: int = 1, node_rank: int = 0,
                rdzv_endpoint: str | None = None, python: str = sys.executable,
                static: bool = False, rdzv_id: str = "", module: str = "lab.worker.train") -> list[str]:
    """torch.distributed.run for one node: standalone on a single node, or joining a
    c10d rendezvous at rdzv_endpoint (host:port) on several (which ignores node_rank:
    it numbers the nodes itself, sorted by address; torch's dynamic_rendezvous), or,
    static (torchrun's default back end), meeting at the master address with node_rank
    kept (node 0 holds ranks 0..nproc-1)."""
    cmd = [python, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}"]
    if static:
        host, _, port = (rdzv_endpoint or "").rpartition(":")
        if not host or not port.isdigit():
            raise ValueError("a static rendezvous needs host:port")
        cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={host}",
                f"--master-port={port}"]
    elif nnodes == 1 and rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        if rdzv_endpoint is None:
            raise ValueError("a multi-node DDP job needs a rendezvous endpoint host:port")
        cmd += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={rdzv_endpoint}", *([f"--rdzv-id={rdzv_id}"] if rdzv_id else [])]
    return [*cmd, "-m", module, *worker_args]


def local_ddp_command(nproc: int, worker_args: list[str], python: str = sys.executable) -> list[str]:
    """DDP's ranks on this one machine, started by lab.host.launchers.local: what
    `torch.distributed.run --standalone` does for them, without the launcher's own
    import of torch (a second import's worth of start-up)."""
    return [python, "-m", "lab.host.launchers.local", f"--nproc-per-node={nproc}",
            "-m", "lab.worker.train", *worker_args]


def framework_for_backend(framework: str, backend: str) -> str:
    """The Horovod controller that carries a back end (lab.common.kit.horovod_controller)."""
    if framework != "horovod":
        raise ValueError("only Horovod has a controller")
    return kit.horovod_controller(backend)


def command(framework: str, backend: str, np: int, worker_args: list[str],
            python: str = sys.executable, horovodrun: str = "horovodrun") -> list[str]:
    """The command that starts `np` local ranks of a run."""
    if framework == "none":
        if np != 1:
            raise HostsError("--framework none runs one process: use --np 1, or "
                             "--framework horovod or ddp")
        return worker_command(worker_args, python)
    if framework == "horovod":
        return horovod_command(np, local_hosts(np), framework_for_backend(framework, backend),
                               worker_args, python, horovodrun)
    if framework == "ddp":
        return ddp_command(np, worker_args, python=python)
    raise ValueError(f"unknown framework {framework!r}")


YIELD_WHEN_IDLE = "OMPI_MCA_mpi_yield_when_idle"


def job_env(s) -> dict[str, str]:
    """What every rank's environment gets on top of the runner's."""
    env = {"OMP_NUM_THREADS": str(s.threads), "PYTHONUNBUFFERED": "1"}
    if os.environ.get(hold.TOKEN_VAR):     # the run holding this machine (lab.host.places.hold)
        env[hold.TOKEN_VAR] = os.environ[hold.TOKEN_VAR]
    env.update(stall_env(s.stall_s, os.environ))
    if s.debug:
        # torch.distributed's checks of collectives' shapes and order, and its logs
        # (PyTorch docs, torch.distributed, "Debugging torch.distributed applications").
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    # Open MPI busy-polls while it waits; on CPUs, with Horovod's background thread
    # beside each rank's compute thread, that steals the cores the ranks compute on
    # (measured here: 2 ranks of the MNIST CNN, 3,000-3,400 images/s polling,
    # 4,400-4,700 yielding). GPU runs keep Open MPI's default (poll: the cores are free
    # and yielding adds latency). Set per run, never in the image, so a value the user
    # exported wins on either device.
    user = os.environ.get(YIELD_WHEN_IDLE)
    if user is not None:
        env[YIELD_WHEN_IDLE] = user
    elif s.device == "cpu":
        env[YIELD_WHEN_IDLE] = "1"
    return env


def resolve_framework(requested: str, stack: dict, strategy: str = "ddp") -> tuple[str, str | None]:
    """auto -> the framework a strategy runs on (torch.distributed.run's ddp for the torch
    strategies, none for dataparallel's one process); for ddp, horovod when it imports,
    else ddp (with a note saying so)."""
    if requested != "auto":
        return requested, None
    if framework_of(strategy):
        return framework_of(strategy), None
    if "horovod" in stack:
        return "horovod", None
    return "ddp", ("Horovod is not installed, so the framework is DDP (torch.distributed.run); "
                   "build Horovod with docker/install-horovod.sh to use it")


HOROVOD_STALL_VAR = "HOROVOD_STALL_CHECK_TIME_SECONDS"


def stall_env(stall_s: float, environ) -> dict[str, str]:
    """Horovod's stall check (on by default, every 60 s: horovod/common/
    stall_inspector.h, stall_warning_time_seconds; HOROVOD_STALL_CHECK_TIME_SECONDS sets
    it, read in horovod/common/operations.cc) set well below our bound, so that its report
    of the ranks that submitted no tensor is on rank 0's output before the watch stops
    the job; a value the user exported wins. The default bound is never under
    heartbeat.STEP_MIN_S once steps run: a quarter of that."""
    if HOROVOD_STALL_VAR in environ or stall_s < 0:
        return {}
    # A quarter: Horovod checks at most once per that time, and a tensor its response
    # cache holds is first invalidated after it (InvalidateStalledCachedTensors), then
    # waits that long again uncached before it is reported: up to three times the value.
    quarter = (stall_s if stall_s > 0 else heartbeat.STEP_MIN_S) / 4
    return {HOROVOD_STALL_VAR: str(max(1, int(quarter)))}
