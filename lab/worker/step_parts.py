"""Each training step split into its parts, measured on every rank: data loading,
forward, backward compute, the communication the step waits for beyond the compute it
overlaps (exposed), the optimizer, and the time a rank waits for the slowest one.

The parts come from consecutive marks on one clock, so one step's parts add up to
that step as the training loop timed it (its own clock: host time around the step and
its synchronisation, where the marks are CUDA events on a GPU); the record keeps each
part's mean over the rank's typical steps (the middle half by duration) and checks
their sum against those steps' measured mean:
- `forward`, `backward`, `optimizer`: the strategy's step (Strategy.step) marks them;
- the end of the backward's compute: the moment the last gradient of the step is
  accumulated (Tensor.register_post_accumulate_grad_hook, torch >= 2.1), on the
  parameter found last in the first step (the order is the autograd graph's, the same
  every step); DDP's all-reduce of its buckets runs behind the compute and the step
  waits for what is left at the end of loss.backward() (torch/csrc/distributed/c10d/
  reducer.cpp, Reducer::finalize_backward), so that remainder is the exposed part;
- Horovod: the strategy calls the optimizer's synchronize() itself, then steps under
  skip_synchronize() (horovod/torch/optimizer.py 0.28.1, the pattern its
  skip_synchronize docstring gives): the backward enqueues the all-reduces, synchronize
  waits for them (exposed), the step is the optimizer alone.
- waiting for the slowest rank: a collective ends for every rank when the last one
  has joined it, so in each step the rank with the least exposed communication is the
  one the others waited for; its exposed time is the step's communication, the rest of
  each rank's is waiting (`split_waiting`).

On a GPU the marks are CUDA events on the current stream (elapsed times read once the
step has synchronised), not host clocks: untested here (no GPU)."""
from __future__ import annotations

import os
import statistics
import time

# In the order of a step. "other" is the step's start before its forward (zero_grad).
PARTS = ("data", "other", "forward", "backward", "communication", "waiting", "optimizer")
# The record's check: the parts of a rank's typical steps add up to those steps, as the
# training loop timed them, within this share.
SUM_TOLERANCE = 0.10
# Off for the measurement of the marks' own cost (lab.benchmarks.step_parts_cost).
ENV = "LAB_STEP_PARTS"


class StepParts:
    """The marks of this rank's steps. `mark(where)` is called by the training loop
    ("data" before the batch is loaded, "step" before the strategy's step, "end" once
    the step has synchronised) and by the strategy's step ("forward", "backward",
    "communication", "optimizer"); `end(timed)` keeps the step's parts when timed."""

    def __init__(self, device, enabled: bool | None = None):
        self.cuda = getattr(device, "type", "cpu") == "cuda"
        self.enabled = os.environ.get(ENV, "on") != "off" if enabled is None else enabled
        self.rows: list[dict[str, float]] = []      # one per timed step: part -> seconds
        self._at: dict = {}
        self._hooks: list = []
        self._last_param = None

    def _now(self):
        if self.cuda:
            import torch
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def mark(self, where: str) -> None:
        if self.enabled:
            self._at[where] = self._now()

    def watch(self, params) -> None:
        """Hook every parameter for the first step, to learn which gradient comes last."""
        if not self.enabled:
            return
        for i, p in enumerate(params):
            if p.requires_grad and hasattr(p, "register_post_accumulate_grad_hook"):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._first_step_hook(i)))

    def _first_step_hook(self, i):
        def hook(_):
            self._at["computed"] = self._now()
            self._last_param = i
        return hook

    def _keep_only_the_last(self, params) -> None:
        """`params`: the parameters in watch()'s order (a callable that gives them)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._last_param is None:
            return
        p = list(params())[self._last_param]

        def hook(_):
            self._at["computed"] = self._now()
        self._hooks.append(p.register_post_accumulate_grad_hook(hook))
        self._last_param = None

    def end(self, timed: bool, params=None, step_s: float | None = None) -> None:
        """The step is over (and synchronised): keep its parts, and `step_s` (the step as
        the training loop timed it), when it is timed. `params`: a callable giving the
        parameters, asked only after the first step (to keep one hook)."""
        if not self.enabled:
            return
        at, self._at = self._at, {}
        if self._last_param is not None and params is not None:
            self._keep_only_the_last(params)
        if timed and {"data", "step", "forward", "backward", "optimizer", "end"} <= set(at):
            if self.cuda:
                # elapsed_time needs both events completed; "end" was recorded after the
                # step's synchronize, so wait for the GPU to reach it (CUDA's
                # cudaEventElapsedTime fails with cudaErrorNotReady otherwise)
                at["end"].synchronize()
            self.rows.append({**parts_of(at, self._seconds), "step": step_s})

    def _seconds(self, a, b) -> float:
        if self.cuda:
            return a.elapsed_time(b) / 1000.0
        return b - a


def joined(*marks):
    """One mark call for several listeners (the rank's heartbeat and its step's parts)."""
    def mark(where):
        for m in marks:
            m(where)
    return mark


def parts_of(at: dict, seconds) -> dict[str, float]:
    """One step's parts from its marks (`seconds(a, b)`: the time from mark a to b)."""
    if "communication" in at:                    # Horovod: synchronize() marked apart
        compute_end, comm_end = at["communication"], at["optimizer"]
    elif "computed" in at:                       # DDP: the last gradient's hook
        compute_end, comm_end = at["computed"], at["optimizer"]
    else:                                        # no gradient hook: nothing overlaps
        compute_end = comm_end = at["optimizer"]
    return {"data": seconds(at["data"], at["step"]),
            "other": seconds(at["step"], at["forward"]),
            "forward": seconds(at["forward"], at["backward"]),
            "backward": max(0.0, seconds(at["backward"], compute_end)),
            "communication": max(0.0, seconds(compute_end, comm_end)),
            "waiting": 0.0,
            "optimizer": seconds(at["optimizer"], at["end"])}


def split_waiting(exposed_by_rank: list[list[float]]) -> list[list[tuple[float, float]]]:
    """(communication, waiting) per rank and step: in each step the least exposed time
    among the ranks is the collective's own; the rest of a rank's is waiting for the
    slowest rank. Ranks with different step counts are cut to the shortest."""
    n = min((len(e) for e in exposed_by_rank), default=0)
    out = [[] for _ in exposed_by_rank]
    for k in range(n):
        least = min(e[k] for e in exposed_by_rank)
        for r, e in enumerate(exposed_by_rank):
            out[r].append((least, e[k] - least))
    return out


def central(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    """The steps whose duration (their parts but data loading) lies within the
    interquartile range of the rank's steps: the typical steps, without the few that
    another process's burst on the cores made long."""
    def total(r):
        return r["step"] if r.get("step") is not None else sum(r[p] for p in PARTS if p != "data")
    totals = sorted(total(r) for r in rows)
    if len(totals) < 4:
        return rows
    q1, q3 = totals[len(totals) // 4], totals[(3 * len(totals)) // 4]
    return [r for r in rows if q1 <= total(r) <= q3]


def summary(rows: list[dict[str, float]], split: list[tuple[float, float]] | None,
            step_times: list[float]) -> dict:
    """A rank's parts (its exposed time split into communication and waiting where
    `split` is given): the mean of each part over its typical steps (`central`), so that
    they add up as the steps' parts do; medians of parts would not (each part's median
    comes from another step). Their sum is checked against the same steps' time as the
    training loop measured it (`step_s`); `step_p50_s` is the median of all its steps."""
    if not rows:
        return {}
    rows = [dict(r) for r in rows]
    if split:
        for r, (comm, wait) in zip(rows, split):
            r["communication"], r["waiting"] = comm, wait
    typical = central(rows)
    parts = {p: statistics.fmean(r[p] for r in typical) for p in PARTS}
    # The step time the record reports excludes data loading (it starts at "step").
    total = sum(v for p, v in parts.items() if p != "data")
    measured = [r["step"] for r in typical if r.get("step") is not None]
    step = statistics.fmean(measured) if measured else None
    return {"parts_s": {p: round(v, 7) for p, v in parts.items()},
            "steps": len(typical),
            "sum_s": round(total, 7),
            "step_s": round(step, 7) if step else None,
            "step_p50_s": round(statistics.median(step_times), 7) if step_times else None,
            "sum_within_tolerance": bool(step) and abs(total - step) <= SUM_TOLERANCE * step}


def record(strategy, rows_by_rank: list[list[dict]], steps_by_rank: list[list[float]]) -> dict:
    """The record's figure: each rank's summary, the exposed communication split into
    the collective and waiting where the ranks share one collective per step (the data-
    parallel strategies), and what this strategy cannot separate."""
    out = {"note": strategy.parts_note, "sum_tolerance": SUM_TOLERANCE}
    if os.environ.get(ENV, "on") == "off":
        out["note"] = f"not measured ({ENV}=off)"
    if not any(rows_by_rank):
        out["ranks"] = []
        return out
    lockstep = strategy.replicated and len(rows_by_rank) > 1 and all(rows_by_rank)
    splits = (split_waiting([[r["communication"] for r in rows] for rows in rows_by_rank])
              if lockstep else [None] * len(rows_by_rank))
    out["ranks"] = [summary(rows, split, steps)
                    for rows, split, steps in zip(rows_by_rank, splits, steps_by_rank)]
    return out
