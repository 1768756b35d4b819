"""A cost model of the data-parallel step: the step time of a configuration predicted from
what its 1-worker run and the collectives' timings measure, so that a configuration can be
predicted before it runs (docs/pages/report.md, "The cost model" names the sources).

step(N) = compute x slowdown + exposed communication + waiting, where
- compute is the 1-worker step (its parts: forward, backward, optimizer, other) and
  slowdown the per-rank loss when N ranks share cores or a GPU, measured apart from the
  N-worker run's steps: the compute ceiling at 1 and N processes (figures.ceiling); the
  N-worker run's own compute parts give only an "explained" figure (lab.report.model_inputs);
- the collective costs alpha x steps(op, n) + beta x size x factor(op, n): a latency and
  a per-byte cost fitted by least squares per framework, back end and place, with the
  steps and bytes of the algorithm the back end runs (lab.report.algorithms: Gloo's
  ring, 2(n-1) steps and 2(n-1)/n of the buffer; Open MPI's choice by size and ranks);
- exposed communication comes from the bucket schedule (DDP: whole tensors in reverse
  order, a bucket closed once it holds 1 MiB, the first, then 25 MiB; Horovod: its
  background thread's cycles, each taking what is queued at its start, fused up to the
  fusion threshold, and costing a cycle cost beyond its collectives, fitted to measured
  exposed time by lab.report.prediction on the other configurations of a back end, place
  and link) run against the gradients becoming ready
  during the backward pass, one collective at a time: what ends after the backward is
  exposed, so the last bucket always is, and a model whose gradients fit in one bucket
  overlaps nothing;
- waiting is what the ranks waited for the slowest, their mean as the other configurations
  at the same ranks measured it, carried as it is.

Pure functions on plain numbers: lab.report.prediction reads the records into them."""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from lab.report import algorithms

MIB = 2**20
DDP_FIRST_BUCKET = 1 * MIB        # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_CAP = 25 * MIB         # DistributedDataParallel's bucket_cap_mb default (None: 25)
HOROVOD_FUSION = 128 * MIB        # Horovod 0.28.1: HOROVOD_FUSION_THRESHOLD's default
HOROVOD_CYCLE_S = 0.001           # HOROVOD_CYCLE_TIME's default, 1 ms
PHASES = 8                        # phases of Horovod's cycles against the backward, averaged
BACKWARD_SHARE = 2 / 3            # without measured parts: backward twice the forward
# What a byte of a collective's payload takes of a link, in the bytes the link carries (TCP
# over Ethernet, MTU 1500): a full segment carries 1448 bytes (1500 less IPv4's 20 and TCP's
# 20 + 12 of the timestamps option, on by default in Linux: net.ipv4.tcp_timestamps) in a
# 1514-byte frame (Ethernet's 14-byte header, which tc's queueing disciplines count), and
# the receiver's ACK, one per two full segments (delayed ACKs: RFC 1122 4.2.3.2, RFC 5681
# 4.2), a 66-byte frame, shares each direction with the data the other rank sends at once.
FRAMING = 1514 / 1448 * (1 + 66 / (2 * 1514))
# Parameter tensors of the kit's models (lab.models): Horovod all-reduces tensor by tensor,
# so no more collectives per step than tensors; unknown models: DEFAULT_TENSORS.
MODEL_TENSORS = {"mnist": 8, "resnet50": 161, "lstm": 6, "vgg16": 32}
DEFAULT_TENSORS = 64


@dataclass
class Fit:
    """t = alpha_s x steps + beta_s_per_byte x wire bytes (lab.report.algorithms, of
    `backend`'s algorithm); `link_gbs` and `delay_s`: the shaped link the points were
    timed on (None and 0 when unshaped); `burst_bytes`: its token bucket (what a message
    after a pause sends at the host's speed; lab.common.link.tbf_burst_bytes)."""
    alpha_s: float
    beta_s_per_byte: float
    points: int
    sizes: int
    how: str
    link_gbs: float | None = None
    delay_s: float = 0.0
    backend: str | None = None
    burst_bytes: float = 0.0
    algorithm: str | None = None    # the all-reduce's algorithm where a target names one

    def time(self, op: str, size: float, n: int) -> float:
        if n < 2 or size <= 0:
            return 0.0
        return (self.alpha_s * algorithms.steps(op, n, self.backend, size, self.algorithm)
                + self.beta_s_per_byte * algorithms.wire_bytes(op, size, n, self.backend, self.algorithm))

    def cost(self, op: str, size: float, n: int, tokens: float = 0.0) -> tuple[float, float]:
        """(seconds, tokens left): `time` less the link's cost of the bytes that `tokens`
        (what is left of the link's bucket in this step) let through unshaped."""
        t = self.time(op, size, n)
        if t <= 0 or tokens <= 0 or not self.link_gbs:
            return t, tokens
        free = min(tokens / FRAMING, algorithms.wire_bytes(op, size, n, self.backend, self.algorithm))
        return t - free * min(link_s_per_byte(self.link_gbs), self.beta_s_per_byte), tokens - free * FRAMING

    def on_link(self, gbs: float | None, delay_s: float = 0.0, burst_bytes: float = 0.0) -> Fit:
        """The same host on another link: its per-byte cost and delay replace the
        fitted place's (gbs None: no link between the ranks)."""
        host_beta = max(0.0, self.beta_s_per_byte - (link_s_per_byte(self.link_gbs) if self.link_gbs else 0.0))
        host_alpha = max(0.0, self.alpha_s - self.delay_s)
        return Fit(host_alpha + delay_s, host_beta + (link_s_per_byte(gbs) if gbs else 0.0), self.points,
                   self.sizes, self.how + ", moved to another link", gbs, delay_s, self.backend,
                   burst_bytes if gbs else 0.0, self.algorithm)

    def as_dict(self) -> dict:
        return asdict(self)


def link_s_per_byte(gbs: float) -> float:
    """What one payload byte costs on a link of `gbs` GB/s (FRAMING)."""
    return FRAMING / (gbs * 1e9)


SMALL_BYTES = 16 * 1024     # a message this small or smaller: the latency regime of a sweep


def fit(points: list[dict], link_gbs: float | None = None, delay_s: float = 0.0, burst_bytes: float = 0.0,
        backend: str | None = None) -> Fit | None:
    """Least squares of alpha and beta over `points` (op, size_bytes, ranks, time_s), each
    residual relative to what was timed (sizes spanning decades weigh alike): its time, or
    `timed_s` where the point's time is less than the timing (Horovod's, less the wait for
    its cycle: horovod_collective_s); both kept at 0 or above. Where messages of
    SMALL_BYTES or less and larger ones were timed, two regimes instead (_two_regimes: the
    latency from the smallest messages, the bandwidth from the rest): least squares over
    sizes spanning decades trades the small messages' time away (a 4 KiB all-reduce of
    1.2 ms fitted with a latency of 3 us), and the latency is what grows with the ranks.
    One distinct size: beta alone through the points. None without points."""
    kept = [p for p in points if p.get("time_s") and p.get("ranks", 0) > 1 and p.get("size_bytes")]
    rows = [(algorithms.steps(p["op"], p["ranks"], backend, p["size_bytes"]),
             algorithms.wire_bytes(p["op"], p["size_bytes"], p["ranks"], backend), p["time_s"],
             max(p.get("timed_s") or 0.0, p["time_s"])) for p in kept]
    if not rows:
        return None
    sizes = len({round(w) for _, w, _, _ in rows})
    out = lambda a, b, how: Fit(a, b, len(rows), sizes, how, link_gbs, delay_s, backend, burst_bytes)  # noqa: E731
    # relative residuals: each equation divided by what was timed
    a = [(s / T, w / T, t / T) for s, w, t, T in rows]
    if sizes >= 2:
        two = _two_regimes([(p["size_bytes"], *r) for p, r in zip(kept, rows)])
        if two is not None:
            return out(*two, "two regimes: latency from the smallest messages, bandwidth from the rest")
        s11 = sum(x * x for x, _, _ in a)
        s12 = sum(x * y for x, y, _ in a)
        s22 = sum(y * y for _, y, _ in a)
        b1, b2 = sum(x * r for x, _, r in a), sum(y * r for _, y, r in a)
        det = s11 * s22 - s12 * s12
        if det > 0:
            alpha, beta = (b1 * s22 - b2 * s12) / det, (s11 * b2 - s12 * b1) / det
            if alpha >= 0 and beta >= 0:
                return out(alpha, beta, "least squares")
        # a negative term: the best fit with it at 0
        alpha_only = b1 / s11 if s11 else 0.0
        beta_only = b2 / s22 if s22 else 0.0
        err_a = sum((x * alpha_only - r) ** 2 for x, _, r in a)
        err_b = sum((y * beta_only - r) ** 2 for _, y, r in a)
        if err_a < err_b:
            return out(alpha_only, 0.0, "least squares, beta 0")
        return out(0.0, beta_only, "least squares, alpha 0")
    beta = sum(y * r for _, y, r in a) / sum(y * y for _, y, _ in a)
    return out(0.0, beta, "one size: bandwidth only")


def _two_regimes(rows: list[tuple[float, int, float, float, float]]) -> tuple[float, float] | None:
    """(alpha, beta) from (size, steps, wire bytes, time, timed) rows in two regimes: beta
    by least squares (relative) over the messages above SMALL_BYTES with the latency taken
    out; alpha the median over the small messages (at most SMALL_BYTES) of their time less
    their bytes at beta, per step, and no more than the fastest message of any size allows
    (every message waits its steps' latency: a noisy small message is not the latency);
    each with the other's last value to their fixed point. None without both kinds of
    message, or where the small messages' time is all bandwidth."""
    small = [r for r in rows if r[0] <= SMALL_BYTES and r[1] > 0]
    large = [r for r in rows if r[0] > SMALL_BYTES]
    if not small or not large:
        return None
    floor = min(t / s for _, s, _, t, _ in rows if s > 0)
    alpha, beta = min(statistics.median(t / s for _, s, _, t, _ in small), floor), 0.0
    for _ in range(50):
        num = sum(w / T * (t - alpha * s) / T for _, s, w, t, T in large)
        den = sum((w / T) ** 2 for _, _, w, _, T in large)
        beta = max(0.0, num / den) if den else 0.0
        alpha = min(statistics.median((t - beta * w) / s for _, s, w, t, _ in small), floor)
    return (alpha, beta) if alpha > 0 else None


def horovod_cycle_s(settings: dict | None) -> float:
    """The Horovod cycle time (seconds) of settings holding `cycle_time_ms` (a record's
    world.horovod, a doctor sweep's line; under HOROVOD_AUTOTUNE where the tuning started);
    HOROVOD_CYCLE_S without."""
    return (settings or {}).get("cycle_time_ms", HOROVOD_CYCLE_S * 1000) / 1000


def horovod_collective_s(time_s: float, cycle_s: float = HOROVOD_CYCLE_S) -> float:
    """What a collective itself took, from a synchronous Horovod operation timed back to
    back (the run's probe, doctor's Horovod sweep). Horovod's background thread starts a
    cycle `cycle_s` after the last one started, or at once when the last one's work outlasted
    that (horovod 0.28.1 operations.cc 751-761, RunLoopOnce), and the caller, spinning on its
    handle (mpi_ops_v2.cc 1121-1131), enqueues the next operation as soon as the last is done.
    So an operation takes one cycle while its work w fits in one, and w once it outlasts one:
    doctor's sweep over MPI here took 1.07 ms at 4 KB and 1 MB and 6.5-6.8 ms at 16 MiB with
    a 1 ms cycle, 5.08 ms, 5.09 ms and 6.0-6.7 ms with a 5 ms cycle (no cycle more above
    one). From two cycles on: time_s. Below one cycle w cannot be seen: 5% of time_s stands
    for it. Between one and two cycles the time is either w or a cycle missed (two cycles
    for a short w): 2 x (time_s - cycle_s), which meets both ends. cycle_s 0 (XLA ops):
    time_s."""
    if cycle_s <= 0 or time_s >= 2 * cycle_s:
        return time_s
    return max(2 * (time_s - cycle_s), 0.05 * time_s)


def ddp_buckets(grad_bytes: float, first: float = DDP_FIRST_BUCKET, cap: float = DDP_BUCKET_CAP,
                tensor_bytes: list[float] | None = None) -> list[float]:
    """DDP's buckets in the order they become ready (the gradients in reverse order of the
    parameters: the first bucket is the first ready). With the parameters' sizes
    (`tensor_bytes`, in the model's order) whole tensors fill a bucket until it holds
    `first` bytes, then `cap` (torch's compute_bucket_assignment_by_size closes a bucket
    once its size is at least the limit); without them, buckets of exactly those sizes."""
    out = []
    if tensor_bytes:
        size, limit = 0.0, first
        for t in reversed(tensor_bytes):
            size += t
            if size >= limit:
                out, size, limit = out + [size], 0.0, cap
        return out + [size] if size > 0 else out
    left, limit = float(grad_bytes), first
    while left > 0:
        out.append(min(limit, left))
        left -= out[-1]
        limit = cap
    return out


def _run(ops: list[tuple[float, float]], backward_s: float) -> dict:
    """(ready at, seconds) per collective, from the backward's start: run one at a time;
    what ends after the backward is exposed."""
    free = 0.0
    for ready, cost in ops:
        free = max(free, ready) + cost
    total = sum(c for _, c in ops)
    return {"exposed_s": max(0.0, free - backward_s), "collectives": len(ops), "collective_s": total,
            "end_s": free}


def ddp_schedule(grad_bytes: float, payload_ratio: float, backward_s: float, fit_: Fit, op: str,
                 n: int, first: float = DDP_FIRST_BUCKET, cap: float = DDP_BUCKET_CAP,
                 tensor_bytes: list[float] | None = None, bucket_cost_s: float = 0.0) -> dict:
    """DDP: each bucket is ready when its last gradient is (uniformly over the backward),
    and its collective moves the bucket's payload (fp32 bytes x `payload_ratio`; an
    all-gather's size is n payloads). `bucket_cost_s`: what a bucket's collective exposes in
    the step beyond its fitted cost (the step waits for each bucket's work at the end of the
    backward: torch/csrc/distributed/c10d/reducer.cpp, Reducer::finalize_backward)."""
    ops, done, tokens = [], 0.0, fit_.burst_bytes
    for b in ddp_buckets(grad_bytes, first, cap, tensor_bytes):
        done += b
        t, tokens = fit_.cost(op, b * payload_ratio * (n if op == "allgather" else 1), n, tokens)
        ops.append((backward_s * done / grad_bytes, t + bucket_cost_s))
    return {**_run(ops, backward_s), "buckets": len(ops)}


def _horovod_cycles(ready: list[float], sizes: list[float], fit_: Fit, op: str, n: int, cycle_s: float,
                    cost_s: float, fusion: float, phase_s: float) -> tuple[float, int, float, int]:
    """One step of Horovod's background thread (horovod 0.28.1): a cycle starts `cycle_s`
    after the last one started, or when the last one's work ends if that is later
    (operations.cc 751-761, RunLoopOnce); it takes the tensors queued by its start
    (controller.cc 93, PopMessagesFromQueue), agrees on them across the ranks with one
    small all-reduce of the response cache's bits, every cycle (controller.cc 154-159,
    response_cache.cc 428, CrossRankBitwiseAnd) and performs the fused responses one after
    another (operations.cc 819-835; FuseResponses, controller.cc 901, up to the fusion
    threshold). `cost_s`: what a cycle costs beyond its collectives (the agreement and the
    rest). Returns (end of the last collective, collectives, their seconds, cycles with work)."""
    period = max(cycle_s, cost_s)
    start, k, end, ops, spent, busy = phase_s - period if period > 0 else 0.0, 0, 0.0, 0, 0.0, 0
    tokens = fit_.burst_bytes
    while k < len(ready):
        if ready[k] > start:               # idle cycles until one starts after the next tensor
            start += math.ceil((ready[k] - start) / period - 1e-12) * period if period > 0 else ready[k] - start
        fresh = 0.0
        while k < len(ready) and ready[k] <= start + 1e-15:
            fresh += sizes[k]
            k += 1
        work = cost_s
        while fresh > 0:       # an all-gather's fused buffer is its gathered bytes (controller.cc 973-984)
            part = min(fresh, fusion / n if op == "allgather" else fusion)
            fresh -= part
            t, tokens = fit_.cost(op, part * (n if op == "allgather" else 1), n, tokens)
            work, ops, spent = work + t, ops + 1, spent + t
        busy += 1
        end = start + work
        start = max(start + cycle_s, end) if cycle_s > 0 or work > 0 else start
    return end, ops, spent, busy


def horovod_schedule(grad_bytes: float, payload_ratio: float, backward_s: float, fit_: Fit, op: str,
                     n: int, tensors: int, cycle_s: float = HOROVOD_CYCLE_S,
                     fusion: float = HOROVOD_FUSION, cycle_cost_s: float = 0.0, phases: int = PHASES,
                     tensor_bytes: list[float] | None = None, ready_share: list[float] | None = None) -> dict:
    """Horovod: the tensors become ready over the backward, in reverse order of the model's
    parameters, each when the backward has gone through bytes up to it (`tensor_bytes`, in
    the model's order; without them `tensors` alike in size, ready uniformly), or, given
    `ready_share` (in the model's order, the share of the backward done when each is ready:
    lab.models.published_gradients), then; and its background thread's cycles
    (_horovod_cycles) fuse and reduce them; the cycles' phase against the backward is
    unknown, so the exposed time is the mean over `phases` phases spread over one cycle."""
    if tensor_bytes and sum(tensor_bytes) > 0:
        total, done, ready = sum(tensor_bytes), 0.0, []
        for t in reversed(tensor_bytes):
            done += t
            ready.append(backward_s * done / total)
        if ready_share:
            ready = [backward_s * r for r in reversed(ready_share)]
        sizes = [t * payload_ratio for t in reversed(tensor_bytes)]
    else:
        count = max(1, tensors)
        ready = [backward_s * (k + 1) / count for k in range(count)]
        sizes = [grad_bytes * payload_ratio / count] * count
    period = max(cycle_s, cycle_cost_s)
    runs = [_horovod_cycles(ready, sizes, fit_, op, n, cycle_s, cycle_cost_s, fusion,
                            period * (i + 0.5) / max(1, phases)) for i in range(max(1, phases))]
    ends = [r[0] for r in runs]
    ops = round(statistics.fmean(r[1] for r in runs))
    return {"exposed_s": statistics.fmean(max(0.0, e - backward_s) for e in ends), "collectives": ops,
            "collective_s": statistics.fmean(r[2] for r in runs), "end_s": statistics.fmean(ends),
            "buckets": ops, "cycles": statistics.fmean(r[3] for r in runs)}


def fit_bucket_cost(exposed_s: float, grad_bytes: float, payload_ratio: float, backward_s: float, fit_: Fit,
                    op: str, n: int, tensor_bytes: list[float] | None = None) -> float:
    """DDP's bucket cost (seconds) with which ddp_schedule's exposed time is a measured one,
    `exposed_s` (0 where the collectives alone already expose as much)."""
    return _solve(exposed_s, lambda c: ddp_schedule(grad_bytes, payload_ratio, backward_s, fit_, op, n,
                                                     tensor_bytes=tensor_bytes, bucket_cost_s=c)["exposed_s"])


def _solve(exposed_s: float, exposed) -> float:
    """The cost c >= 0 with exposed(c) == exposed_s, exposed growing with c (bisection; 0
    where exposed(0) is already as much)."""
    if exposed_s <= exposed(0.0):
        return 0.0
    lo, hi = 0.0, max(exposed_s, 1e-6)
    while exposed(hi) < exposed_s and hi < 1e6:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if exposed(mid) < exposed_s else (lo, mid)
    return (lo + hi) / 2


def fit_cycle_cost(exposed_s: float, grad_bytes: float, payload_ratio: float, backward_s: float, fit_: Fit,
                   op: str, n: int, tensors: int, cycle_s: float = HOROVOD_CYCLE_S,
                   fusion: float = HOROVOD_FUSION, tensor_bytes: list[float] | None = None) -> float:
    """The cycle cost (seconds) with which horovod_schedule's exposed time is a measured
    one, `exposed_s` (bisection; 0 where the collectives alone already expose as much)."""
    return _solve(exposed_s, lambda c: horovod_schedule(grad_bytes, payload_ratio, backward_s, fit_, op, n,
                                                         tensors, cycle_s, fusion, c,
                                                         tensor_bytes=tensor_bytes)["exposed_s"])


@dataclass
class Inputs:
    """What one configuration's prediction needs: measured (compute, parts, ceilings,
    waiting) and set (framework, gradients, payload, op, world, the settings)."""
    framework: str
    np: int
    compute_s: float                # the 1-worker step
    backward_s: float | None        # its backward (None: BACKWARD_SHARE of compute)
    grad_bytes: float               # float32 gradient bytes (4 per value)
    payload_bytes: float            # what one rank hands to the collective per step
    op: str                         # allreduce, or allgather for the 8-bit codecs
    slowdown: float | None = None   # measured: compute at N / compute at 1
    waiting_s: float | None = None  # measured: the ranks' mean wait for the slowest
    waiting_from: str | None = None  # whose (predict_target: the 1-worker run's step spread)
    tensors: int = DEFAULT_TENSORS
    cycle_s: float = HOROVOD_CYCLE_S
    fusion_bytes: float = HOROVOD_FUSION
    slowdown_from: str | None = None  # "step parts" or "ceiling" where slowdown was measured
    cycle_cost_s: float = 0.0       # Horovod: a cycle's cost beyond its collectives, fitted;
    # DDP: what a bucket's collective exposes in the step beyond its fitted cost, fitted
    cycle_cost_from: str | None = None  # "others", "itself" where cycle_cost_s was fitted
    contention: float = 1.0         # the compute's slowdown beyond the ceiling's, fitted on others
    contention_from: str | None = None  # which others (not set by predict_target)
    tensor_bytes: list[float] | None = None  # each parameter's fp32 bytes, in the model's order


def _backward_and_ratio(x: Inputs) -> tuple[float, float, float]:
    """(slowdown, the backward at N workers, payload bytes per gradient byte)."""
    slow = (x.slowdown if x.slowdown else 1.0) * (x.contention or 1.0)
    backward1 = x.backward_s if x.backward_s is not None else BACKWARD_SHARE * x.compute_s
    return slow, backward1 * slow, (x.payload_bytes / x.grad_bytes if x.grad_bytes else 1.0)


def cycle_cost(x: Inputs, fit_: Fit, exposed_s: float) -> float | None:
    """The cost with which `x`'s predicted exposed communication is a measured one,
    `exposed_s`: Horovod's per cycle (fit_cycle_cost), DDP's per bucket (fit_bucket_cost);
    None for one worker."""
    if x.np < 2 or x.grad_bytes <= 0 or fit_ is None:
        return None
    _, backward, ratio = _backward_and_ratio(x)
    if x.framework != "horovod":
        return fit_bucket_cost(exposed_s, x.grad_bytes, ratio, backward, fit_, x.op, x.np, x.tensor_bytes)
    return fit_cycle_cost(exposed_s, x.grad_bytes, ratio, backward, fit_, x.op, x.np, x.tensors,
                          x.cycle_s, x.fusion_bytes, x.tensor_bytes)


def predict(x: Inputs, fit_: Fit) -> dict:
    """The predicted step (seconds) and every term it is made of, with the assumptions
    this prediction relied on (keys of lab.report.cost_assumptions.ASSUMPTIONS)."""
    used = ["algorithm", "serial", "codec"]
    slow, backward, ratio = _backward_and_ratio(x)
    if x.np > 1:
        used.append("slowdown_parts" if x.slowdown and x.slowdown_from == "step parts" else
                    "slowdown" if not x.slowdown else "slowdown_ceiling")
        if x.slowdown and x.slowdown_from == "ceiling":
            used.append("contention" if x.contention_from else "contention_none")
    if x.backward_s is None:
        used.append("backward")
    compute = x.compute_s * slow
    if x.np < 2 or x.grad_bytes <= 0:
        sched = {"exposed_s": 0.0, "collectives": 0, "collective_s": 0.0, "buckets": 0, "end_s": 0.0}
    elif x.framework == "horovod":
        sched = horovod_schedule(x.grad_bytes, ratio, backward, fit_, x.op, x.np, x.tensors,
                                 x.cycle_s, x.fusion_bytes, x.cycle_cost_s, tensor_bytes=x.tensor_bytes)
        used += ["ready", "cycle_wait",
                 {"others": "cycle", "itself": "cycle_self"}.get(x.cycle_cost_from, "cycle_none")]
    else:
        sched = ddp_schedule(x.grad_bytes, ratio, backward, fit_, x.op, x.np, tensor_bytes=x.tensor_bytes,
                             bucket_cost_s=x.cycle_cost_s)
        used += ["ready", "bucket" if x.cycle_cost_from == "others" else "bucket_none"]
    waiting = (x.waiting_s or 0.0) if x.np > 1 else 0.0
    if x.np > 1:
        used.append("waiting")
    if fit_ is not None and fit_.sizes < 2 and x.np > 1:
        used.append("fit")
    if fit_ is not None and fit_.burst_bytes and x.np > 1:
        used.append("burst")
    # the step's whole payload in one collective, at the fit's cost (not the probe's timing)
    alone = fit_.time(x.op, x.payload_bytes * (x.np if x.op == "allgather" else 1), x.np) if x.np > 1 else 0.0
    step = compute + sched["exposed_s"] + waiting
    return {"step_s": step, "compute_s": compute, "compute_one_s": x.compute_s, "slowdown": slow,
            "backward_s": backward, "exposed_s": sched["exposed_s"], "waiting_s": waiting,
            "collective_fitted_s": alone, "buckets": sched["buckets"],
            "collectives_s": sched["collective_s"], "speedup": x.np * x.compute_s / step if step else None,
            "slowdown_from": x.slowdown_from if x.slowdown else None, "contention": x.contention or 1.0,
            "contention_from": x.contention_from, "waiting_from": x.waiting_from if x.np > 1 else None,
            "cycle_cost_s": x.cycle_cost_s if x.framework == "horovod" else 0.0,
            "bucket_cost_s": x.cycle_cost_s if x.framework != "horovod" else 0.0,
            "cycles": sched.get("cycles", 0), "assumptions": used}


# A configuration not run, predicted from what one worker and doctor's sweeps measured


@dataclass
class OneWorker:
    """What a prediction of any target takes from the machine a user has: the 1-worker run
    (its step, its backward, its step times, its gradients and settings), the compute
    ceiling of one process (figures.ceiling; None where not measured) and the cores and
    threads that run had. Nothing here comes from a run of more than one worker."""
    framework: str                  # ddp or horovod
    backend: str | None             # gloo, mpi, nccl
    compute_s: float                # the 1-worker step
    backward_s: float | None        # its backward (None: BACKWARD_SHARE of compute)
    grad_bytes: float               # float32 gradient bytes (4 per value)
    payload_bytes: float            # what one rank hands to the collective per step
    op: str = "allreduce"           # allreduce, or allgather for the 8-bit codecs
    batch: int = 1                  # images per worker per step
    threads: int = 1                # CPU threads per rank (config.threads)
    cores: int | None = None        # the cores the 1-worker run's server had (world.cores)
    step_times_s: list[float] | None = None  # its steps, one by one (the ranks' spread)
    ceiling_img_s: float | None = None  # the compute ceiling of one process
    tensors: int = DEFAULT_TENSORS
    tensor_bytes: list[float] | None = None
    cycle_s: float = HOROVOD_CYCLE_S
    fusion_bytes: float = HOROVOD_FUSION
    strategy: str = "ddp"


@dataclass
class Target:
    """A configuration to predict: `workers` ranks, `per_server` of them a server (None: all
    on one), the link between servers (`link_gbit` Gbit/s, `latency_s` one way, its token
    bucket `burst_bytes`; None: the fit's own), the all-reduce's algorithm (a key of
    lab.report.algorithms.ALGORITHMS; None: the back end's choice) and the cores of a
    server (None: as many as the 1-worker run's)."""
    workers: int
    per_server: int | None = None
    link_gbit: float | None = None
    latency_s: float = 0.0
    algorithm: str | None = None
    cores: int | None = None
    burst_bytes: float = 0.0

    @property
    def servers(self) -> int:
        return -(-self.workers // self.per_server) if self.per_server else 1

    @property
    def on_server(self) -> int:
        """The ranks sharing the busiest server."""
        return min(self.workers, self.per_server or self.workers)


def shared_slowdown(ranks: int, threads: int, cores: int | None, cores_one: int | None = None) -> float:
    """How much slower each of `ranks` ranks of `threads` threads computes on `cores` cores
    than one rank did on `cores_one` (None: the same cores): the cores are shared in equal
    turns, so a rank gets min(1, cores / (ranks x threads)) of its threads' time
    (oversubscription included); None cores: not shared (1)."""
    if not cores:
        return 1.0
    alone = max(1.0, threads / (cores_one or cores))
    return max(1.0, ranks * threads / cores) / alone


def straggler_wait(step_times_s: list[float] | None, n: int) -> float:
    """The ranks' mean wait for the slowest of n (seconds), each rank's step drawn from the
    1-worker run's steps: E[max of n draws] - their mean, over the empirical distribution
    (sorted x_1..x_m: x_i is the maximum with probability (i/m)^n - ((i-1)/m)^n); 0
    without steps or below 2 ranks."""
    xs = sorted(step_times_s or [])
    if n < 2 or len(xs) < 2:
        return 0.0
    m = len(xs)
    top = sum(x * (((i + 1) / m) ** n - (i / m) ** n) for i, x in enumerate(xs))
    return max(0.0, top - statistics.fmean(xs))


def horovod_agreement_s(fit_: Fit, n: int) -> float:
    """What a Horovod cycle costs beyond its collectives: its agreement on the ready tensors,
    one small all-reduce of the response cache's bits every cycle (horovod 0.28.1
    controller.cc 154-159, response_cache.cc 428), at the fit's cost of an 8-byte
    message (in practice the latency term)."""
    return fit_.time("allreduce", 8.0, n)


def target_fit(fit_: Fit, target: Target) -> Fit:
    """The fit carried to the target: across servers on the target's link (Fit.on_link; the
    fit's own where the target names no rate), its algorithm where it names one."""
    f = fit_
    if target.servers > 1 and target.link_gbit:
        f = f.on_link(target.link_gbit / 8, target.latency_s, target.burst_bytes)
    if target.algorithm and target.algorithm != "auto":
        f = Fit(**{**f.__dict__, "algorithm": target.algorithm})
    return f


def predict_target(one: OneWorker, fit_: Fit | None, target: Target) -> dict:
    """The step of `target`, predicted from one worker (`one`) and a fit of the back end's
    collective (from doctor's sweeps, lab.report.model_inputs.sweep_fit): compute = the
    1-worker step x shared_slowdown of the ranks on a server; the exposed communication of
    the bucket schedule (ddp_schedule; Horovod's cycles, horovod_schedule, each costing its
    agreement beyond its collectives: horovod_agreement_s) on target_fit; waiting =
    straggler_wait x the slowdown. Returns predict()'s terms with "throughput_img_s",
    "efficiency", "ceiling_img_s" (the N-process ceiling this predicts, for a measured one
    to check) and "why" (None, or why the target is not predicted)."""
    n = target.workers
    if one.strategy not in ("ddp", None):
        return {"why": not_predicted(one.strategy)}
    if n > 1 and fit_ is None and one.grad_bytes > 0:
        return {"why": "no collective sweep of its back end (`invoke doctor --save RESULTS` measures one)"}
    slow = shared_slowdown(target.on_server, one.threads, target.cores or one.cores, one.cores)
    f = target_fit(fit_, target) if fit_ is not None else None
    x = Inputs(framework=one.framework, np=n, compute_s=one.compute_s, backward_s=one.backward_s,
               grad_bytes=one.grad_bytes, payload_bytes=one.payload_bytes, op=one.op, slowdown=slow,
               slowdown_from="cores", waiting_s=straggler_wait(one.step_times_s, n) * slow,
               waiting_from="the 1-worker run's step spread", tensors=one.tensors, cycle_s=one.cycle_s,
               fusion_bytes=one.fusion_bytes, tensor_bytes=one.tensor_bytes,
               cycle_cost_s=horovod_agreement_s(f, n) if one.framework == "horovod" and f and n > 1 else 0.0,
               cycle_cost_from="agreement" if one.framework == "horovod" else None)
    p = predict(x, f)
    p["assumptions"] = [a for a in p["assumptions"] if a not in ("slowdown", "slowdown_ceiling", "contention",
                                                                    "contention_none", "cycle", "cycle_none",
                                                                    "bucket_none", "waiting")]
    p["assumptions"] += ["cores", "straggler", "sweeps"] + (["agreement"] if one.framework == "horovod" else []) + (
        ["link"] if target.servers > 1 else [])
    step = p["step_s"]
    p.update({"why": None, "inputs": x, "fit": f, "workers": n, "servers": target.servers,
              "throughput_img_s": n * one.batch / step if step else None,
              "efficiency": p["speedup"] / n if p["speedup"] else None,
              "ceiling_img_s": one.ceiling_img_s * n / slow if one.ceiling_img_s else None})
    return p


NOT_PREDICTED = {
    "zero1": "ZeRO-1 adds an all-gather of the updated parameter shards after each step, and the "
             "kit's records hold no timing of it apart",
    "fsdp": "FSDP gathers each unit's parameters in the forward and the backward and reduce-scatters "
            "its gradients; the records hold neither the units nor when each is gathered",
    "deepspeed": "DeepSpeed's ZeRO stages bucket and overlap their collectives by their own settings, "
                 "which the model does not follow",
    "pipeline": "a pipeline's step is its stages' schedule and bubble, not an all-reduce",
    "model-parallel": "model parallelism sends activations between stages, not gradients",
    "rpc-pipeline": "an RPC pipeline sends activations between stages, not gradients",
    "dataparallel": "DataParallel is one process: nothing to scale across workers",
}


def not_predicted(strategy: str) -> str:
    """Why a strategy other than plain data parallelism is not predicted, in one sentence
    (never as DDP with no communication)."""
    return ("not predicted: " + NOT_PREDICTED.get(strategy, f"the model covers plain data parallelism, "
                                                           f"not {strategy}"))
