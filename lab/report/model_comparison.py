"""The models compared: where the records hold two models (ResNet-50 and VGG-16 in the
lab's cross-server part) run the same way (data, batch, framework, back end, compression,
strategy, precision, place, process count, servers and link), a sentence per pair on computation against
communication, every figure from the records: the share of the step each model spent in
exposed communication (its measured step parts, lab.report.step_parts), its gradient
bytes a step (the record's gradient_values, 4 bytes each) and its compute a sample (the
step parts but communication and waiting, over the batch per rank)."""
from __future__ import annotations

from itertools import combinations

from lab.report import records as rec
from lab.report import step_parts, summary


def _key(row: dict) -> tuple:
    """What must match for two models' rows to be compared."""
    r = row["record"]
    c = r.get("config", {})
    return (c.get("data"), c.get("batch_size"), c.get("framework"), c.get("backend"),
            c.get("compression") or "none", row["strategy"], c.get("precision") or "fp32",
            summary.place(r), row["np"], row["servers"], c.get("link") or "",
            c.get("device"), c.get("threads"), bool(c.get("compile")))


def measured(row: dict) -> dict | None:
    """A row's figures for the comparison: exposed communication's share of the step, the
    gradient bytes a step and the compute a sample; None where its records lack them."""
    parts = step_parts.of_row(row)
    r = row["record"]
    values = (r.get("figures") or {}).get("gradient_values")
    batch = r.get("config", {}).get("batch_size")
    if not parts or not parts["step"] or not values or not batch:
        return None
    compute = sum(parts[p] for p in step_parts.COMPUTE)
    return {"comm_share": parts["communication"] / parts["step"], "grad_bytes": 4.0 * values,
            "compute_per_sample_s": compute / batch, "batch": batch}


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 10e6 else f"{n / 1e6:.2g} MB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.2g} ms"


def sentences(records: list[dict]) -> list[str]:
    """A sentence for each pair of models measured the same way across servers."""
    by_key: dict[tuple, dict[str, tuple[dict, dict]]] = {}
    for row in summary.rows(records):
        if not row.get("runs") or row["servers"] < 2 or not rec.data_parallel(row["record"]):
            continue
        m = measured(row)
        if m is not None:
            by_key.setdefault(_key(row), {}).setdefault(row["model"], (row, m))
    out = []
    for models in by_key.values():
        # the model with more gradient bytes first
        for a, b in combinations(sorted(models, key=lambda m: -models[m][1]["grad_bytes"]), 2):
            (row, x), (_, y) = models[a], models[b]
            c = row["record"]["config"]
            link = f" over {c['link']}" if c.get("link") else ""
            out.append(
                f"{a} spent {x['comm_share']:.0%} of its step in exposed communication against "
                f"{b}'s {y['comm_share']:.0%} at {row['np']} workers on {row['servers']} servers{link} "
                f"({rec.stack_name(c.get('framework'), c.get('backend'))}, batch {x['batch']} a worker): "
                f"it has {x['grad_bytes'] / y['grad_bytes']:.1f}x the gradient bytes "
                f"({_mb(x['grad_bytes'])} against {_mb(y['grad_bytes'])} a step) for "
                f"{x['compute_per_sample_s'] / y['compute_per_sample_s']:.1f}x the compute per sample "
                f"({_ms(x['compute_per_sample_s'])} against {_ms(y['compute_per_sample_s'])}).")
    return out
