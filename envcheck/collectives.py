"""`python -m torch.distributed.run --nproc-per-node N -m envcheck.collectives` (doctor starts
the ranks as torchrun --standalone does, through lab.host.launchers.local): the
collectives nccl-tests times (all-reduce, all-gather, reduce-scatter, broadcast, reduce,
all-to-all: lab.common.collectives.OPS) swept over message sizes through torch.distributed
(Gloo on CPU, NCCL on GPU), reported as nccl-tests reports them: per size the slowest
rank's mean time, algbw = size / time and busbw = algbw x the operation's bus factor
(lab.common.collectives; size as nccl-tests counts it: the whole buffer, for all-gather
the output and for reduce-scatter the input). Timed as nccl-tests times them
(NVIDIA/nccl-tests src/common.cu, BenchTime: warm-up iterations untimed, then a host
timer around the timed iterations, stopped once the streams are synchronized): here
torch.cuda.synchronize before the timer stops. On GPUs the sizes go to 1 GiB (GPU_SIZES),
where NCCL nears its bus bandwidth (nccl-tests' README runs -e 8G); on CPU to 16 MiB.

With one rank no collective is timed: nothing crosses a bus, and busbw is 0 by
definition. The rank's device-to-device (or memory) copy is swept over the same sizes
instead (plan() decides; "copy" rows, not "ops").

Beside them, the reference a bus bandwidth is a share of on one machine: the memory
copy bandwidth, measured STREAM's way ("Copy", a(i) = b(i): the bytes read plus the
bytes written per second; McCalpin, STREAM benchmark, www.cs.virginia.edu/stream) by
rank 0 alone while the others wait, on a buffer of COPY_BYTES (on a GPU: a copy in its
memory). Rank 0 prints one JSON line."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from lab.common import ccl as lab_ccl

DEFAULT_SIZES = [2**k for k in range(12, 25, 2)]     # 4 KiB .. 16 MiB
GPU_SIZES = [2**k for k in range(12, 31, 2)]         # 4 KiB .. 1 GiB
COPY_BYTES = 256 * 2**20                              # well past any CPU cache


def plan(device_type: str, ranks: int) -> dict:
    """What a sweep on `ranks` ranks of `device_type` ("cpu" or "cuda") times, and at which
    sizes: {"measure": "collectives" or, with one rank, "copy", "sizes": [bytes]}."""
    return {"measure": "copy" if ranks <= 1 else "collectives",
            "sizes": list(GPU_SIZES if device_type == "cuda" else DEFAULT_SIZES)}


def copy_gbs(nbytes: int, seconds: float) -> float:
    """A copy's bandwidth as STREAM counts it: the bytes read plus the bytes written."""
    return 2 * nbytes / seconds / 1e9 if seconds > 0 else 0.0


def _floats(size: int, n: int) -> int:
    return max(n, size // 4 // n * n)             # a count every rank's share divides


def _torch_ops(dist, torch, n: int, device):
    """op -> (make its buffers for `size` bytes, then run it once) through
    torch.distributed; sizes as nccl-tests counts them."""
    def allreduce(size):
        x = torch.ones(_floats(size, n), device=device)
        return lambda: dist.all_reduce(x)

    def allgather(size):
        out = torch.empty(_floats(size, n), device=device)
        part = torch.ones(_floats(size, n) // n, device=device)
        return lambda: dist.all_gather_into_tensor(out, part)

    def reducescatter(size):
        inp = torch.ones(_floats(size, n), device=device)
        part = torch.empty(_floats(size, n) // n, device=device)
        return lambda: dist.reduce_scatter_tensor(part, inp)

    def broadcast(size):
        x = torch.ones(_floats(size, n), device=device)
        return lambda: dist.broadcast(x, 0)

    def reduce(size):
        x = torch.ones(_floats(size, n), device=device)
        return lambda: dist.reduce(x, 0)

    def alltoall(size):
        inp = torch.ones(_floats(size, n), device=device)
        out = torch.empty(_floats(size, n), device=device)
        return lambda: dist.all_to_all_single(out, inp)

    return {"allreduce": allreduce, "allgather": allgather, "reducescatter": reducescatter,
            "broadcast": broadcast, "reduce": reduce, "alltoall": alltoall}


def _horovod_ops(hvd, torch, n: int):
    """The same through Horovod's own collectives (horovod.torch 0.28.1: allreduce,
    allgather concatenating on dimension 0, reducescatter, broadcast, alltoall with even
    splits), on host memory: under mpirun, MPI's. Horovod has no reduce to a root."""
    def allreduce(size):
        x = torch.ones(_floats(size, n))
        return lambda: hvd.allreduce(x, op=hvd.Sum)

    def allgather(size):
        part = torch.ones(_floats(size, n) // n)
        return lambda: hvd.allgather(part)

    def reducescatter(size):
        inp = torch.ones(_floats(size, n))
        return lambda: hvd.reducescatter(inp, op=hvd.Sum)

    def broadcast(size):
        x = torch.ones(_floats(size, n))
        return lambda: hvd.broadcast(x, 0)

    def alltoall(size):
        inp = torch.ones(_floats(size, n))
        return lambda: hvd.alltoall(inp)

    return {"allreduce": allreduce, "allgather": allgather, "reducescatter": reducescatter,
            "broadcast": broadcast, "alltoall": alltoall}


class _Torch:
    """torch.distributed as started by torch.distributed.run or lab.host.launchers.local
    (Gloo on CPU, NCCL on GPU)."""

    def __init__(self, backend: str):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        # The rank's GPU first: NCCL's communicator binds to the current device when it is
        # created, and every rank would otherwise start on GPU 0 (as lab/worker/dist.py
        # does). device_id: "the communicator is immediately formed" on that device
        # (torch/distributed/distributed_c10d.py, init_process_group's docstring, torch >= 2.3).
        self.device = torch.device("cpu")
        kw = {}
        if backend == "nccl":
            self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            torch.cuda.set_device(self.device)
            kw["device_id"] = self.device
        dist.init_process_group(backend, **kw)
        self.rank, self.size, self.name = dist.get_rank(), dist.get_world_size(), backend
        self.ops = _torch_ops(dist, torch, self.size, self.device)

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def barrier(self):
        self.dist.barrier()

    def slowest(self, seconds: float) -> float:
        t = self.torch.tensor([seconds], device=self.device)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t.item())

    def close(self):
        self.dist.destroy_process_group()


class _Horovod:
    """Horovod over MPI, as mpirun starts it (its controller is then MPI); with `ccl`, its
    oneCCL operations under that controller (lab.common.ccl), checked on its own timeline
    to carry the all-reduce (lab.common.ccl.allreduce_ops). oneCCL's operations in Horovod
    0.28.1 are all-reduce, all-gather, broadcast and all-to-all (operations.cc,
    CreateOperationManager); its reduce-scatter would be MPI's, so it is left out."""

    def __init__(self, ccl: bool = False):
        import horovod.torch as hvd
        import torch
        os.environ.update(lab_ccl.horovod_env("ccl" if ccl else "mpi", os.environ))
        hvd.init()
        self.hvd, self.torch, self.device = hvd, torch, torch.device("cpu")
        self.rank, self.size = hvd.rank(), hvd.size()
        self.name = "mpi (Horovod)" if hvd.mpi_enabled() else "gloo (Horovod)"
        self.ops = _horovod_ops(hvd, torch, self.size)
        if ccl:
            seen = lab_ccl.allreduce_ops(hvd, torch, self.rank)["ops"]
            if seen != ["CCL_ALLREDUCE"]:
                raise SystemExit(f"envcheck.collectives: asked for oneCCL, Horovod's timeline shows "
                                 f"{', '.join(seen) or 'no all-reduce'}")
            self.name = "ccl (Horovod)"
            del self.ops["reducescatter"]

    def sync(self):
        pass

    def barrier(self):
        self.hvd.barrier()

    def slowest(self, seconds: float) -> float:
        return float(self.hvd.allreduce(self.torch.tensor([seconds]), op=self.hvd.Max).item())

    def close(self):
        self.hvd.shutdown()


def copy_bandwidth(torch, device, nbytes: int = COPY_BYTES, repeats: int = 5) -> float:
    """GB/s of the best of `repeats` copies of nbytes (read + written, as STREAM counts)."""
    a = torch.ones(nbytes // 4, device=device)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(repeats + 1):                      # the first touches the pages
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        b.copy_(a)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return copy_gbs(nbytes, best)


def _timed(comm, run, warmup: int, iters: int) -> float:
    """The slowest rank's mean seconds of one `run`: `warmup` untimed calls, then `iters`
    between a barrier and the device's synchronization (nccl-tests' BenchTime)."""
    for _ in range(warmup):
        run()
    comm.sync()
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    comm.sync()
    return comm.slowest((time.perf_counter() - t0) / iters)   # the slowest rank sets the pace


def sweep(comm, ops: list[str], sizes: list[int], warmup: int, iters: int) -> dict:
    """op -> one row per size: size_bytes, time_us, algbw_gbs, busbw_gbs."""
    from lab.common.collectives import bandwidths
    out = {}
    for op in ops:
        rows = []
        for size in sizes:
            sec = _timed(comm, comm.ops[op](size), warmup, iters)
            rows.append({"size_bytes": size, "time_us": sec * 1e6, **bandwidths(op, size, sec, comm.size)})
        out[op] = rows
    return out


def copy_sweep(comm, sizes: list[int], warmup: int, iters: int) -> list[dict]:
    """One rank: its device's copy of each size (on a GPU, device to device), one row per
    size: size_bytes, time_us, gbs (read + written, as STREAM counts)."""
    def copy(size):
        a = comm.torch.ones(max(1, size // 4), device=comm.device)
        b = comm.torch.empty_like(a)
        return lambda: b.copy_(a)
    rows = []
    for size in sizes:
        sec = _timed(comm, copy(size), warmup, iters)
        rows.append({"size_bytes": size, "time_us": sec * 1e6, "gbs": copy_gbs(size, sec)})
    return rows


def _ints(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes takes bytes as a comma list, not {text!r}") from None
    if not sizes or min(sizes) < 4:
        raise argparse.ArgumentTypeError(f"--sizes takes sizes of 4 bytes or more, not {text!r}")
    return sizes


def main(argv=None) -> int:
    from lab.common.collectives import OPS
    p = argparse.ArgumentParser(prog="python -m envcheck.collectives")
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl", "horovod", "ccl"),
                   help="gloo or nccl: torch.distributed (under torch.distributed.run or lab.host.launchers.local); "
                        "horovod: Horovod's collectives (under mpirun: MPI's); ccl: Horovod's "
                        "oneCCL operations (under mpirun)")
    p.add_argument("--sizes", type=_ints, default=None,
                   help="bytes, comma list (default: plan()'s, to 16 MiB on CPU, 1 GiB on GPUs)")
    p.add_argument("--ops", default="", help=f"collectives, comma list (default: {','.join(OPS)}; "
                                             "Horovod's have no reduce)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args(argv)
    wanted = [op for op in a.ops.split(",") if op] if a.ops else None
    unknown = [op for op in wanted or [] if op not in OPS]
    if unknown:
        p.error(f"no collective {', '.join(unknown)}: --ops takes {', '.join(OPS)}")
    horovod = a.backend in ("horovod", "ccl")
    if horovod and "reduce" in (wanted or []):
        p.error("Horovod has no reduce to a root: leave reduce out of --ops")
    if a.backend == "ccl" and "reducescatter" in (wanted or []):
        p.error("Horovod has no oneCCL reduce-scatter (MPI's would run): leave reducescatter out of --ops")
    import torch
    torch.set_num_threads(1)
    comm = _Horovod(ccl=a.backend == "ccl") if horovod else _Torch(a.backend)
    what = plan(comm.device.type, comm.size)
    sizes = a.sizes or what["sizes"]
    value = {"backend": comm.name, "ranks": comm.size}
    if horovod:
        # each timed operation waits for Horovod's next cycle: the fit takes it out
        from lab.common.horovod_tuning import effective
        value["cycle_time_ms"] = effective()["cycle_time_ms"]
    if what["measure"] == "copy":
        # One rank: no collective, busbw would be 0 by definition; its copy instead.
        value.update(ops={}, copy=copy_sweep(comm, sizes, a.warmup, a.iters), reference=None)
    else:
        ops = wanted or [op for op in OPS if op in comm.ops]
        value["ops"] = sweep(comm, ops, sizes, a.warmup, a.iters)
        comm.barrier()
        reference = None
        if comm.rank == 0:
            reference = {"name": "memory copy" if comm.device.type == "cpu" else "GPU memory copy",
                         "gbs": copy_bandwidth(torch, comm.device)}
        comm.barrier()
        value["reference"] = reference
    if comm.rank == 0:
        print(json.dumps(value), flush=True)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
