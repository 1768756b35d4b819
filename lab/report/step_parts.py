"""Each configuration's step, part by part (figures.step_parts, measured on every rank by
lab.worker.step_parts): one row per configuration and process count, each part the mean
over the ranks of the rank's typical step, the median over repeats; the parts' sum beside
the same steps as the training loop timed them, flagged where they differ by more than
the record's tolerance. And the
split of what a step lost against one worker: the exposed communication, the waiting
for the slowest rank, the compute that grew (cores shared by more ranks), the rest."""
from __future__ import annotations

import statistics

from lab.report import records as rec
from lab.report import summary

# The parts shown, in a step's order (data loading is before the timed step).
SHOWN = (("data", "data"), ("forward", "forward"), ("backward", "backward"),
         ("communication", "exposed comm."), ("waiting", "waiting"),
         ("optimizer", "optimizer"), ("other", "other"))
COMPUTE = ("other", "forward", "backward", "optimizer")
HEADERS = ["configuration", "np", "servers", *(label for _, label in SHOWN), "sum", "step",
           "adds up"]
# "measured step": the same typical steps as the training loop timed them (its own clock).


def of_record(r: dict) -> dict | None:
    """A record's parts in seconds: the mean over its ranks of each rank's median; None
    where it measured none."""
    sp = (r.get("figures") or {}).get("step_parts") or {}
    ranks = [x for x in sp.get("ranks") or [] if x.get("parts_s")]
    if not ranks:
        return None
    out = {p: statistics.fmean(x["parts_s"][p] for x in ranks) for p, _ in SHOWN}
    steps = [x.get("step_s") or x.get("step_p50_s") for x in ranks]
    if None in steps:
        return None
    out["step"] = statistics.fmean(steps)
    return out


def of_row(row: dict) -> dict | None:
    """A summary row's parts (seconds): the median over its repeats, with the median of
    their median steps and the tolerance the records were checked with."""
    pairs = [(r, parts) for r in row.get("records", []) if (parts := of_record(r))]
    if not pairs:
        return None
    recs, each = [r for r, _ in pairs], [p for _, p in pairs]
    out = {p: statistics.median(e[p] for e in each) for p, _ in SHOWN}
    out["step"] = statistics.median(e["step"] for e in each)
    out["sum"] = sum(out[p] for p, _ in SHOWN if p != "data")
    tol = recs[0]["figures"]["step_parts"].get("sum_tolerance", 0.1)
    out["adds_up"] = abs(out["sum"] - out["step"]) <= tol * out["step"]
    out["tolerance"] = tol
    return out


def notes(records: list[dict]) -> list[str]:
    """What each strategy's parts cannot separate, once per strategy."""
    said = {}
    for r in records:
        note = ((r.get("figures") or {}).get("step_parts") or {}).get("note")
        if note:
            said.setdefault(summary.strategy_name(r.get("config", {})), note)
    return [f"{name}: {note}." for name, note in said.items()]


def table(records: list[dict]) -> list[list]:
    out = []
    for row in summary.rows(records):
        parts = of_row(row) if row.get("runs") else None
        if parts is None:
            continue
        out.append([rec.config_label(row["record"], records, " / ") + rec.link_label(row["record"]),
                    row["np"], row["servers"],
                    *(f"{parts[p] * 1000:.2f}" for p, _ in SHOWN),
                    f"{parts['sum'] * 1000:.2f}", f"{parts['step'] * 1000:.2f}",
                    "yes" if parts["adds_up"] else
                    f"no: {abs(parts['sum'] / parts['step'] - 1):.0%} apart"])
    return out


def gap(parts: dict, one: dict) -> dict[str, float]:
    """What the step at N workers lost against one worker, part by part (seconds): the
    exposed communication, the waiting, the compute that grew, and the rest."""
    lost = parts["step"] - one["step"]
    comm, wait = parts["communication"], parts["waiting"]
    grew = sum(parts[p] for p in COMPUTE) - sum(one[p] for p in COMPUTE)
    return {"lost": lost, "communication": comm, "waiting": wait, "compute": grew,
            "unexplained": lost - comm - wait - grew}
