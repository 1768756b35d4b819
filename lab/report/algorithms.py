"""Which algorithm a back end's collective runs, and what it costs one rank: latency steps
and bytes on the wire, the alpha and beta terms of lab.report.cost_model.

- oneCCL (Horovod's ccl back end): by size, _CCL_ALLREDUCE.
- Gloo (torch.distributed's ProcessGroupGloo and Horovod's Gloo operations both call
  gloo::allreduce without choosing an algorithm, which runs its ring: gloo/allreduce.cc,
  "case detail::AllreduceOptionsImpl::UNSPECIFIED: case ...RING") and NCCL: a ring,
  2(n-1) steps and 2(n-1)/n of the buffer per rank (nccl-tests' bus factor).
- Open MPI 4.1.4 (Horovod over MPI, the image's Open MPI): MPI_Allreduce with a
  commutative sum goes to coll/tuned's fixed decision by communicator size and buffer
  bytes (ompi/mca/coll/tuned/coll_tuned_decision_fixed.c, lines 121-213 at v4.1.4):
  recursive doubling, a ring, a segmented ring (with no segment size set it runs the
  plain ring: coll_base_allreduce.c, lines 652-659), Rabenseifner's reduce-scatter and
  all-gather, or reduce then broadcast ("nonoverlapping").

The costs (Thakur, Rabenseifner and Gropp 2005; Patarasuk and Yuan 2009), with p the
largest power of two at most n and, where p < n, two more steps (Rabenseifner's three)
and the buffer twice more for the ranks folded in: ring 2(n-1) steps, 2(n-1)/n x size; recursive doubling
log2 p steps, log2 p x size; Rabenseifner 2 log2 p steps, 2(p-1)/p x size;
nonoverlapping 2 ceil(log2 n) steps, 2 ceil(log2 n) x size (a binomial reduce, then broadcast).
Other operations: all-gather and reduce-scatter n-1 steps, (n-1)/n of the output; the
rest 1 step, the buffer once. A target may name the algorithm instead of its back end's
choice (ALGORITHMS: "tree" is a binomial reduce then broadcast, Thakur et al.'s
nonoverlapping cost). Standard library only."""
from __future__ import annotations

import math

from lab.common import collectives

# Open MPI 4.1.4 coll/tuned, commutative all-reduce: (communicators below this size,
# [(buffers below these bytes, algorithm), ...]); the last bound of each is None: the rest.
RING, SEGMENTED_RING, RECURSIVE_DOUBLING, RABENSEIFNER, NONOVERLAPPING = (
    "ring", "segmented ring", "recursive doubling", "rabenseifner", "nonoverlapping")
# What a target may name (invoke predict --algorithm): its cost, or "auto" (the back end's own)
ALGORITHMS = {"auto": None, "ring": RING, "tree": NONOVERLAPPING, "recursive-doubling": RECURSIVE_DOUBLING,
              "rabenseifner": RABENSEIFNER}
_MPI_ALLREDUCE = [
    (4, [(8, RING), (4096, RECURSIVE_DOUBLING), (8192, RING), (16384, RECURSIVE_DOUBLING),
         (65536, RING), (262144, SEGMENTED_RING), (None, RABENSEIFNER)]),
    (8, [(16, RING), (8192, RECURSIVE_DOUBLING), (None, RABENSEIFNER)]),
    (16, [(8192, RECURSIVE_DOUBLING), (None, RABENSEIFNER)]),
    (32, [(64, SEGMENTED_RING), (4096, RECURSIVE_DOUBLING), (None, RABENSEIFNER)]),
    (64, [(128, SEGMENTED_RING), (None, RABENSEIFNER)]),
    (128, [(262144, RECURSIVE_DOUBLING), (None, RABENSEIFNER)]),
    (256, [(131072, NONOVERLAPPING), (262144, RECURSIVE_DOUBLING), (None, RABENSEIFNER)]),
    (512, [(4096, NONOVERLAPPING), (None, RABENSEIFNER)]),
    (2048, [(2048, NONOVERLAPPING), (16384, RECURSIVE_DOUBLING), (None, RABENSEIFNER)]),
    (4096, [(2048, NONOVERLAPPING), (4096, SEGMENTED_RING), (16384, RECURSIVE_DOUBLING),
            (None, RABENSEIFNER)]),
    (None, [(2048, NONOVERLAPPING), (16384, SEGMENTED_RING), (32768, RECURSIVE_DOUBLING),
            (None, RABENSEIFNER)]),
]

# oneCCL 2021.13.1 over its ofi transport (the kit's: lab.common.ccl.TRANSPORT_ENV), all-reduce
# by buffer bytes (src/coll/selection/selector_allreduce.cpp, l.47-53, with the bounds of
# selector.hpp, l.27-28): recursive doubling up to 8 KiB, "nreduce" (each rank reduces its
# 1/n of the buffer from every other, then gathers the rest: a reduce-scatter and an
# all-gather, costed as the ring's steps and bytes) up to 1 MiB, then a ring.
_CCL_ALLREDUCE = [(8192, RECURSIVE_DOUBLING), (2**20, RING), (None, RING)]


def allreduce_algorithm(backend: str | None, size: float, n: int, algorithm: str | None = None) -> str:
    """The all-reduce algorithm `backend` runs for a buffer of `size` bytes on n ranks
    (`algorithm`, a key of ALGORITHMS: that one instead, "auto" or None the back end's)."""
    if ALGORITHMS.get(algorithm or "auto"):
        return ALGORITHMS[algorithm]
    if backend == "ccl":
        return next(alg for bound, alg in _CCL_ALLREDUCE if bound is None or size <= bound)
    if backend != "mpi":
        return RING
    for below, table in _MPI_ALLREDUCE:
        if below is None or n < below:
            return next(alg for bound, alg in table if bound is None or size < bound)
    return RABENSEIFNER     # not reached: the last row has no bound


def _cost(alg: str, n: int) -> tuple[int, float]:
    """(latency steps, bytes per byte of the buffer) of an all-reduce algorithm on n ranks."""
    if alg in (RING, SEGMENTED_RING):
        return 2 * (n - 1), collectives.bus_factor("allreduce", n)
    p = 2 ** int(math.log2(n))
    extra_steps, extra_bytes = (2, 2.0) if p < n else (0, 0.0)
    k = int(math.log2(p))
    if alg == RECURSIVE_DOUBLING:
        return k + extra_steps, k + extra_bytes
    if alg == RABENSEIFNER:
        # its folding swaps halves, then sends one back: a step more than recursive doubling's
        # (coll_base_allreduce.c, ompi_coll_base_allreduce_intra_redscat_allgather, v4.1.4)
        return 2 * k + extra_steps + (1 if p < n else 0), 2 * (p - 1) / p + extra_bytes
    # nonoverlapping: a binomial reduce, then a broadcast, ceil(log2 n) rounds each
    rounds = math.ceil(math.log2(n))
    return 2 * rounds, 2.0 * rounds


def steps(op: str, n: int, backend: str | None = None, size: float = 0.0, algorithm: str | None = None) -> int:
    """Latency steps one rank waits through for `op` on n ranks (`size`: the buffer;
    `algorithm`: allreduce_algorithm's)."""
    if n < 2:
        return 0
    if op == "allreduce":
        return _cost(allreduce_algorithm(backend, size, n, algorithm), n)[0]
    return n - 1 if op in ("allgather", "reducescatter") else 1


def wire_bytes(op: str, size: float, n: int, backend: str | None = None, algorithm: str | None = None) -> float:
    """Bytes each rank moves for `op` on a buffer of `size` bytes (nccl-tests' size;
    `algorithm`: allreduce_algorithm's)."""
    if n < 2:
        return 0.0
    if op == "allreduce":
        return size * _cost(allreduce_algorithm(backend, size, n, algorithm), n)[1]
    return size * collectives.bus_factor(op, n)
