"""`python -m lab.report.model_check [RESULTS_DIR ...]`: the cost model (lab.report.cost_model)
held against measurements: predicted and measured step and the error, one line per case.

Without arguments, the cases docs/pages/report.md publishes ("Why it scales as it does"):
their records are not kept, so each case's inputs are read back from the published figures
(the 1-worker step from the speedups and the step lost, the collective from its time alone
or from the published bounds' ratio, waiting and the compute that grew, the slowdown, from
their published shares of the lost step), and what they do not give is the model's stated
default (backward two thirds of the step, no slowdown where no share was published, the
latency 0 with one size timed). Horovod's cycle cost is fitted to the one published exposed
time (Horovod MNIST across servers, marked as fitted on itself) and carried to the Horovod
ResNet-50 case on the same link. With RESULTS_DIR: every predicted multi-worker row of the
records there (lab.report.prediction), a row whose cycle cost came from its own exposed
time marked the same way, and the rows it could not predict with why; then each row's
explained figure (its own compute parts and wait: not a prediction). With --leave-out
KEY=VALUE,...: the configurations those pick predicted from the other records and doctor's
sweeps alone (lab.report.prediction.predictions' leave_out), "not run yet" where none ran."""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from lab.common import results
from lab.report import cost_model as cm
from lab.report import model_inputs, prediction, summary
from lab.report.records import case_name, config_label

MNIST_GRAD = 87_360          # the MNIST CNN's float32 gradient bytes (21,840 values)
SELF = " (cycle cost fitted on itself)"    # marks a case whose exposed time was an input


def _case(name, framework, t1, t2, coll_s, coll_bytes, grad, waiting, tensors, grew=0.0,
          cycle_cost=0.0, unit=1.0, parts=False):
    """A published case: 2 workers, 1-worker step t1, 2-worker step t2 (in `unit` seconds:
    1e-3 for ms; any one unit where only ratios were published), the collective alone coll_s
    on coll_bytes, `grew` the compute the 2-worker step gained (published share of the lost
    step: the slowdown), `cycle_cost` Horovod's in seconds; `parts`: the inputs and the
    terms as well."""
    s = unit
    fit = cm.fit([{"op": "allreduce", "size_bytes": coll_bytes, "ranks": 2, "time_s": coll_s * s}])
    x = cm.Inputs(framework=framework, np=2, compute_s=t1 * s, backward_s=None, grad_bytes=grad,
                  payload_bytes=grad, op="allreduce", waiting_s=waiting * s, tensors=tensors,
                  slowdown=1 + grew / t1 if grew else None, slowdown_from="step parts" if grew else None,
                  cycle_cost_s=cycle_cost,
                  cycle_cost_from=("itself" if SELF in name else "others") if cycle_cost else None)
    p = cm.predict(x, fit)
    return (name, p["step_s"] / s, t2, x, p) if parts else (name, p["step_s"] / s, t2)


def _horovod_mnist_across() -> tuple[float, float, float]:
    """The Horovod MNIST case across servers in ms: (1-worker step, 2-worker step, Horovod's
    cycle cost in seconds fitted to its published 34 ms of exposed communication)."""
    t1 = 5.6 / (2 / 1.49 - 1)
    fit = cm.fit([{"op": "allreduce", "size_bytes": MNIST_GRAD, "ranks": 2, "time_s": 5.6e-3}])
    x = cm.Inputs(framework="horovod", np=2, compute_s=t1 / 1000, backward_s=None, grad_bytes=MNIST_GRAD,
                  payload_bytes=MNIST_GRAD, op="allreduce", tensors=cm.MODEL_TENSORS["mnist"])
    return t1, 2 * t1 / 0.70, cm.cycle_cost(x, fit, 34e-3)


def published() -> list[tuple[str, float, float]]:
    """(case, predicted step, measured step) for the six published cases; a case whose own
    exposed communication fitted the cycle cost is marked SELF."""
    out = []
    # DDP MNIST, one machine: lost 11.7 ms, speedup 1.16, all-reduce of 0.087 MB in 0.9 ms,
    # 19% of the lost step waiting, 39% compute that grew.
    t1 = 11.7 / (2 / 1.16 - 1)
    out.append(_case("DDP MNIST, 1 machine, 2 workers (ms)", "ddp", t1, t1 + 11.7, 0.9, MNIST_GRAD,
                     MNIST_GRAD, 0.19 * 11.7, cm.MODEL_TENSORS["mnist"], 0.39 * 11.7, unit=1e-3))
    # DDP ResNet-50 batch 32, one machine: lost 12.0 s, speedup 1.42, 102 MB in 0.13 s, 5%
    # waiting, 95% compute that grew.
    t1 = 12.0 / (2 / 1.42 - 1)
    out.append(_case("DDP ResNet-50, 1 machine, 2 workers (s)", "ddp", t1, t1 + 12.0, 0.13, 102e6, 102e6,
                     0.05 * 12.0, cm.MODEL_TENSORS["resnet50"], 0.95 * 12.0))
    # DDP MNIST, 2 servers at 1 Gbit/s: bounds 1.66-2.00 (collective / compute = 2/1.66 - 1),
    # measured 0.96, 16% of the lost step waiting, 52% compute; the compute is the unit.
    lost = 2 / 0.96 - 1
    out.append(_case("DDP MNIST, 2 servers, 1 Gbit/s (1-worker step = 1)", "ddp", 1.0, 2 / 0.96, 2 / 1.66 - 1, MNIST_GRAD,
                     MNIST_GRAD, 0.16 * lost, cm.MODEL_TENSORS["mnist"], 0.52 * lost))
    # Horovod MNIST, 2 servers at 1 Gbit/s: bounds 1.49-2.00, collective 5.6 ms, measured
    # 0.70, 34 ms exposed communication; waiting and compute not published (0). Its exposed
    # time is what fits Horovod's cycle cost, so this case checks only the rest.
    t1, t2, cycle = _horovod_mnist_across()
    out.append(_case("Horovod MNIST, 2 servers, 1 Gbit/s (ms)" + SELF, "horovod", t1, t2, 5.6, MNIST_GRAD,
                     MNIST_GRAD, 0.0, cm.MODEL_TENSORS["mnist"], cycle_cost=cycle, unit=1e-3))
    # DDP ResNet-50, 2 servers at 1 Gbit/s: 94 MB at 0.119 GB/s bus bandwidth, bounds
    # 0.65-0.96 (compute = 0.96 / 2 of the collective), measured 0.76; waiting not published.
    c = 94e6 / 0.119e9
    t1 = 0.96 / 2 * c
    out.append(_case("DDP ResNet-50, 2 servers, 1 Gbit/s (s)", "ddp", t1, 2 * t1 / 0.76, c, 94e6, 94e6, 0.0,
                     cm.MODEL_TENSORS["resnet50"]))
    # Horovod ResNet-50, same link: bounds 0.55-0.77 (compute = 0.77 / 2 of its collective,
    # the collective the unit: the same 94 MB on the same link as DDP's, c seconds), measured
    # 0.57; the cycle cost is the one the Horovod MNIST case fitted (another size).
    t1 = 0.77 / 2
    out.append(_case("Horovod ResNet-50, 2 servers, 1 Gbit/s (collective = 1)", "horovod", t1, 2 * t1 / 0.57, 1.0, 94e6,
                     94e6, 0.0, cm.MODEL_TENSORS["resnet50"], cycle_cost=cycle, unit=c))
    return out


def _records(paths: list[str]) -> list[dict]:
    return [r for path in paths for f in sorted(Path(path).rglob(results.RESULTS_FILE))
            for r in results.read_records(f)[0]]


def _name(p: dict, recs: list[dict]) -> str:
    return case_name(p["row"], recs)


def of_results(*paths: str, leave_out=None) -> tuple[list[tuple[str, float, float]], list[str], list[tuple]]:
    """(predicted rows, why the others were not, the rows' explained figures) of the records
    under `paths` and doctor's sweeps stored there (lab.report.model_inputs.load_sweeps);
    `leave_out`: prediction.predictions'."""
    recs, sweeps = _records(list(paths)), model_inputs.load_sweeps(*paths)
    preds = prediction.predictions(recs, sweeps, leave_out)
    rows = [(_name(p, recs), p["predicted_ms"],
             None if p["row"]["record"].get("planned") else p["step_ms"]) for p in preds]
    left = prediction.unpredicted(recs, sweeps, leave_out)
    why = [f"{config_label(u['row']['record'], recs, ' / ')} at {u['row']['np']} workers: {u['why']}" for u in left]
    explained = [(_name(u, recs), u["explained"]["step_ms"], u["row"]["time per step (ms)"])
                 for u in preds + left if u["explained"] and not u["row"]["record"].get("planned")]
    return rows, why, explained


def leave_out_test(spec: str):
    """'np=2,nodes=2,link=100mbit[,framework=ddp,...]' -> a test on a record: its world's
    np and nodes, its configuration's other fields (ValueError: one sentence)."""
    want = {}
    for item in filter(None, spec.split(",")):
        k, eq, v = item.partition("=")
        if not eq or not k.strip():
            raise ValueError(f"--leave-out takes KEY=VALUE pairs (np=2,nodes=2,link=100mbit), not {item!r}")
        want[k.strip()] = v.strip()
        if k.strip() in ("np", "nodes") and not v.strip().isdigit():
            raise ValueError(f"--leave-out's {k.strip()} is a whole number, not {v.strip()!r}")
    if not want:
        raise ValueError("--leave-out names no configuration: give np=2,nodes=2,link=100mbit or the like")

    def value(record, k):
        v = record["world"].get(k) if k in ("np", "nodes") else record.get("config", {}).get(k)
        return "" if v is None else str(v)
    return lambda r: all(value(r, k) == v for k, v in want.items())


def planned(recs: list[dict], spec: str) -> list[dict]:
    """Where no record matches `spec`: the configuration not run yet, one per configuration
    of the records' multi-worker runs that matches the rest of it, as a record marked
    planned (its figures are its template's and nothing of them is used: it is left out).
    Only the workers, servers and link are moved to the spec's; its other fields (model,
    framework, ...) pick the runs to start from, as a model's data and batch go with it."""
    test = leave_out_test(spec)
    if any(test(r) for r in recs):
        return []
    want = {k.strip(): v.strip() for k, _, v in (item.partition("=") for item in spec.split(",") if item)}
    out, seen = [], set()
    for r in recs:
        if r.get("status") != "ok" or r["world"]["np"] < 2 or (
                "nodes" in want and (r["world"]["nodes"] > 1) != (int(want["nodes"]) > 1)):
            continue            # across servers from runs across servers, within from within
        world = {**r["world"], **{k: int(want[k]) for k in ("np", "nodes") if k in want}}
        config = {**r["config"], **({"link": want["link"]} if "link" in want else {})}
        new = {**r, "world": world, "config": config, "planned": True}
        key = (tuple(sorted(map(str, config.items()))), world["np"], world["nodes"])
        if test(new) and key not in seen:
            seen.add(key)
            out.append(new)
    return out


FAR = 0.25        # an error beyond this is counted apart, with where it falls among its own runs


def run_steps(records: list[dict]) -> dict[str, list[float]]:
    """Each multi-worker configuration's name (as the tables name it) -> its ok runs' steps
    in ms (figures.step_time_mean_s), fastest first: what its measured step, their median,
    was taken from. A configuration not run yet (planned: its figures are its template's)
    has none."""
    out = {}
    for row in summary.rows([r for r in records if not r.get("planned")]):
        if row.get("runs") and row.get("np", 1) >= 2:
            out[_name({"row": row}, records)] = sorted(1e3 * r["figures"]["step_time_mean_s"]
                                                       for r in row["records"])
    return out


def _span(steps: list[float] | None) -> str:
    return f"{steps[0]:.4g}-{steps[-1]:.4g}" if steps and len(steps) > 1 else ""


def lines(cases: list[tuple[str, float, float | None]], what: str = "predicted",
          runs: dict[str, list[float]] | None = None) -> list[str]:
    """The cases' table ("predicted" or "explained" step against the measured one), then
    the errors' median and largest. With `runs` (run_steps): a column with the span of each
    case's own runs, and a count of the cases off by more than FAR and of those among them
    whose prediction lies within that span (the measurement's own spread there is wider
    than the error)."""
    spans = runs is not None
    out = [f"| case | {what} step | measured step |" + (" its runs |" if spans else "") + " error |",
           "| --- | --- | --- |" + (" --- |" if spans else "") + " --- |"]
    errors, far, inside = [], 0, 0
    for name, pred, meas in cases:
        steps = (runs or {}).get(name.removesuffix(SELF))
        span = f" {_span(steps)} |" if spans else ""
        if meas is None:
            out.append(f"| {name} | {pred:.4g} | not run yet |{span} |")
            continue
        errors.append(pred / meas - 1)
        out.append(f"| {name} | {pred:.4g} | {meas:.4g} |{span} {100 * errors[-1]:+.0f}% |")
        if abs(errors[-1]) > FAR:
            far += 1
            inside += bool(steps and len(steps) > 1 and steps[0] <= pred <= steps[-1])
    if errors:
        out.append("\n" + summary_line(errors))
        if spans:
            out.append(f"off by more than {100 * FAR:.0f}%: {far} case(s), {inside} of them predicted within "
                       f"the span of their own runs (the fastest to the slowest)")
    apart = [pred / meas - 1 for name, pred, meas in cases if SELF not in name and meas is not None]
    if len(apart) < len(errors):
        out.append(f"without the cases fitted on themselves: {summary_line(apart)}")
    return out


def repeat_spread(records: list[dict]) -> list[float]:
    """The measurement's own floor: for every multi-worker configuration with two or more
    ok runs, each run's step (figures.step_time_mean_s) against the median of the others'
    (a run predicting its own configuration's other runs); empty without repeats."""
    out = []
    for row in summary.rows(records):
        if not row.get("runs") or row.get("np", 1) < 2:
            continue
        steps = [r["figures"]["step_time_mean_s"] for r in row["records"]]
        out += [s / m - 1 for i, s in enumerate(steps)
                if len(steps) > 1 and (m := statistics.median(steps[:i] + steps[i + 1:])) > 0]
    return out


def summary_line(errors: list[float], what: str = "error") -> str:
    if not errors:
        return "no case"
    return (f"median absolute {what} {100 * statistics.median(abs(e) for e in errors):.0f}%, "
            f"largest {100 * max(abs(e) for e in errors):.0f}% ({len(errors)} cases)")


def main(argv: list[str]) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m lab.report.model_check", description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="*", help="results folders (each with its run folders)")
    p.add_argument("--leave-out", default="", metavar="KEY=VALUE,...",
                   help="predict the configuration these pick (np, nodes, link, framework, backend, model, ...) "
                        "from the other records and doctor's sweeps alone; not run yet: each matching "
                        "configuration of the records at those settings")
    a = p.parse_args(argv)
    if not a.folders:
        if a.leave_out:
            p.error("--leave-out needs the results folders to predict from")
        print("The published cases (docs/pages/report.md; steps in the unit each case names), explained "
              "by their own published parts (waiting, the compute that grew), not predicted:")
        print("\n".join(lines(published(), "explained")))
        return 0
    missing = [f for f in a.folders if not Path(f).is_dir()]
    if missing:
        print(f"error: {', '.join(missing)}: no such folder (give results folders)", file=sys.stderr)
        return 2
    if a.leave_out:
        try:
            test = leave_out_test(a.leave_out)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return _leave_out(a.folders, a.leave_out, test)
    for path in a.folders:
        rows, why, explained = of_results(path)
        print(f"\n{path}:")
        if not rows and not why:
            print(f"no multi-worker row in the records under {path}")
            continue
        print("\n".join(lines(rows, runs=run_steps(_records([path])))) if rows else "no multi-worker row predicted")
        print("\n".join(f"- not predicted: {w}" for w in why))
        if explained:
            print("\nExplained by each row's own measurements (its compute parts and wait: not predictions):")
            print("\n".join(lines(explained, "explained")))
    return 0


def _leave_out(folders: list[str], spec: str, test) -> int:
    """Predict the left-out configuration from the others (planned where not run yet)."""
    recs = _records(folders)
    recs += planned(recs, spec)
    sweeps = model_inputs.load_sweeps(*folders)
    preds = prediction.predictions(recs, sweeps, test)
    rows = [(_name(p, recs), p["predicted_ms"], None if p["row"]["record"].get("planned") else p["step_ms"])
            for p in preds]
    print(f"Left out: {spec}; predicted from the other records of {', '.join(folders)} and "
          f"{len(sweeps)} doctor sweep(s) alone (steps in ms):")
    print("\n".join(lines(rows, runs=run_steps(recs))) if rows else "nothing predicted")
    for u in prediction.unpredicted(recs, sweeps, test):
        print(f"- not predicted: {_name(u, recs)}: {u['why']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
