"""Why a configuration scales as it does: each multi-worker row's step predicted by the cost
model (lab.report.cost_model) from its 1-worker row, the compute ceilings at 1 and at its
ranks, the other configurations' waiting, the collectives its back end timed apart from
training (figures.collective_alone and doctor's sweeps, fitted per framework, back end,
place and link) and the bucket schedule, beside the measured step: nothing of the row's
own steps goes in (lab.report.model_inputs); what the measured step has beyond the
prediction is unexplained, and the step the row's own parts explain is shown apart. Then a
what-if table for configurations not run, and prediction.json (every term, so the error can
be recomputed). Apart from the model, `measured`: what each multi-worker row's step lost
against one worker, split into its measured parts, for every row with its 1-worker row,
predicted or not.

Every figure comes from the records (medians over repeats, lab.report.summary.rows)."""
from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

from lab.report import algorithms, step_parts, summary
from lab.report import cost_model as cm
from lab.report import model_inputs as mi
from lab.report import records as rec
from lab.report.cost_assumptions import ASSUMPTIONS
from lab.report.prediction_text import fp16_sentences, sentences, split_sentences  # noqa: F401 (the report's)
from lab.report.tables import row_oversubscribed

HEADERS = ["configuration", "np", "servers", "compute", "slowdown", "exposed", "waiting",
           "predicted", "measured", "error", "no-model", "pred. speedup", "speedup"]
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


def fit_key(record: dict) -> tuple:
    """Collectives that share a cost: framework, back end, place, across servers, link."""
    c, w = record.get("config", {}), record["world"]
    return (*mi.framework_key(record), summary.place(record),
            w["nodes"] > 1, (c.get("link", "") or "") if w["nodes"] > 1 else "")


def _without_cycle_wait(point: dict, framework: str | None, cycle_s: float) -> dict:
    """A timed point as the fit takes it: Horovod's with the wait for its background
    thread's cycle taken out (cost_model.horovod_collective_s)."""
    if framework != "horovod":
        return point
    return {**point, "time_s": cm.horovod_collective_s(point["time_s"], cycle_s), "timed_s": point["time_s"]}


def fits(records: list[dict], sweeps: list[dict] = ()) -> dict[tuple, cm.Fit]:
    """One alpha-beta fit per fit_key from every ok record's collective timed alone and
    doctor's size sweeps of the same key (model_inputs.load_sweeps), Horovod's without
    the wait for its cycle (_without_cycle_wait; a sweep saved before doctor recorded its cycle time ran at
    the default)."""
    points: dict[tuple, list[dict]] = {}
    links: dict[tuple, tuple] = {}
    for r in records:
        c = (r.get("figures") or {}).get("collective_alone") if r.get("status") == "ok" else None
        if c and c.get("time_s"):
            key = fit_key(r)
            points.setdefault(key, []).append(_without_cycle_wait(c, key[0], cm.horovod_cycle_s(r["world"].get("horovod"))))
            links[key] = mi.link_of(r.get("config", {}).get("link", ""), r["world"]["nodes"])
    for e in sweeps:
        key = mi.sweep_key(e)
        points.setdefault(key, []).extend(_without_cycle_wait(p, key[0], cm.horovod_cycle_s(e))
                                          for p in e["points"] if p.get("time_s"))
        links[key] = mi.link_of(key[4], 2 if key[3] else 1)
    return {k: f for k, pts in points.items() if (f := cm.fit(pts, *links[k], backend=k[1]))}


def fit_for(key: tuple, fitted: dict[tuple, cm.Fit]) -> cm.Fit | None:
    """The fit of `key`; across servers without one, the same back end's fit on another
    link moved to this one (Fit.on_link: the link's nominal rate and delay)."""
    if key in fitted or not key[3]:
        return fitted.get(key)
    moved = [(k, f) for k, f in fitted.items() if k[:4] == key[:4]]
    if not moved:
        return None
    k, f = max(moved, key=lambda kf: kf[1].points)
    return f.on_link(*mi.link_of(key[4], 2))


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def inputs(row: dict, one: dict) -> cm.Inputs:
    """The explained figure's inputs for `row` (_explain fills in its own slowdown and
    wait): the compute and backward of its 1-worker row, the settings from its record."""
    r, n = row["record"], row["np"]
    ow = mi.one_worker(one)
    return cm.Inputs(
        framework=ow.framework, np=n, compute_s=ow.compute_s, backward_s=ow.backward_s, grad_bytes=ow.grad_bytes,
        payload_bytes=ow.payload_bytes, op=ow.op, tensors=ow.tensors, tensor_bytes=ow.tensor_bytes,
        cycle_s=cm.horovod_cycle_s(r["world"].get("horovod")),
        fusion_bytes=(r["world"].get("horovod") or {}).get("fusion_threshold_bytes", cm.HOROVOD_FUSION))


# What a 1-worker run stands for beside its own configuration: a run of another length
# (epochs, max_steps: how long it ran, not what a step is) and, for a row with a codec, the
# same run without one (the codec's encode and decode cost nothing beyond the 1-worker step:
# the assumption "codec"; predict_row takes the row's payload and collective then).
STANDS_FOR = {"epochs": None, "max_steps": None, "compression": "none"}


def codec(record: dict) -> str:
    """The record's gradient compression ("none" where it names none)."""
    return record.get("config", {}).get("compression") or "none"


def standing_key(record: dict) -> tuple:
    """summary.config_key less what a 1-worker run stands for (STANDS_FOR)."""
    return summary.config_key({**record, "config": {**record.get("config", {}), **STANDS_FOR}})


def _pairs(records: list[dict], known: list[dict] | None = None):
    """(row, its 1-worker row or None) for every multi-worker row that ran: the 1-worker
    row of its configuration, else one of another length with its codec, else one of
    another length without a codec (standing_key); the 1-worker rows from `known` where
    given."""
    rows = summary.rows(records)
    ones = [r for r in (summary.rows(known) if known is not None else rows)
            if r.get("runs") and r["np"] == 1 and r.get("servers") == 1]
    base = {summary.config_key(r["record"]): r for r in ones}
    standing: dict[tuple, dict] = {}
    for r in ones:
        standing.setdefault((standing_key(r["record"]), codec(r["record"])), r)
    for row in rows:
        if row.get("runs") and row["np"] >= 2:
            key = standing_key(row["record"])
            yield row, (base.get(summary.config_key(row["record"])) or standing.get((key, codec(row["record"])))
                        or standing.get((key, "none")))


def with_cycle_costs(cases: list[tuple[dict, cm.Inputs, cm.Fit]], blind: set[int] = frozenset()) -> list[cm.Inputs]:
    """Each case's inputs with Horovod's cycle cost (DDP's bucket cost: the same field, from
    its own model only, never its own): the median of the costs fitted to the
    exposed communication that the other cases of its fit_key measured (step parts), those
    of its own model where there are any; else those of its model on another link of its
    back end, else on other servers (fit_key[:3]: one node and two), else at other places
    (a cycle's or a bucket's cost grows with the tensors and bytes it carries, so its model
    tells it more than its place); Horovod's then other models' (its servers and link, then
    its servers, then any); else the one fitted to its own (said in cycle_cost_from);
    else none. The cases in `blind` (left out) lend none and take none of their own."""
    own = []
    for i, (row, x, fit) in enumerate(cases):
        parts = step_parts.of_row(row) if i not in blind else None
        own.append(cm.cycle_cost(x, fit, parts["communication"]) if parts else None)
    out = []
    for i, (row, x, _) in enumerate(cases):
        key, model = fit_key(row["record"]), row["record"]["config"].get("model")
        near = [(c, fit_key(r["record"]), r["record"]["config"].get("model") == model)
                for j, ((r, _, _), c) in enumerate(zip(cases, own)) if j != i and c is not None
                and fit_key(r["record"])[:3] == key[:3]]
        # its key and model, else its model on another link, else its model on other servers,
        # else other models (its key first, then its servers)
        others = ([c for c, k, same in near if k == key and same]
                  or [c for c, k, same in near if same and k[:4] == key[:4]]
                  or [c for c, _, same in near if same])
        # then its model at other places (the cluster's containers for local processes)
        others = others or [c for j, ((r, _, _), c) in enumerate(zip(cases, own)) if j != i and c is not None
                            and fit_key(r["record"])[:2] == key[:2] and r["record"]["config"].get("model") == model]
        if x.framework != "horovod":
            # DDP's bucket cost from its own model only: a bucket's cost grows with its bytes
            # (ResNet-50's 25 MiB buckets cost more than MNIST's one of 87 KB), and a row
            # with none to take from keeps its collectives at their fitted cost
            if others:
                out.append(cm.Inputs(**{**x.__dict__, "cycle_cost_s": statistics.median(others),
                                        "cycle_cost_from": "others"}))
            else:
                out.append(x)
            continue
        others = others or ([c for c, k, _ in near if k == key] or [c for c, k, _ in near if k[:4] == key[:4]]
                            or [c for c, _, _ in near])
        if not others and own[i] is None:
            out.append(x)
            continue
        cost, how = (statistics.median(others), "others") if others else (own[i], "itself")
        out.append(cm.Inputs(**{**x.__dict__, "cycle_cost_s": cost, "cycle_cost_from": how}))
    return out


def target_of(row: dict) -> cm.Target:
    """The row's configuration as a target: its workers, servers (the ranks spread evenly),
    link and the cores of a server (world.cores): what describes it, nothing it measured."""
    r, n, servers = row["record"], row["np"], row["servers"]
    gbs, delay, burst = mi.link_of(r.get("config", {}).get("link", ""), servers)
    return cm.Target(workers=n, per_server=-(-n // servers) if servers > 1 else None,
                     link_gbit=gbs * 8 if gbs else None, latency_s=delay, burst_bytes=burst,
                     cores=(r.get("world") or {}).get("cores"))


def predict_row(row: dict, one: dict, ceilings: dict, sweeps: list[dict]) -> dict:
    """cost_model.predict_target of the row's target from its 1-worker row (one_worker) and
    its back end's sweeps (sweep_fit: where its ranks exchange, across servers or not):
    nothing the row's own runs timed, nor any other multi-worker run (where its 1-worker run
    had no codec, the row's codec's payload and collective, which no timing sets)."""
    ow = mi.one_worker(one, ceilings)
    if codec(row["record"]) != codec(one["record"]):
        # a 1-worker run without the row's codec (_pairs): what the codec hands the collective
        # is the row's (lab.worker.compression.bytes_per_step: set by the model and the codec,
        # the same in every run of it; nothing timed)
        f = row["record"].get("figures") or {}
        ow = dataclasses.replace(ow, payload_bytes=float(f.get("payload_bytes_per_step") or ow.payload_bytes),
                                 op=f.get("collective") or ow.op)
    fit = mi.sweep_fit(sweeps, ow.backend, summary.place(row["record"]), row["servers"] > 1)
    return {**cm.predict_target(ow, fit, target_of(row)), "one_worker": ow}


def _cases(records: list[dict], sweeps: list[dict] = (), leave_out=None) -> list[dict]:
    """Every multi-worker row with its prediction (predict_row) or why it has none. With
    `leave_out` (a test on a record), only the rows it picks, each predicted without their
    records (a prediction never reads them; their 1-worker rows are the others')."""
    known = [r for r in records if not (leave_out and leave_out(r))]
    ceilings = mi.ceilings(known)
    out = []
    for row, one in _pairs(records, known):
        left = bool(leave_out and leave_out(row["record"]))
        strategy = row["record"].get("config", {}).get("strategy") or "ddp"
        p = predict_row(row, one, ceilings, sweeps) if one is not None else {
            "why": cm.not_predicted(strategy) if strategy != "ddp" else "no 1-worker run of the same configuration"}
        out.append({"row": row, "one": one, "inputs": p.get("inputs"), "fit": p.get("fit"), "why": p["why"],
                    "model": p, "left": left, "explained": None})
    _explain(known, sweeps, [c for c in out if c["one"] is not None and not c["row"]["record"].get("planned")
                             and summary.strategy_name(c["row"]["record"].get("config", {})) == "ddp"])
    return [c for c in out if c["left"] or not leave_out]


def _explain(known: list[dict], sweeps: list[dict], cases: list[dict]) -> None:
    """Each case's step explained by the row's own measurements (its compute parts'
    slowdown, its own wait, its own collective probe in the fit): not a prediction, shown
    apart as one; None without the row's step parts."""
    fitted = fits(known, sweeps)
    mine = []
    for c in cases:
        slow, fit = mi.explained_slowdown(c["row"], c["one"]), fit_for(fit_key(c["row"]["record"]), fitted)
        if slow is not None and fit is not None:
            x = inputs(c["row"], c["one"])
            mine.append((c, fit, cm.Inputs(**{**x.__dict__, "slowdown": slow, "slowdown_from": "step parts",
                                              "contention": 1.0, "contention_from": None,
                                              "waiting_s": mi.mean_wait(c["row"]), "waiting_from": "itself",
                                              "cycle_cost_s": 0.0, "cycle_cost_from": None})))
    for (c, fit, _), x in zip(mine, with_cycle_costs([(c["row"], x, fit) for c, fit, x in mine])):
        p, step = cm.predict(x, fit), c["row"]["time per step (ms)"]
        c["explained"] = {"step_ms": p["step_s"] * 1000, "slowdown": x.slowdown, "waiting_ms": p["waiting_s"] * 1000,
                          "error": p["step_s"] * 1000 / step - 1 if step else None}


def predictions(records: list[dict], sweeps: list[dict] = (), leave_out=None) -> list[dict]:
    """One entry per multi-worker row that has its 1-worker row, a fitted collective and
    the compute ceilings at 1 and at its ranks (_cases: `leave_out`)."""
    out, rows, ceilings = [], summary.rows([r for r in records if not r.get("planned")]), mi.ceilings(records)
    for c in _cases(records, sweeps, leave_out):
        if c["why"]:
            continue
        row, one, x, fit, p = c["row"], c["one"], c["inputs"], c["fit"], c["model"]
        step = row["time per step (ms)"]
        ran = not row["record"].get("planned")      # planned (not run yet): no measurement of its own
        base = baseline_ms(row, rows) if ran else None
        out.append({"baseline_ms": base, "baseline_error": base / step - 1 if base and step else None,
                    "ceiling_img_s": p["ceiling_img_s"],
                    "ceiling_measured_img_s": ceilings.get((mi.compute_key(row["record"]), row["np"], row["servers"],
                                                            mi.own_cores(row["record"]))) if ran else None,"gap": _gap(row, one) if ran else None,
                    "row": row, "np": row["np"], "servers": row["servers"], "inputs": x, "fit": fit,
                    "model": p, "collective": _collective(row) if ran else None, "explained": c["explained"],
                    "predicted_ms": p["step_s"] * 1000, "step_ms": step,
                    "compute_ms": x.compute_s * 1000,
                    "error": p["step_s"] * 1000 / step - 1 if step else None,
                    "unexplained_ms": step - p["step_s"] * 1000,
                    "predicted_speedup": p["speedup"], "speedup": row.get("speedup"),
                    "oversubscribed": row_oversubscribed(row)})
    return out


def baseline_ms(row: dict, rows: list[dict]) -> float | None:
    """The no-model baseline of a row across servers (ms): the same configuration's measured
    step on the link nearest in rate among the others it ran on (same workers, servers and
    cores of their own or not), plus its payload's bytes on the wire beyond each link's
    token bucket at the slower rate less at the faster (cost_model.link_s_per_byte); None
    where it ran on no other link."""
    r = row["record"]
    link = r.get("config", {}).get("link", "") or ""
    gbs, _, burst = mi.link_of(link, row["servers"])
    if not gbs:
        return None
    key = summary.group_key(r)
    near = []
    for o in rows:
        ol = o["record"].get("config", {}).get("link", "") or ""
        og, _, oburst = mi.link_of(ol, o["servers"])
        if o.get("runs") and og and ol != link and summary.group_key({**o["record"], "config": {
                **o["record"]["config"], "link": link}}) == key:
            near.append((abs(og - gbs) / gbs, o, og, oburst))
    if not near:
        return None
    _, o, og, oburst = min(near, key=lambda t: t[0])
    f = r.get("figures") or {}
    wire = algorithms.wire_bytes(f.get("collective") or "allreduce", float(f.get("payload_bytes_per_step") or 0),
                                 row["np"], mi.framework_key(r)[1])
    extra = (max(0.0, wire - burst / cm.FRAMING) * cm.link_s_per_byte(gbs)
             - max(0.0, wire - oburst / cm.FRAMING) * cm.link_s_per_byte(og))
    return o["time per step (ms)"] + 1000 * extra


def _gap(row: dict, one: dict) -> dict | None:
    """What `row`'s step lost against its 1-worker row's, part by part (step_parts.gap);
    None where either measured no step parts."""
    parts, parts_one = step_parts.of_row(row), step_parts.of_row(one)
    return step_parts.gap(parts, parts_one) if parts and parts_one else None


def measured(records: list[dict], preds: list[dict] = ()) -> list[dict]:
    """Every multi-worker row that ran, with its 1-worker row, both with step parts: what
    its step lost against one worker, part by part, and its collective timed alone. A
    measurement: it needs no compute ceiling and no fitted collective; the row's entry of
    `preds` (predictions) rides along as "prediction" where the model made one, else None."""
    predicted = {summary.group_key(p["row"]["record"]): p for p in preds}
    out = []
    for row, one in _pairs(records):
        g = _gap(row, one) if one is not None and not row["record"].get("planned") else None
        if g is None:
            continue
        p = predicted.get(summary.group_key(row["record"]))
        out.append({"row": row, "np": row["np"], "servers": row["servers"], "gap": g,
                    "collective": _collective(row), "step_ms": row["time per step (ms)"],
                    "speedup": row.get("speedup"), "oversubscribed": row_oversubscribed(row),
                    "prediction": p, "predicted_speedup": p["predicted_speedup"] if p else None})
    return out


def unpredicted(records: list[dict], sweeps: list[dict] = (), leave_out=None) -> list[dict]:
    """The multi-worker rows the model could not predict, with why (and the step their own
    parts explain, where they have them)."""
    return [{"row": c["row"], "why": c["why"], "explained": c["explained"]}
            for c in _cases(records, sweeps, leave_out) if c["why"]]


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "n/a" if v is None else format(v, spec)


def table(records: list[dict], preds: list[dict]) -> list[list]:
    rows = []
    for p in preds:
        m = p["model"]
        rows.append([
            rec.config_label(p["row"]["record"], records, " / ") + rec.link_label(p["row"]["record"]),
            p["np"], p["servers"],
            f"{p['compute_ms']:.1f}", f"{m['slowdown']:.2f}", f"{m['exposed_s'] * 1000:.1f}",
            f"{m['waiting_s'] * 1000:.1f}", f"{p['predicted_ms']:.1f}",
            f"{p['step_ms']:.1f}" + (" (oversubscribed)" if p["oversubscribed"] else ""),
            _fmt(None if p["error"] is None else 100 * p["error"], "+.0f") + "%",
            _fmt(None if p.get("baseline_error") is None else 100 * p["baseline_error"], "+.0f")
            + ("%" if p.get("baseline_error") is not None else ""),
            _fmt(p["predicted_speedup"], ".2f"), _fmt(p["speedup"], ".2f")])
    return rows


def what_if_fit(sweeps: list[dict], backend: str | None) -> cm.Fit | None:
    """The what-if's collective of a back end, one for all its configurations: doctor's
    sweep across servers where there is one, else within one (model_inputs.sweep_fit, any
    place), carried to each link by cost_model.target_fit."""
    return mi.sweep_fit(sweeps, backend, None, True)


def what_if(records: list[dict], preds: list[dict], sweeps: list[dict] = ()) -> list[dict]:
    """Each predicted configuration at WHAT_IF_WORKERS on links of WHAT_IF_LINKS_GBIT, every
    worker on a server of its own (no shared cores), by the same code as its prediction
    (cost_model.predict_target) from one source: its 1-worker row and its back end's
    what_if_fit, so two configurations of one model differ only as their 1-worker runs do."""
    first: dict[tuple, dict] = {}
    for p in preds:
        first.setdefault(summary.config_key(p["row"]["record"]), p)
    out = []
    for p in first.values():
        one = p["model"]["one_worker"]
        fit = what_if_fit(sweeps, one.backend)
        for n in WHAT_IF_WORKERS:
            for g in WHAT_IF_LINKS_GBIT:
                m = cm.predict_target(one, fit, cm.Target(workers=n, per_server=1, link_gbit=g))
                if m["why"]:
                    continue
                out.append({"configuration": rec.config_label(p["row"]["record"], records, " / "),
                            "workers": n, "link_gbit": g, "predicted_step_ms": m["step_s"] * 1000,
                            "predicted_speedup": m["speedup"], "efficiency": m["efficiency"],
                            "extrapolated": True, "terms": _terms(m, m["fit"]) if m["fit"] else _terms(m, fit)})
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
            "collective_fitted_ms": m["collective_fitted_s"] * 1000, "collectives_per_step": m["buckets"],
            "collectives_ms": m["collectives_s"] * 1000, "fit": fit.as_dict() if fit else None,
            "slowdown_from": m["slowdown_from"], "contention": m["contention"],
            "contention_from": m["contention_from"], "waiting_from": m["waiting_from"],
            "horovod_cycle_cost_ms": m["cycle_cost_s"] * 1000,
            "ddp_bucket_cost_ms": m["bucket_cost_s"] * 1000,
            **{k: m[k] for k in ("throughput_img_s", "efficiency", "ceiling_img_s") if k in m},
            "assumptions": m["assumptions"]}


def document(records: list[dict], sweeps: list[dict] = ()) -> dict | None:
    """prediction.json's content: None where no row has more than one worker. Beside each
    prediction, the step the row's own measurements explain (not a prediction)."""
    pairs = list(_pairs(records))
    if not pairs:
        return None
    preds = predictions(records, sweeps)
    return {"model": "step = compute x slowdown + exposed communication + waiting (lab.report.cost_model)",
            "assumptions": ASSUMPTIONS,
            "configurations": [
                {"case": rec.case_name(p["row"], records),
                 "configuration": rec.config_label(p["row"]["record"], records, " / "), "np": p["np"],
                 "servers": p["servers"], "link": p["row"]["record"].get("config", {}).get("link", ""),
                 "predicted_step_ms": p["predicted_ms"], "measured_step_ms": p["step_ms"],
                 "error": p["error"], "unexplained_ms": p["unexplained_ms"],
                 "no_model_baseline_ms": p["baseline_ms"], "no_model_baseline_error": p["baseline_error"],
                 "ceiling_predicted_img_s": p["ceiling_img_s"], "ceiling_measured_img_s": p["ceiling_measured_img_s"],
                 "predicted_speedup": p["predicted_speedup"], "measured_speedup": p["speedup"],
                 "terms": _terms(p["model"], p["fit"]), "explained": p["explained"]} for p in preds]
            + [{"case": rec.case_name(u["row"], records),
                "configuration": rec.config_label(u["row"]["record"], records, " / "), "np": u["row"]["np"],
                "servers": u["row"]["servers"], "predicted_step_ms": None,
                "measured_step_ms": u["row"]["time per step (ms)"], "why": u["why"],
                "explained": u["explained"]}
               for u in unpredicted(records, sweeps)],
            "what_if": what_if(records, preds, sweeps)}


def write_json(records: list[dict], out_dir: Path, sweeps: list[dict] = ()) -> Path | None:
    """prediction.json beside report.md, for every report with a multi-worker row."""
    doc = document(records, sweeps)
    if doc is None:
        return None
    path = Path(out_dir) / JSON_FILE
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path
