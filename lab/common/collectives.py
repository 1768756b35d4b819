"""Bandwidth of a collective, as nccl-tests reports it (NVIDIA/nccl-tests,
doc/PERFORMANCE.md, "Summary"; each src/<op>.cu's *GetBw computes the same): algorithm
bandwidth algbw = S / t, with S the bytes of the operation's buffer (for all-gather and
all-to-all the whole output, n times each rank's part), and bus bandwidth busbw = algbw
times a factor of the operation and the rank count n, which makes figures of different
operations and world sizes comparable to the hardware's link rate: all-reduce 2(n-1)/n;
all-gather, reduce-scatter and all-to-all (n-1)/n; broadcast and reduce 1 (all the data
leaves, or reaches, the root). With one rank nothing crosses a bus: 0. Standard library
only."""
from __future__ import annotations

OPS = ("allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall")
# nccl-tests' program for each (its src/*.cu, built as build/<name>)
NCCL_TESTS = {"allreduce": "all_reduce_perf", "allgather": "all_gather_perf",
              "reducescatter": "reduce_scatter_perf", "broadcast": "broadcast_perf",
              "reduce": "reduce_perf", "alltoall": "alltoall_perf"}


def bus_factor(op: str, n: int) -> float:
    if op not in OPS:
        raise ValueError(f"no collective {op!r}: one of {', '.join(OPS)}")
    if n <= 1:
        return 0.0
    if op == "allreduce":
        return 2 * (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    return (n - 1) / n


def bandwidths(op: str, size_bytes: int, seconds: float, n: int) -> dict:
    """{"algbw_gbs", "busbw_gbs"} of one operation on `size_bytes` taking `seconds`."""
    algbw = size_bytes / seconds / 1e9 if seconds > 0 else 0.0
    return {"algbw_gbs": algbw, "busbw_gbs": algbw * bus_factor(op, n)}
