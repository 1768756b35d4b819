"""Why a configuration scales as it does: each multi-worker row's step predicted by the cost
model (lab.report.cost_model) from its 1-worker row, the collectives its back end timed
(figures.collective_alone, fitted per framework, back end and place) and the bucket
schedule, beside the measured step; what the measured step has beyond the prediction is
unexplained. Then a what-if table for configurations not run, and prediction.json (every
term, so the error can be recomputed).

Every figure comes from the records (medians over repeats, lab.report.summary.rows)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from lab.common.link import DELAY, rate_gbs
from lab.report import cost_model as cm
from lab.report import records as rec
from lab.report import step_parts, summary
from lab.report.tables import row_oversubscribed

HEADERS = ["configuration", "np", "servers", "compute", "slowdown", "exposed", "waiting",
           "predicted", "measured", "error", "speedup (pred.)", "speedup (meas.)", "unexplained"]
WHAT_IF_WORKERS = (1, 2, 4, 8, 16, 64)
WHAT_IF_LINKS_GBIT = (1, 10, 100)
WHAT_IF_HEADERS = ["configuration", "workers", *(f"{g} Gbit/s" for g in WHAT_IF_LINKS_GBIT)]
JSON_FILE = "prediction.json"


def _collective(row: dict) -> dict | None:
    """The row's collective figure: the median time over its repeats, op, size, busbw."""
    figs = [r["figures"].get("collective_alone") for r in row["records"]]
    figs = [f for f in figs if f and "time_s" in f]
    if not figs:
        return None
    t = statistics.median(f["time_s"] for f in figs)
    return {**figs[0], "time_s": t, "busbw_gbs": statistics.median(f["busbw_gbs"] for f in figs)}


def _link(record: dict) -> tuple[float | None, float]:
    """(rate in GB/s, delay in s) of a multi-server record's shaped link; (None, 0) else."""
    spec = record.get("config", {}).get("link", "") or ""
    if record["world"]["nodes"] < 2 or not spec:
        return None, 0.0
    delay = spec.partition("/")[2]
    m = DELAY.match(delay) if delay else None
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    return rate_gbs(spec), (float(m.group(1)) * scale[m.group(2).lower()] if m else 0.0)


def fit_key(record: dict) -> tuple:
    """Collectives that share a cost: framework, back end, place, across servers, link."""
    c, w = record.get("config", {}), record["world"]
    return (c.get("framework"), w.get("controller") or c.get("backend"), summary.place(record),
            w["nodes"] > 1, (c.get("link", "") or "") if w["nodes"] > 1 else "")


def fits(records: list[dict]) -> dict[tuple, cm.Fit]:
    """One alpha-beta fit per fit_key from every ok record's collective timed alone."""
    points: dict[tuple, list[dict]] = {}
    links: dict[tuple, tuple] = {}
    for r in records:
        c = (r.get("figures") or {}).get("collective_alone") if r.get("status") == "ok" else None
        if c and c.get("time_s"):
            points.setdefault(fit_key(r), []).append(c)
            links[fit_key(r)] = _link(r)
    return {k: f for k, pts in points.items() if (f := cm.fit(pts, *links[k]))}


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _ceiling(row: dict) -> float | None:
    return _median([((r.get("figures") or {}).get("ceiling") or {}).get("images_per_s")
                    for r in row["records"]])


def mean_wait(row: dict) -> float | None:
    """What the ranks waited in the collective for the slowest (seconds): in each record the
    mean over its ranks (each rank's mean over its typical steps), the median over repeats.
    The mean, not the most: rank i joins at a_i and waits max(a) - a_i, so the step, the
    last one's arrival plus the collective, is the ranks' mean arrival (the mean compute)
    plus their mean wait plus the collective."""
    return _median([statistics.fmean(x["parts_s"]["waiting"] for x in ranks) for r in row["records"]
                    if (ranks := [x for x in ((r.get("figures") or {}).get("step_parts") or {}).get("ranks") or []
                                  if x.get("parts_s")])]) if row.get("records") else None


def slowdown(row: dict, one: dict) -> tuple[float | None, str | None]:
    """(compute at N workers over compute at 1, where it was measured): the rows' step parts
    (forward, backward, optimizer, other; where a record's note says a part holds some of the
    exchange, the backward is left out of both), else N x the 1-process compute ceiling over
    the N-process one; (None, None) where neither was measured."""
    parts, parts_one = step_parts.of_row(row), step_parts.of_row(one)
    if parts and parts_one:
        noted = any(((r.get("figures") or {}).get("step_parts") or {}).get("note")
                    for r in row["records"] + one["records"])
        keys = [k for k in step_parts.COMPUTE if not (noted and k == "backward")]
        one_s = sum(parts_one[k] for k in keys)
        if one_s > 0:
            return sum(parts[k] for k in keys) / one_s, "step parts"
    c1, cn = _ceiling(one), _ceiling(row)
    return ((row["np"] * c1 / cn, "ceiling") if c1 and cn else (None, None))


def inputs(row: dict, one: dict) -> cm.Inputs:
    """The model's inputs for `row` from its records and its 1-worker row's."""
    r, n = row["record"], row["np"]
    f = r["figures"]
    compute = one["time per step (ms)"] / 1000
    parts = step_parts.of_row(one)
    backward = compute * parts["backward"] / parts["step"] if parts and parts["step"] else None
    slow, slow_from = slowdown(row, one)
    hv = r["world"].get("horovod") or {}
    values = f.get("gradient_values")
    grad = 4.0 * values if values else float(f.get("payload_bytes_per_step") or 0)
    return cm.Inputs(
        framework=r["config"].get("framework", "ddp"), np=n, compute_s=compute, backward_s=backward,
        grad_bytes=grad, payload_bytes=float(f.get("payload_bytes_per_step") or grad),
        op=f.get("collective") or "allreduce",
        slowdown=slow, slowdown_from=slow_from, waiting_s=mean_wait(row),
        tensors=cm.MODEL_TENSORS.get(r["config"].get("model"), cm.DEFAULT_TENSORS),
        cycle_s=hv.get("cycle_time_ms", cm.HOROVOD_CYCLE_S * 1000) / 1000,
        fusion_bytes=hv.get("fusion_threshold_bytes", cm.HOROVOD_FUSION))


def _pairs(records: list[dict]):
    """(row, its 1-worker row or None) for every multi-worker row that ran."""
    rows = summary.rows(records)
    base = {summary.config_key(r["record"]): r for r in rows
            if r.get("runs") and r["np"] == 1 and r.get("servers") == 1}
    for row in rows:
        if row.get("runs") and row["np"] >= 2:
            yield row, base.get(summary.config_key(row["record"]))


def with_cycle_costs(cases: list[tuple[dict, cm.Inputs, cm.Fit]]) -> list[cm.Inputs]:
    """Each case's inputs with Horovod's cycle cost: the median of the costs fitted to the
    exposed communication that the other cases of its fit_key measured (step parts), those
    of its own model where there are any, else those of other models; else the one fitted
    to its own (said in cycle_cost_from); else none."""
    own = []
    for row, x, fit in cases:
        parts = step_parts.of_row(row)
        own.append(cm.cycle_cost(x, fit, parts["communication"]) if parts else None)
    out = []
    for i, (row, x, _) in enumerate(cases):
        key, model = fit_key(row["record"]), row["record"]["config"].get("model")
        others = [(c, r["record"]["config"].get("model") == model) for j, ((r, _, _), c) in enumerate(zip(cases, own))
                  if j != i and c is not None and fit_key(r["record"]) == key]
        others = [c for c, same in others if same] or [c for c, _ in others]
        if x.framework != "horovod" or (not others and own[i] is None):
            out.append(x)
            continue
        cost, how = (statistics.median(others), "others") if others else (own[i], "itself")
        out.append(cm.Inputs(**{**x.__dict__, "cycle_cost_s": cost, "cycle_cost_from": how}))
    return out


def predictions(records: list[dict]) -> list[dict]:
    """One entry per multi-worker row that has its 1-worker row and a fitted collective."""
    fitted = fits(records)
    pairs = [(row, one) for row, one in _pairs(records) if one is not None and fit_key(row["record"]) in fitted]
    cases = [(row, inputs(row, one), fitted[fit_key(row["record"])]) for row, one in pairs]
    out = []
    for (row, one), (_, _, fit), x in zip(pairs, cases, with_cycle_costs(cases)):
        p = cm.predict(x, fit)
        step = row["time per step (ms)"]
        parts, parts_one = step_parts.of_row(row), step_parts.of_row(one)
        out.append({"gap": step_parts.gap(parts, parts_one) if parts and parts_one else None,
                    "row": row, "np": row["np"], "servers": row["servers"], "inputs": x, "fit": fit,
                    "model": p, "collective": _collective(row),
                    "predicted_ms": p["step_s"] * 1000, "step_ms": step,
                    "compute_ms": x.compute_s * 1000,
                    "error": p["step_s"] * 1000 / step - 1 if step else None,
                    "unexplained_ms": step - p["step_s"] * 1000,
                    "predicted_speedup": p["speedup"], "speedup": row.get("speedup"),
                    "oversubscribed": row_oversubscribed(row)})
    return out


def unpredicted(records: list[dict]) -> list[dict]:
    """The multi-worker rows the model could not predict, with why."""
    fitted = fits(records)
    out = []
    for row, one in _pairs(records):
        why = ("no 1-worker run of the same configuration" if one is None else
               "no collective timed for its back end and place" if fit_key(row["record"]) not in fitted
               else None)
        if why:
            out.append({"row": row, "why": why})
    return out


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "n/a" if v is None else format(v, spec)


def table(records: list[dict], preds: list[dict]) -> list[list]:
    rows = []
    for p in preds:
        m = p["model"]
        rows.append([
            rec.config_label(p["row"]["record"], records, " / "), p["np"], p["servers"],
            f"{p['compute_ms']:.1f}", f"{m['slowdown']:.2f}", f"{m['exposed_s'] * 1000:.1f}",
            f"{m['waiting_s'] * 1000:.1f}", f"{p['predicted_ms']:.1f}", f"{p['step_ms']:.1f}",
            _fmt(None if p["error"] is None else 100 * p["error"], "+.0f") + "%",
            _fmt(p["predicted_speedup"], ".2f"), _fmt(p["speedup"], ".2f"),
            f"{p['unexplained_ms']:+.1f}" + (" (oversubscribed)" if p["oversubscribed"] else "")])
    return rows


def what_if(records: list[dict], preds: list[dict]) -> list[dict]:
    """Each predicted configuration at WHAT_IF_WORKERS on links of WHAT_IF_LINKS_GBIT, every
    worker on a server of its own (no shared cores), waiting as measured at the most workers."""
    best: dict[tuple, dict] = {}
    for p in preds:
        key = summary.config_key(p["row"]["record"])
        if key not in best or (p["np"], p["servers"]) > (best[key]["np"], best[key]["servers"]):
            best[key] = p
    out = []
    for p in best.values():
        x = p["inputs"]
        for n in WHAT_IF_WORKERS:
            for g in WHAT_IF_LINKS_GBIT:
                fit = p["fit"].on_link(g / 8)
                y = cm.Inputs(**{**x.__dict__, "np": n, "slowdown": None})
                m = cm.predict(y, fit)
                out.append({"configuration": rec.config_label(p["row"]["record"], records, " / "),
                            "workers": n, "link_gbit": g, "predicted_step_ms": m["step_s"] * 1000,
                            "predicted_speedup": m["speedup"], "extrapolated": True,
                            "terms": _terms(m, fit)})
    return out


def what_if_table(cases: list[dict]) -> list[list]:
    rows: dict[tuple, list] = {}
    for c in cases:
        rows.setdefault((c["configuration"], c["workers"]), []).append(
            f"{c['predicted_step_ms']:.1f} ms ({c['predicted_speedup']:.2f}x)")
    return [[name, n, *cells] for (name, n), cells in rows.items()]


def _terms(m: dict, fit: cm.Fit) -> dict:
    return {"compute_ms": m["compute_s"] * 1000, "compute_one_worker_ms": m["compute_one_s"] * 1000,
            "slowdown": m["slowdown"], "backward_ms": m["backward_s"] * 1000,
            "exposed_communication_ms": m["exposed_s"] * 1000, "waiting_ms": m["waiting_s"] * 1000,
            "collective_alone_ms": m["collective_alone_s"] * 1000, "collectives_per_step": m["buckets"],
            "collectives_ms": m["collectives_s"] * 1000, "fit": fit.as_dict(),
            "slowdown_from": m["slowdown_from"], "horovod_cycle_cost_ms": m["cycle_cost_s"] * 1000,
            "assumptions": m["assumptions"]}


def document(records: list[dict]) -> dict | None:
    """prediction.json's content: None where no row has more than one worker."""
    pairs = list(_pairs(records))
    if not pairs:
        return None
    preds = predictions(records)
    return {"model": "step = compute x slowdown + exposed communication + waiting (lab.report.cost_model)",
            "assumptions": cm.ASSUMPTIONS,
            "configurations": [
                {"configuration": rec.config_label(p["row"]["record"], records, " / "), "np": p["np"],
                 "servers": p["servers"], "link": p["row"]["record"].get("config", {}).get("link", ""),
                 "predicted_step_ms": p["predicted_ms"], "measured_step_ms": p["step_ms"],
                 "error": p["error"], "unexplained_ms": p["unexplained_ms"],
                 "predicted_speedup": p["predicted_speedup"], "measured_speedup": p["speedup"],
                 "terms": _terms(p["model"], p["fit"])} for p in preds]
            + [{"configuration": rec.config_label(u["row"]["record"], records, " / "), "np": u["row"]["np"],
                "servers": u["row"]["servers"], "predicted_step_ms": None,
                "measured_step_ms": u["row"]["time per step (ms)"], "why": u["why"]}
               for u in unpredicted(records)],
            "what_if": what_if(records, preds)}


def write_json(records: list[dict], out_dir: Path) -> Path | None:
    """prediction.json beside report.md, for every report with a multi-worker row."""
    doc = document(records)
    if doc is None:
        return None
    path = Path(out_dir) / JSON_FILE
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def sentences(records: list[dict], preds: list[dict]) -> list[str]:
    """What explains each configuration's step, in one sentence each."""
    out = []
    for p in preds:
        name = rec.config_label(p["row"]["record"], records)
        where = f"at {p['np']} workers" + (f" on {p['servers']} servers" if p["servers"] > 1 else "")
        m = p["model"]
        head = (f"{name} {where}: predicted {p['predicted_ms']:.1f} ms ({p['compute_ms']:.1f} compute x "
                f"{m['slowdown']:.2f}, {m['exposed_s'] * 1000:.1f} exposed of {m['buckets']} "
                f"collective(s) costing {m['collectives_s'] * 1000:.1f} ms{_cycles(m)}, "
                f"{m['waiting_s'] * 1000:.1f} waiting), measured {p['step_ms']:.1f} ms")
        if p["gap"] and p["gap"]["lost"] > 0:
            out.append(head + "; " + _measured_split(p))
        else:
            out.append(head + ".")
    return out


def _cycles(m: dict) -> str:
    """' in 2.4 Horovod cycles of 18.5 ms each' where Horovod's cycle cost was fitted."""
    return (f" in {m['cycles']:.1f} Horovod cycles of {m['cycle_cost_s'] * 1000:.1f} ms each"
            if m["cycle_cost_s"] else "")


def _with_fp16(p: dict, rows: list[dict]) -> dict | None:
    """What fp16 would buy a row sent uncompressed: half the payload, so (bandwidth-bound)
    half its exposed communication, the rest of the step unchanged; and the step measured
    where the same configuration ran with --compression fp16."""
    r = p["row"]["record"]
    if p["gap"] is None or r.get("config", {}).get("compression") != "none":
        return None
    two = step_parts.of_row(p["row"])
    predicted = two["step"] - two["communication"] / 2
    key = summary.group_key(r)
    measured = None
    for row in rows:
        other = row["record"]
        if row.get("runs") and other.get("config", {}).get("compression") == "fp16":
            twin = {**other, "config": {**other["config"], "compression": "none"}}
            if summary.group_key(twin) == key:
                measured = step_parts.of_row(row)
    return {"predicted_s": predicted, "communication_s": two["communication"],
            "measured_s": measured["step"] if measured else None,
            "measured_communication_s": measured["communication"] if measured else None}


def fp16_sentences(records: list[dict], preds: list[dict]) -> list[str]:
    """What fp16 would buy each uncompressed configuration: predicted, then measured."""
    rows = summary.rows(records)
    out = []
    for p in preds:
        f = _with_fp16(p, rows)
        if f is None or p["collective"] is None:
            continue
        name = rec.config_label(p["row"]["record"], records)
        where = f"at {p['np']} workers" + (f" on {p['servers']} servers" if p["servers"] > 1 else "")
        head = (f"{name} {where} with fp16 (half the payload, "
                f"{_mb(p['collective']['size_bytes'] / 2)}): predicted step "
                f"{f['predicted_s'] * 1000:.1f} ms (the exposed communication "
                f"{f['communication_s'] * 1000:.1f} ms halved)")
        if f["measured_s"] is None:
            out.append(head + "; not measured (`--compression none,fp16` measures it).")
        else:
            out.append(head + f", measured {f['measured_s'] * 1000:.1f} ms (exposed "
                              f"communication {f['measured_communication_s'] * 1000:.1f} ms).")
    return out


def _of_link(p: dict) -> str:
    """', 66% of its 1gbit link' for a run on shaped links (bus bandwidth against the rate
    --link gave each node), else ''."""
    spec = p["row"]["record"].get("config", {}).get("link", "")
    gbs = rate_gbs(spec)
    if not gbs or p["servers"] < 2:
        return ""
    return f", {p['collective']['busbw_gbs'] / gbs:.0%} of its {spec.partition('/')[0]} link"


def _measured_split(p: dict) -> str:
    """The measured parts of what the step lost against one worker (step_parts.gap)."""
    c, g = p["collective"], p["gap"]
    lost = g["lost"]

    def share(x):
        return f"{max(0.0, x) / lost:.0%} ({x * 1000:.1f} ms)"
    grew = ("compute slowed by ranks contending for the cores (more ranks than cores)"
            if p["oversubscribed"] else "compute that grew (cores and memory shared by more ranks)")
    alone = (f" (the {c['op']} of {_mb(c['size_bytes'])}: {c['time_s'] * 1000:.1f} ms alone at "
             f"{c['busbw_gbs']:.3g} GB/s bus bandwidth{_of_link(p)})") if c else ""
    return (f"measured, of the {lost * 1000:.1f} ms the step lost against one worker, "
            f"{share(g['communication'])} is exposed communication{alone}, "
            f"{share(g['waiting'])} waiting for the slowest rank, {share(g['compute'])} {grew}, "
            f"and {share(g['unexplained'])} not in the parts (each part's median over repeats). "
            f"Speedup predicted {_fmt(p['predicted_speedup'], '.2f')}, measured {_fmt(p['speedup'], '.2f')}.")


def _mb(b: float) -> str:
    return f"{b / 1e6:.3g} MB"
