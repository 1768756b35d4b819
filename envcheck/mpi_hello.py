"""`mpirun -np N python -m envcheck.mpi_hello [--gpu]`: every rank initialises MPI
through its C library (ctypes; no mpi4py needed), answers with its rank, the world
size and its host, asks Open MPI for its CUDA support (MPIX_Query_cuda_support: in Open
MPI 4.1 it returns the compile-time OPAL_CUDA_SUPPORT, ompi/mpiext/cuda/c/mpiext_cuda.c,
so it tells the library's build, not what works at run time; Open MPI 5 asks its
accelerator framework), and all-reduces a small buffer through MPI: host memory,
or with --gpu a torch CUDA tensor's memory (which only a CUDA-aware MPI can read).
Each rank prints one JSON line."""
from __future__ import annotations

import ctypes
import json
import socket
import sys


def _load():
    for name in ("libmpi.so.40", "libmpi.so.12", "libmpi.so"):
        try:
            return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            continue
    raise OSError("no libmpi.so found by the loader")


def _handles(lib):
    """MPI_COMM_WORLD, MPI_FLOAT, MPI_SUM as the library spells them: Open MPI's are
    addresses of global objects, MPICH's are integer constants (from its mpi.h)."""
    try:
        addr = lambda s: ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(lib, s)))  # noqa: E731
        return "Open MPI", addr("ompi_mpi_comm_world"), addr("ompi_mpi_float"), addr("ompi_mpi_op_sum")
    except ValueError:
        return "MPICH", ctypes.c_int(0x44000000), ctypes.c_int(0x4C00040A), ctypes.c_int(0x58000003)


def main(argv=None) -> int:
    gpu = "--gpu" in (argv if argv is not None else sys.argv[1:])
    lib = _load()
    impl, comm, mpi_float, mpi_sum = _handles(lib)
    lib.MPI_Init(None, None)
    rank, size = ctypes.c_int(), ctypes.c_int()
    lib.MPI_Comm_rank(comm, ctypes.byref(rank))
    lib.MPI_Comm_size(comm, ctypes.byref(size))
    out = {"rank": rank.value, "size": size.value, "host": socket.gethostname(),
           "implementation": impl, "cuda_support_query": None}
    if hasattr(lib, "MPIX_Query_cuda_support"):
        out["cuda_support_query"] = bool(lib.MPIX_Query_cuda_support())
    n = 4
    want = float(size.value * (size.value + 1) / 2)
    if gpu:
        import torch
        torch.cuda.set_device(rank.value % torch.cuda.device_count())
        send = torch.full((n,), float(rank.value + 1), device="cuda")
        recv = torch.zeros(n, device="cuda")
        torch.cuda.synchronize()
        rc = lib.MPI_Allreduce(ctypes.c_void_p(send.data_ptr()), ctypes.c_void_p(recv.data_ptr()),
                               n, mpi_float, mpi_sum, comm)
        got = recv.cpu().tolist()
    else:
        send = (ctypes.c_float * n)(*([float(rank.value + 1)] * n))
        recv = (ctypes.c_float * n)()
        rc = lib.MPI_Allreduce(send, recv, n, mpi_float, mpi_sum, comm)
        got = list(recv)
    out["allreduce"] = {"buffer": "gpu" if gpu else "host", "rc": rc,
                        "ok": rc == 0 and all(abs(x - want) < 1e-6 for x in got)}
    print(json.dumps(out), flush=True)
    lib.MPI_Finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
