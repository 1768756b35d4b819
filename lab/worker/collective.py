"""The run's own collective, timed on its own payload and world before training: what
one step's gradient exchange costs on these ranks and this link, with no compute around
it. A data-parallel rank hands its whole gradient to one collective per step (Horovod
fuses the tensors into buffers of up to 128 MiB, DDP into buckets of 25 MiB: one flat
tensor of the same bytes stands in for them, so per-tensor latency is not counted); the
8-bit codecs all-gather their payload instead of all-reducing it (int8 sums overflow),
and fp16 halves it (lab.worker.compression.bytes_per_step says which and how many bytes).

Every rank runs the same number of operations, or the ranks would hang on a collective
one of them never joins: the counts follow from the slowest rank's time of each untimed
operation, shared before the next (counts()). Up to WARMUP untimed operations (one where it
alone took longer than BUDGET_S: a 537 MB all-reduce over a 1 Gbit/s link takes 4.5 s, and
its set-up is nothing beside that), then enough timed ones to fill BUDGET_S, between 3 and
REPEATS (1 where one operation takes longer than BUDGET_S). The figure is the slowest
rank's median, as the step waits for the slowest rank. Bandwidths use nccl-tests' formulas
(lab.common.collectives)."""
from __future__ import annotations

import math
import statistics
import time

from lab.common import collectives

WARMUP, REPEATS, BUDGET_S = 2, 7, 2.0


def counts(took_s: float) -> tuple[bool, int]:
    """(whether to run another untimed operation, how many to time), from the slowest
    rank's time of the last untimed one: the same on every rank, as every rank reads the
    same shared figure."""
    if took_s > BUDGET_S:
        return False, 1
    return True, max(3, min(REPEATS, math.ceil(BUDGET_S / max(took_s, 1e-9))))


def timed(call, sync, slowest, warmup: int = WARMUP) -> list[float]:
    """This rank's times of the timed operations. `slowest(seconds)` returns the largest
    of every rank's figure (an all-gather), so that all ranks agree on the counts."""
    n = 3
    for _ in range(warmup):
        t0 = time.perf_counter()
        call()
        sync()
        more, n = counts(slowest(time.perf_counter() - t0))
        if not more:
            break
    times: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def operation(d, op: str, payload_bytes: int, device, half: bool = False):
    """(a callable running `op` once on `payload_bytes` through the run's framework, the
    bytes nccl-tests would call its size). `half`: the payload is fp16 values."""
    import torch
    n = d.size
    if op == "allreduce":
        dtype = torch.float16 if half else torch.float32
        x = torch.ones(max(1, payload_bytes // (2 if half else 4)), dtype=dtype, device=device)
        size = x.numel() * x.element_size()
        if d.name == "horovod":
            hvd = d.hvd
            return (lambda: hvd.allreduce(x, op=hvd.Sum, name="lab.collective.probe")), size
        return (lambda: d.dist.all_reduce(x)), size
    # allgather: each rank's part is its payload, the size is the whole output
    x = torch.ones(max(1, payload_bytes), dtype=torch.uint8, device=device)
    size = x.numel() * n
    if d.name == "horovod":
        hvd = d.hvd
        return (lambda: hvd.allgather(x, name="lab.collective.probe")), size
    out = [torch.empty_like(x) for _ in range(n)]
    return (lambda: d.dist.all_gather(out, x)), size


def measure(d, op: str, payload_bytes: int, device, half: bool = False) -> dict:
    """The record's `collective` figure: op, size, the slowest rank's median seconds,
    algbw and busbw, how many were timed and what the measurement cost."""
    import torch

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def slowest(seconds: float) -> float:
        return max(d.allgather_object(seconds))

    t0 = time.perf_counter()
    call, size = operation(d, op, payload_bytes, device, half)
    times = timed(call, sync, slowest)
    slowest_median = slowest(statistics.median(times))
    return {"op": op, "size_bytes": size, "time_s": slowest_median, "timed": len(times),
            **collectives.bandwidths(op, size, slowest_median, d.size), "ranks": d.size,
            "cost_s": time.perf_counter() - t0}
