"""oneCCL (Intel's oneAPI Collective Communications Library) as Horovod's third CPU back end
(`--backend ccl`), each fact about it stated once: who can run it, the Horovod controller
it runs under, the environment its ranks get, and how a rank tells from Horovod's own
timeline which operations carried its all-reduce. Standard library only: host and ranks
share it.

Horovod 0.28.1 holds its MPI, Gloo and CCL operations in one build and picks one per
process at hvd.init() from HOROVOD_CPU_OPERATIONS (horovod/common/utils/env_parser.cc,
ParseCPUOpsFromEnv; horovod/common/operations.cc, InitializeHorovodOnce), so the rank
itself sets it before hvd.init(), whatever place started it."""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import tempfile
import time

# Horovod's controller under which the CCL operations run: under Gloo's controller
# Horovod's operation list puts Gloo's all-reduce before CCL's (horovod/common/operations.cc,
# CreateOperationManager: Gloo's operations added at l.221-233, CCL's at l.236-245, and
# GlooAllreduce is always enabled), so the first enabled, Gloo's, would carry it; with the MPI
# controller the MPI operations stay beside CCL's for what CCL lacks (reduce-scatter: no CCL
# operation for it), as Horovod's docs/oneccl.rst runs it (mpirun with HOROVOD_CPU_OPERATIONS=CCL).
CONTROLLER = "mpi"

# PyTorch's own "ccl" process group is registered by Intel's torch bindings
# (oneccl_bindings_for_pytorch), which the package index does not carry.
DDP_REFUSAL = ("DDP over oneCCL needs PyTorch's ccl process group from Intel's "
               "oneccl_bindings_for_pytorch, which is not on the package index: use "
               "--framework horovod --backend ccl, or DDP with --backend gloo or mpi")


def config_problem(framework: str, device: str, strategy: str = "ddp",
                   compression: str = "none") -> str | None:
    """Why a run cannot use --backend ccl (one sentence), or None."""
    if framework == "ddp" and strategy != "ddp":
        return (f"the {strategy} strategy runs on torch.distributed, whose ccl process group needs "
                f"Intel's oneccl_bindings_for_pytorch, which is not on the package index: use "
                f"--backend gloo, or --strategy ddp with --framework horovod for oneCCL")
    if framework == "ddp":
        return DDP_REFUSAL
    if device != "cpu":
        return ("the ccl back end is Horovod's oneCCL operations on CPU tensors: use --device cpu, "
                "or --backend nccl on GPUs")
    if compression == "fp16":
        # Horovod 0.28.1's CPU CCL operations map 8/16/32/64-bit integers and 32/64-bit
        # floats to oneCCL's types and throw on any other (horovod/common/ops/ccl_operations.cc
        # l.141-163, GetCCLDataType): "Type float16 is not supported in CCL." on every rank.
        return ("Horovod's oneCCL operations take no float16 tensors, which --compression fp16 "
                "sends: use --compression int8 or none with --backend ccl, or fp16 over "
                "--backend gloo or mpi")
    return None


# What a CCL rank's environment gets before hvd.init() (rank_env): the choice itself, and
# oneCCL's transport. oneccl-devel 2021.13's ATL has two transports (CCL_ATL_TRANSPORT):
# mpi, which loads an MPICH-ABI libmpi.so.12 (Intel MPI, MPICH; Open MPI's is libmpi.so.40,
# another ABI), and ofi, libfabric, which 2021.13 loads as "libfabric.so" unless
# CCL_OFI_LIBRARY_PATH names another (its warning here: "could not open the library:
# libfabric.so"; oneCCL src/common/api_wrapper/ofi_api_wrapper.cpp, ofi_api_init: releases
# up to 2021.10 loaded libfabric.so.1, 2021.11 on load libfabric.so). Debian's Open MPI package
# depends on libfabric1, which has libfabric.so.1 (the unversioned name is its -dev
# package's), so every stack of the kit has it. Its tcp provider runs within a machine and
# across machines alike. oneCCL's warnings (CCL_LOG_LEVEL warn, its default) name on every
# rank each variable set here and the MPI library it did not load; errors still show.
TRANSPORT_ENV = {"CCL_ATL_TRANSPORT": "ofi", "CCL_OFI_LIBRARY_PATH": "libfabric.so.1",
                 "FI_PROVIDER": "tcp", "CCL_LOG_LEVEL": "error"}
# The dynamic timeline, so that the rank can record a few all-reduces (ops_in_timeline).
TIMELINE_ENV = {"HOROVOD_TIMELINE": "DYNAMIC"}


def worker_affinity(cores, local_size: int, workers: int = 1) -> str:
    """CCL_WORKER_AFFINITY for `local_size` ranks on a machine whose processes may run on
    `cores` (the rank's own CPU set): one core per worker thread of each local rank (oneCCL
    starts CCL_WORKER_COUNT threads a rank, 1 by default, and wants exactly local ranks x
    workers entries: src/common/env/env.cpp, parse_affinity, "failed to parse worker
    affinity" otherwise), the last cores of
    the set as oneCCL's own choice takes the last of the machine's, wrapping round when the set
    has fewer cores than ranks. oneCCL 2021.13's own choice takes them from the whole machine,
    outside a container's or a job's CPU set: "start_workers: failed to start worker # 0"
    on the simulated cluster's nodes, whose CPU sets the kit gives (lab.host.places.compose.cores)."""
    cores = sorted(cores)
    n = max(1, local_size) * max(1, workers)
    return ",".join(str(cores[(len(cores) - n + i) % len(cores)]) for i in range(n))


def rank_env(environ, cores=None) -> dict[str, str]:
    """The variables a --backend ccl rank sets in its own environment before hvd.init():
    HOROVOD_CPU_OPERATIONS=CCL always (the back end asked for); the transport's, the
    workers' cores (worker_affinity of `cores`, default this process's CPU set, for the
    local ranks mpirun counts, OMPI_COMM_WORLD_LOCAL_SIZE, and CCL_WORKER_COUNT's threads
    each) and the timeline's unless the
    user exported them (theirs win)."""
    cores = os.sched_getaffinity(0) if cores is None else cores
    env = {"HOROVOD_CPU_OPERATIONS": "CCL"}
    pinned = {}
    # Where the local ranks are not counted (a launcher other than mpirun: srun), oneCCL's
    # own choice stays: a wrong count would fail its parsing.
    if environ.get("OMPI_COMM_WORLD_LOCAL_SIZE"):
        pinned["CCL_WORKER_AFFINITY"] = worker_affinity(
            cores, int(environ["OMPI_COMM_WORLD_LOCAL_SIZE"]), int(environ.get("CCL_WORKER_COUNT") or 1))
    for k, v in {**TRANSPORT_ENV, **pinned, **TIMELINE_ENV}.items():
        if k not in environ:
            env[k] = v
    return env


def horovod_env(backend: str, environ) -> dict[str, str]:
    """What a Horovod rank of `backend` sets in its own environment before hvd.init(): a ccl
    rank rank_env's; an mpi rank HOROVOD_CPU_OPERATIONS=MPI unless exported, so that a
    Horovod built with oneCCL elsewhere, whose run-time default is then CCL
    (env_parser.cc, ParseCPUOpsFromEnv), does not carry --backend mpi's tensors through
    oneCCL; gloo's is set by horovodrun --gloo itself (gloo_run.py, line 208)."""
    if backend == "ccl":
        return rank_env(environ)
    if backend == "mpi" and "HOROVOD_CPU_OPERATIONS" not in environ:
        return {"HOROVOD_CPU_OPERATIONS": "MPI"}
    return {}


_ALLREDUCE = re.compile(r'"name": "([A-Z]+_ALLREDUCE)"')
# The controller's phase before any operation, on the timeline beside it (timeline.cc,
# Timeline::NegotiateStart, line 514: "NEGOTIATE_" + the request's type).
NEGOTIATION = "NEGOTIATE_ALLREDUCE"


def ops_in_timeline(text: str) -> list[str]:
    """The operations that carried all-reduces on Horovod's timeline (CCL_ALLREDUCE,
    MPI_ALLREDUCE, GLOO_ALLREDUCE: horovod/common/common.h), sorted, each once."""
    return sorted(set(_ALLREDUCE.findall(text)) - {NEGOTIATION})


def allreduce_ops(hvd, torch, rank: int, rounds: int = 3, wait_s: float = 5.0) -> dict:
    """Which operations carried Horovod's all-reduce, from its own timeline: a few one-value
    all-reduces recorded into a timeline (the dynamic one, HOROVOD_TIMELINE=DYNAMIC:
    hvd.start_timeline and stop_timeline, horovod/common/basics.py), whose file rank 0 (the
    coordinator, the only rank that writes it: operations.cc, horovod_start_timeline) reads
    once Horovod's writer has closed it, and hands to every rank; `hvd` and `torch` are the
    caller's (horovod.torch and torch: this module imports neither). {"ops": the all-reduce
    activities named (ops_in_timeline), "check_s": what it cost}."""
    t0 = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="lab-timeline-")
    path = os.path.join(folder, "timeline.json")
    try:
        hvd.start_timeline(path)
        for i in range(rounds):
            hvd.allreduce(torch.ones(1), name=f"lab.allreduce_ops.{i}")
        hvd.stop_timeline()
        hvd.allreduce(torch.ones(1), name="lab.allreduce_ops.stop")  # a cycle that applies the stop
        ops = []
        if rank == 0:
            end = time.monotonic() + wait_s
            while time.monotonic() < end:
                try:
                    with open(path) as f:
                        ops = ops_in_timeline(f.read())
                except OSError:
                    pass
                if ops:
                    break
                time.sleep(0.05)
        ops = hvd.broadcast_object(ops, root_rank=0, name="lab.allreduce_ops.seen")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"ops": ops, "check_s": round(time.perf_counter() - t0, 3)}


def transport_problem(environ) -> str | None:
    """Why oneCCL's transport cannot load here (one sentence), or None: its libfabric
    (CCL_OFI_LIBRARY_PATH, the kit's TRANSPORT_ENV unless exported) must open, or oneCCL
    fails inside hvd.init()."""
    name = environ.get("CCL_OFI_LIBRARY_PATH") or TRANSPORT_ENV["CCL_OFI_LIBRARY_PATH"]
    try:
        ctypes.CDLL(name)
    except OSError:
        return (f"--backend ccl needs libfabric ({name}) for oneCCL's transport, and it does not "
                f"load here: install libfabric1 (Debian's Open MPI packages bring it), or set "
                f"CCL_OFI_LIBRARY_PATH to a libfabric that loads")
    return None
