"""`invoke report RESULTS_DIR`: the lab report from the records alone, in the layout of
a course's lab report: the environment table, the results within one server and
across servers, the scalability curves, then gradient compression and parallel
strategies, the combinations that did not run (once each, by reason) and an analysis
whose every sentence is computed from the figures.

`document` builds the report as blocks (lab.report.document) from the records; `write`
is the edge that reads the records and writes report.md (and report.html, one page with
the curves embedded) with the PNG curves beside them. Each part lives in the module
that renders it: tables, curves, strategies, analysis."""
from __future__ import annotations

from pathlib import Path

from lab.report import (
    cost_assumptions,
    curves,
    html,
    markdown,
    model_comparison,
    model_inputs,
    prediction,
    prediction_text,
    step_parts,
    strategies,
    tables,
)
from lab.report import document as d
from lab.report.analysis import RANKING_HEADERS, analysis
from lab.report.bench_output import restart_line
from lab.report.environment import differing, environment
from lab.report.records import ReportError, config_label, link_label, load, ok

__all__ = ["FORMATS", "ReportError", "document", "formats", "render", "write", "write_files"]

FORMATS = ("md", "html")


def _results(records: list[dict], across: bool, notes: d.Notes, empty: str) -> list:
    """A results table; its runs column only where its rows differ in runs (else the
    note under it says how many)."""
    rows = tables.result_rows(records, across, notes)
    if not rows:
        return [d.Para(empty)]
    headers = tables.RESULT_HEADERS
    if len({r[-1] for r in rows}) == 1:
        headers, rows = headers[:-1], [r[:-1] for r in rows]
    shown = [r for r in records if (r.get("world", {}).get("nodes", 1) > 1) == across]
    return [d.Table(headers, rows, notes.take() + tables.result_marks(records, across)
                    + tables.devices_note(shown, records))]


def _model(records: list[dict], sweeps: list[dict] = ()) -> tuple[list[dict], list[dict], list[dict]]:
    """The cost model over all the report's records and doctor's `sweeps`, once: (the
    predictions, the rows not predicted, the sweeps for the what-if), as prediction.json and
    model_check make them."""
    return prediction.predictions(records, sweeps), prediction.unpredicted(records, sweeps), list(sweeps)


def _why(records: list[dict], level: int, model: tuple[list[dict], list[dict], list[dict]]) -> list:
    """Predicted against measured scaling (lab.report.prediction; `model`: _model of all
    the report's records, of which a model's section shows its own rows). The measured
    split of what each multi-worker row lost, and what fp16 would buy it, for every row with
    its 1-worker row: measurements, shown whether the model predicted the row or not."""
    models = {r.get("config", {}).get("model") for r in records}
    preds = [p for p in model[0] if _model_of(p) in models]
    unpredicted = [_unpredicted(records, u) for u in model[1] if _model_of(u) in models]
    splits = prediction.measured(records, preds)
    said = prediction.split_sentences(records, splits) + prediction.fp16_sentences(records, splits)
    head = d.Heading(level, "Why it scales as it does")
    parts = step_parts.table(records)
    split = [d.Para("Each step, part by part (every rank measures its steps; a part is its mean "
                    "over the rank's typical steps, the middle half by duration, averaged over "
                    "the ranks; the median over repeats):"),
             d.Table(step_parts.HEADERS, parts, [
                 "Milliseconds. Backward: its compute; exposed comm.: the time the step waits "
                 "for its collective after the backward's compute ended (what the overlap did "
                 "not hide); waiting: what a rank spent in the collective beyond the rank that "
                 "joined it last. Data loading is before the timed step and not in the sum; step: "
                 "the same typical steps as the training loop timed them.", *step_parts.notes(records)])] if parts else []
    if not preds:
        return [head, *split, *([d.Items(said)] if said else []),
                d.Para("No multi-worker run could be predicted: that takes a 1-worker run "
                       "of the same configuration and doctor's sweep of its back end's collective "
                       "(`invoke doctor --save RESULTS`; `invoke bench --ceiling` adds the compute "
                       "ceiling that checks the compute's slowdown)."),
                *([d.Items(unpredicted)] if unpredicted else [])]
    return [head, d.Table(prediction.HEADERS, prediction.table(records, preds), [
        "Milliseconds but for slowdown, errors and speedups. Each row predicted from its 1-worker run, "
        "doctor's sweeps and its own description alone (workers, servers, link, cores), never from a "
        "run of more than one worker: predicted step = compute (the 1-worker step) x slowdown (the ranks "
        "on a server sharing its cores: max(1, ranks x threads / cores)) + exposed (communication: DDP's "
        "bucket schedule, or Horovod's cycles, against the backward pass, the collective's latency and "
        "bandwidth fitted on doctor's sweeps of the back end) + waiting (the expected wait for the "
        "slowest of the ranks, each step drawn from the 1-worker run's); measured: the mean of all timed "
        "steps (the step parts below are of the typical steps); error: predicted against measured; "
        "no-model: the error of a baseline with no model, the same configuration's step measured on the "
        "nearest other link plus its payload at the slower rate (n/a where it ran on no other link); "
        "pred. speedup, speedup: the throughput over one worker's, from the predicted and the measured step"
        + ("; (oversubscribed): the run had more ranks than cores, so its step measures ranks taking turns on them"
           if any(p["oversubscribed"] for p in preds) else "") + ". Every term is in prediction.json.",
        *_ceiling_checks(records, preds), *unpredicted]),
        *_what_if(prediction.what_if(records, preds, model[2])), *split,
        d.Items(prediction.sentences(records, preds) + said),
        d.Para("The model's assumptions:"), d.Items(_assumed(preds))]


def _ceiling_checks(records: list[dict], preds: list[dict]) -> list[str]:
    """The compute ceiling at N processes the model implies against the one measured there
    (`--ceiling`): a check of the compute's slowdown, never an input."""
    out = [f"{config_label(p['row']['record'], records, ' / ')}{link_label(p['row']['record'])} at {p['np']}: "
           f"{p['ceiling_img_s']:.4g} img/s predicted, {p['ceiling_measured_img_s']:.4g} measured "
           f"({100 * (p['ceiling_img_s'] / p['ceiling_measured_img_s'] - 1):+.0f}%)"
           for p in preds if p.get("ceiling_img_s") and p.get("ceiling_measured_img_s")]
    return ["The compute ceiling at N processes the model implies (the 1-process ceiling x N / slowdown) "
            "against the one measured (`--ceiling`, a check, not an input): " + "; ".join(out) + "."] if out else []


def _model_of(case: dict) -> str | None:
    """The model of a predicted (or unpredicted) row."""
    return case["row"]["record"].get("config", {}).get("model")


def _unpredicted(records: list[dict], u: dict) -> str:
    r = u["row"]["record"]
    return (f"Not predicted: {config_label(r, records, ' / ')}{link_label(r)} at {u['row']['np']} workers "
            f"({u['why']}){prediction_text.explained(u['explained'])}.")


def _what_if(cases: list[dict]) -> list:
    if not cases:
        return []
    return [d.Para("What if (extrapolated, not measured): the predicted step, and the speedup in "
                   "brackets, at more workers and on other links, each worker on a server of its own:"),
            d.Table(prediction.WHAT_IF_HEADERS, prediction.what_if_table(cases), [
                "Extrapolated: no row of this table ran. The same model as the predictions above, from each "
                "configuration's 1-worker run and one fit per back end (doctor's sweep across servers where "
                "there is one, else within one): the link's rate replaces the fitted link's in the "
                "collective's per-byte cost, the fitted latency per step is kept and the links add no "
                "delay; compute is the 1-worker step, with no slowdown (no worker shares a server's "
                "cores); waiting the expected wait for the slowest of the workers."])]


def _assumed(preds: list[dict]) -> list[str]:
    used = {a for p in preds for a in p["model"]["assumptions"]} | {"link"}
    return [text for key, text in cost_assumptions.ASSUMPTIONS.items() if key in used]


def document(records: list[dict], images: list[str], source: str, sweeps: list[dict] = ()) -> list:
    """The report's blocks, in the template's order. Records of several models: each
    model its own results, compression, strategies and analysis (its own ranking), under
    a heading of its own; the curves (a panel per setup) and what did not run after them."""
    n_ok = len(ok(records))
    n_failed = sum(1 for r in records if r.get("status") == "failed")
    n_skipped = sum(1 for r in records if r.get("status") == "skipped")
    listed = len(tables.skipped_runs(records))
    later = (f"; {n_skipped - listed} of them ran later or were skipped again, so "
             f"{listed} {'is' if listed == 1 else 'are'} listed below" if listed != n_skipped else "")
    times = sorted(r.get("started_at", "") for r in records)
    notes = d.Notes()
    env = environment(records)
    blocks = [d.Heading(1, "Distributed training lab report"),
              d.Para(f"Generated by `invoke report` from {len(records)} record(s) in `{source}` "
                     f"({n_ok} ok, {n_failed} failed, {n_skipped} skipped{later}), runs from "
                     f"{times[0][:19]} to {times[-1][:19]} UTC. Every figure below comes from "
                     f"those records."),
              d.Heading(2, "Environment"), d.Table(["item", "value"], env, differing(env))]
    models = list(dict.fromkeys(r.get("config", {}).get("model") for r in records))
    if len(models) == 1:
        blocks += _results_sections(records, notes, 2)
        blocks += _curves(images)          # the template's order: results, then the curve
        blocks += _why(records, 2, _model(records, sweeps))
        blocks += _by_configuration(records, images, 2)
        blocks += _not_run(records)
        blocks += _restarted(records)
        blocks += _analysis(records, 2)
    else:
        compared = _compared(records)
        blocks.append(d.Para(f"The records hold {len(models)} models ({', '.join(map(str, models))}): "
                             f"each has its own tables and ranking below, and " + (
                                 "they are compared only where they ran the same way across "
                                 "servers, after them." if compared else
                                 "no figure of one is compared with another's.")))
        model = _model(records, sweeps)
        for m in models:
            mine = [r for r in records if r.get("config", {}).get("model") == m]
            blocks.append(d.Heading(2, f"Model {m}"))
            blocks += _results_sections(mine, notes, 3)
            blocks += _why(mine, 3, model)
            blocks += _by_configuration(mine, images, 3)
            blocks += _analysis(mine, 3)
        blocks += compared
        blocks += _curves(images)
        blocks += _not_run(records)
        blocks += _restarted(records)
    blocks.append(d.Para("Speedup and efficiency are against the same configuration with 1 "
                         "worker. Wire bytes are an estimate for ring algorithms (see the results "
                         "schema)."))
    return blocks


def _compared(records: list[dict]) -> list:
    """The models side by side: computation against communication, where two models ran
    the same way across servers (lab.report.model_comparison)."""
    said = model_comparison.sentences(records)
    if not said:
        return []
    return [d.Heading(2, "Models compared: computation against communication"),
            d.Para("Each model's measured step parts at the same workers, servers, link and "
                   "stack (exposed communication: what the step waited for its gradients' "
                   "exchange beyond the backward's compute; compute: forward, backward, "
                   "optimizer and the rest, per sample of a worker's batch):"),
            d.Items(said)]


def _results_sections(records: list[dict], notes: d.Notes, level: int) -> list:
    blocks = [d.Heading(level, "Results within one server")]
    blocks += _results(records, False, notes, "No single-server run.")
    blocks.append(d.Heading(level, "Results across servers"))
    blocks += _results(records, True, notes,
                       "No multi-server run (`invoke up` and `invoke bench --nodes 2` make one).")
    return blocks


def _curves(images: list[str]) -> list:
    curve_images = [i for i in curves.CURVE_FILES if i in images]
    blocks = [d.Heading(2, "Scalability curve")] + (
        [d.Image(i, i.split(".")[0]) for i in curve_images] if curve_images
        else [d.Para("No configuration ran at more than one worker count.")])
    if curves.ONE_COUNT_FILE in images:
        blocks += [d.Para("The configurations that ran at one worker count only have no curve; "
                          "their throughput:"),
                   d.Image(curves.ONE_COUNT_FILE, "one worker count")]
    return blocks


def _by_configuration(records: list[dict], images: list[str], level: int) -> list:
    """Gradient compression, and the parallel strategies when any ran."""
    comp = tables.compression_rows(records)
    blocks = [d.Heading(level, "Gradient compression"),
              d.Table(tables.COMPRESSION_HEADERS, comp, tables.devices_note(
                  [r for g in tables.compression_groups(records).values() if len(g) > 1
                   for r in g.values()], records)) if comp else
              d.Para("No configuration was run with more than one compression.")]
    if strategies.has_strategies(records):
        blocks += [d.Heading(level, "Parallel strategies"),
                   d.Table(strategies.STRATEGY_HEADERS, strategies.strategy_rows(records), [
                       "Held: the bytes each rank keeps in parameters, gradients and optimizer "
                       "state, summed over its tensors' storages; peak: its resident set on CPUs, "
                       "torch's peak allocation on GPUs; one figure per rank, rank 0 first.",
                       *tables.devices_note(records, records)])]
        if "memory.png" in images:
            blocks.append(d.Image("memory.png", "memory"))
    return blocks


def _not_run(records: list[dict]) -> list:
    skipped = tables.not_run(records)
    if not skipped:
        return []
    return [d.Heading(2, "Combinations that did not run"),
            d.Para("Skipped before they started, because this machine cannot run them; "
                   "they are in no table above."),
            d.Items(skipped)]


def _restarted(records: list[dict]) -> list:
    """A line per job that --max-restarts relaunched: what failed, where it resumed, the
    time the fault cost (bench's own line, lab.report.bench_output.restart_line)."""
    lines = [f"{config_label(r, records)}, {line}" for r in records if (line := restart_line(r))]
    if not lines:
        return []
    return [d.Heading(2, "Runs that restarted"),
            d.Para("Relaunched after a failure (`--max-restarts`), from their last checkpoint "
                   "(`--checkpoint-every`); their figures are their last launch's."),
            d.Items(lines)]


def _analysis(records: list[dict], level: int) -> list:
    a = analysis(records)
    blocks = [d.Heading(level, "Analysis")]
    if a.findings:
        blocks += [d.Heading(level + 1, "Findings"), d.Items(a.findings, numbered=True)]
    blocks += [d.Para(s) for s in a.left_out]
    if a.ranking:
        blocks += [d.Heading(level + 1, "Scaling, ranked"),
                   d.Table(RANKING_HEADERS, a.ranking, [
                       "Ranked: the configurations that learned and ran without oversubscription, "
                       "by efficiency at each worker count. Compute is the 1-worker step; "
                       "communication is what the step gained with more workers (communication "
                       "and waiting); ratio is compute to communication."])]
    if a.rest:
        blocks += [d.Heading(level + 1, "Compression and runs that did not finish"), d.Items(a.rest)]
    return blocks


def render(records: list[dict], images: list[str], source: str) -> str:
    """The report as Markdown."""
    return markdown.render(document(records, images, source))


def formats(flag: str) -> tuple[str, ...]:
    """--format's value ('md', 'html' or 'md,html') as the formats to write: Markdown
    always, HTML beside it when asked."""
    asked = [f.strip().lower() for f in str(flag).split(",") if f.strip()]
    unknown = [f for f in asked if f not in FORMATS]
    if unknown or not asked:
        raise ReportError(f"--format {flag!r} is not a report format: give md or html (html "
                          f"writes report.html, one page with the curves embedded, beside report.md)")
    return tuple(f for f in FORMATS if f == "md" or f in asked)


def write_files(path: str, format: str = "md", sources: list[str] | None = None) -> list[Path]:
    """report.md, and report.html beside it with format 'html'; the curves as PNG files
    (written, not returned), into `path`. The records are those under `path`, or under each
    of `sources` (run folders) when given. Returns the report files written."""
    wanted = formats(format)
    records = [r for s in sources for r in load(s)] if sources else load(path)
    out_dir = Path(path)
    images = curves.plot(records, out_dir)
    where = ", ".join(Path(s).name for s in sources) if sources else str(path)
    sweeps = model_inputs.load_sweeps(*(sources or [path]))
    blocks = document(records, images, where, sweeps)
    written = [out_dir / "report.md"]
    written[0].write_text(markdown.render(blocks))
    prediction.write_json(records, out_dir, sweeps)
    if "html" in wanted:
        written.append(out_dir / "report.html")
        written[1].write_text(html.render(blocks, out_dir))
    return written


def write(path: str) -> Path:
    """report.md and its curves; returns report.md's path."""
    return write_files(path)[0]
