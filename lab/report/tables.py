"""The report's tables, each built from the records by a pure function (the template's
environment table is lab.report.environment's): the within-server and across-server results, gradient compression,
and the combinations that did not run, grouped by their reason. No cell holds a
sentence: a failure's reason is a numbered note under its table (document.Notes)."""
from __future__ import annotations

from collections import defaultdict

from lab.common import stats
from lab.common.config import COMPRESSIONS
from lab.report import summary
from lab.report.document import Notes
from lab.report.records import (
    link_label,
    median_record,
    ok,
    oversubscribed,
    oversubscription_text,
    setup_key,
    setup_label,
    stack_name,
)

OVERSUBSCRIBED_MARK = "†"


RESULT_HEADERS = ["framework / back end", "servers", "devices/server", "workers", "step time (ms)",
                  "throughput (img/s)", "speedup", "efficiency", "accuracy", "runs"]


# What a run's config.device measured, as the note under a table says it.
DEVICE_WORDS = {"cuda": "GPUs, one per rank", "cpu": "CPU processes"}


def devices_note(shown: list[dict], records: list[dict]) -> list[str]:
    """The line under a table saying which devices its runs measured, where the records
    hold runs of more than one (a one-GPU lab: np 1 on the GPU, 2 ranks on CPU processes
    beside it); [] where every run used one kind, or the table shows none."""
    def devices(rs):
        return {r.get("config", {}).get("device", "cpu") for r in ok(rs)}
    if len(devices(records)) < 2:
        return []
    mine = [DEVICE_WORDS.get(d, d) for d in sorted(devices(shown), key=lambda d: d != "cuda")]
    if not mine:
        return []
    return [f"Devices: {' and '.join(mine)}" + (" (the label of a row names its device where "
                                                  "its setup alone tells it apart)" if len(mine) > 1 else "") + "."]


def failure_note(r: dict) -> str:
    """A failed run's note: the status, the rank and host when known, the reason."""
    e = r.get("error") or {}
    where = ", ".join(x for x in (f"rank {e['rank']}" if e.get("rank") is not None else "",
                                  f"on {e['host']}" if e.get("host") else "") if x)
    return f"failed{' (' + where + ')' if where else ''}: {e.get('reason') or 'no reason recorded'}"


def row_oversubscribed(row: dict) -> bool:
    return any(oversubscribed(r) for r in row.get("records", [row["record"]]))


def result_rows(records: list[dict], across: bool, notes: Notes | None = None) -> list[list]:
    """The template's results table (back end, servers, devices per server, time per
    step, throughput, speedup) plus efficiency and accuracy, for runs within one server
    or across servers. A failed run is a row whose time cell points at a numbered note
    with its reason; a skipped combination is no row (`not_run` lists it); an
    oversubscribed row's workers carry a mark."""
    notes = notes if notes is not None else Notes()
    rows = []
    mixed = across and len(node_cores_kinds(records)) == 2
    for row in summary.rows(records):
        rec = row["record"]
        nodes = rec["world"]["nodes"]
        if (nodes > 1) != across or row.get("status") == "skipped":
            continue
        label = setup_label(rec, records) + f"{row['framework']} / {row['back end']}" + (
            f" / {row['compression']}" if row.get("compression") not in (None, "none") else "") + link_label(rec)
        if mixed and rec["world"].get("place") == "cluster":
            label += " (own cores)" if rec["world"].get("node_cores") else " (shared cores)"
        if "failed" in row:
            rows.append([label, nodes, "", row["np"], f"failed {notes.add(failure_note(rec))}",
                         "", "", "", "", 1])
            continue
        workers = f"{row['np']} {OVERSUBSCRIBED_MARK}" if row_oversubscribed(row) else row["np"]
        rows.append([label, row["servers"], row["devices per server"], workers,
                     f"{row['time per step (ms)']:.2f}", summary.with_spread(row, "throughput (img/s)"),
                     summary.with_spread(row, "speedup"), f"{row['efficiency']:.0%}"
                     if row.get("efficiency") is not None else "n/a",
                     "n/a" if row.get("accuracy") is None else f"{row['accuracy']:.2%}",
                     row.get("runs", 1)])
    return rows


def result_marks(records: list[dict], across: bool) -> list[str]:
    """The lines under a results table that explain its marks: what the brackets are,
    `*` (runs that disagree) and the oversubscription mark, each said once."""
    table = [row for row in summary.rows(records) if "failed" not in row
             and (row["record"]["world"]["nodes"] > 1) == across]
    out = summary.footnotes(table)[:1]
    noisy = [row for row in table if row.get("noisy")]
    if noisy:
        out.append(f"Rows marked * ({len(noisy)} of {len(table)}): their runs differ by more than "
                   f"{stats.NOISY:.0%} of their median (the machine's speed, or where its scheduler put the ranks, changed between them); "
                   f"read them as noise-prone.")
    over = [row for row in table if row_oversubscribed(row)]
    if over:
        what = "; ".join(sorted({oversubscription_text(r) for row in over for r in row["records"]
                                 if oversubscribed(r)}))
        out.append(f"Rows marked {OVERSUBSCRIBED_MARK} ran oversubscribed ({what}): more busy threads "
                   f"than cores, so their time per step measures ranks sharing cores; the analysis "
                   f"does not read them as scaling.")
    return out + (node_cores_marks(table) if across else [])


def _across_cluster(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("status") == "ok" and r.get("world", {}).get("place") == "cluster"
            and r["world"].get("nodes", 1) > 1]


def node_cores_kinds(records: list[dict]) -> set[bool]:
    """Whether the ok runs across the simulated cluster's nodes had cores of their own
    (world.node_cores): {True}, {False}, both or none."""
    return {bool(r["world"].get("node_cores")) for r in _across_cluster(records)}


def node_cores_marks(table: list[dict]) -> list[str]:
    """Under the table across servers: whether the simulated cluster's nodes had cores of
    their own during its runs (world.node_cores) or shared the machine's, each said once;
    where both, which rows (result_rows marks them)."""
    runs = _across_cluster([r for row in table for r in row["records"]])
    own = sorted({", ".join(f"{h} {c}" for h, c in r["world"]["node_cores"].items())
                  for r in runs if r["world"].get("node_cores")})
    shared = [r for r in runs if not r["world"].get("node_cores")]
    why = "so where the scheduler put the ranks changed their time (docs/pages/cluster.md)"
    if own and shared:
        return [f"Rows marked (own cores) ran with each of the simulated cluster's nodes on cores of its own "
                f"(cpus {'; '.join(own)}), as servers have; rows marked (shared cores) had the nodes share "
                f"the machine's cores, {why}."]
    if own:
        return [f"Across the simulated cluster's nodes each node had cores of its own during the "
                f"runs (cpus {'; '.join(own)}), as servers have."]
    if shared:
        return [f"The runs across the simulated cluster's nodes had the nodes share the machine's cores, {why}."]
    return []


def compression_groups(records: list[dict]) -> dict:
    """(setup, framework, backend, np, nodes) -> {compression: median record}."""
    runs = defaultdict(lambda: defaultdict(list))
    for r in ok(records):
        c = r["config"]
        runs[(setup_key(r), c["framework"], c["backend"], r["world"]["np"],
              r["world"]["nodes"])][c["compression"]].append(r)
    return {k: {comp: median_record(rs) for comp, rs in v.items()} for k, v in runs.items()}


def compression_order(name: str) -> int:
    return COMPRESSIONS.index(name) if name in COMPRESSIONS else len(COMPRESSIONS)


def compression_rows(records: list[dict]) -> list[list]:
    """Per framework, back end and worker count: each compression's time, throughput,
    accuracy and bytes per step, with the saving against uncompressed."""
    groups = compression_groups(records)
    rows = []
    for key in sorted(groups, key=str):
        comps = groups[key]
        label = setup_label(next(iter(comps.values())), records) + f"{key[1]} / {key[2]}"
        if len(comps) < 2:
            continue
        base = comps.get("none")
        for name in sorted(comps, key=compression_order):
            f = comps[name]["figures"]
            payload = f.get("payload_bytes_per_step")
            saving = (f"{1 - payload / base['figures']['payload_bytes_per_step']:.0%}"
                      if base and payload else "n/a")
            rows.append([label, key[3], name, f"{f['step_time_mean_s'] * 1000:.2f}",
                         f"{f['throughput_img_s']:,.0f}",
                         "n/a" if summary.accuracy(comps[name]) is None else f"{f['test_accuracy']:.2%}",
                         "n/a" if payload is None else f"{payload:,}",
                         "n/a" if f.get("wire_bytes_per_step_estimate") is None
                         else f"{f['wire_bytes_per_step_estimate']:,}", saving])
    return rows


COMPRESSION_HEADERS = ["framework / back end", "workers", "compression", "step time (ms)",
                       "throughput (img/s)", "accuracy", "payload (B/step)", "wire (B/step, est.)",
                       "saved"]


def _listing(values) -> str:
    values = [str(v) for v in values]
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]


def run_key(r: dict) -> tuple:
    """A run as asked (its configuration, workers, servers and link), whatever its place:
    a skipped record and a later record of the same run share it."""
    c = r.get("config", {})
    return (summary.config_key(r)[:-2], r["world"]["np"], r["world"]["nodes"], c.get("link") or "")


def skipped_runs(records: list[dict]) -> list[dict]:
    """The runs skipped and never run since (a later sweep or --resume ran them): one
    record each, the last (its reason the latest)."""
    ran = {run_key(r) for r in records if r.get("status") in ("ok", "failed")}
    last = {run_key(r): r for r in records if r.get("status") == "skipped"}
    return [r for k, r in last.items() if k not in ran]


def not_run(records: list[dict]) -> list[str]:
    """The skipped runs (skipped_runs), once each, grouped by their reason: 'DDP over MPI:
    8 combinations (compression none, fp16, int8, int8-naive; 1 and 2 workers): <reason>'."""
    groups: dict = defaultdict(list)
    for r in skipped_runs(records):
        groups[(r.get("error") or {}).get("reason", "no reason recorded")].append(r)
    out = []
    for reason, recs in groups.items():
        stacks = sorted({(r["config"].get("framework"), r["config"].get("backend")) for r in recs})
        comps = sorted({r["config"].get("compression") or "none" for r in recs}, key=compression_order)
        nps = sorted({r["world"]["np"] for r in recs})
        nodes = sorted({r["world"]["nodes"] for r in recs})
        combos = len(recs)
        what = [f"compression {', '.join(comps)}" if len(comps) > 1 else f"compression {comps[0]}",
                f"{_listing(nps)} worker{'s' if nps != [1] else ''}"]
        if nodes != [1]:
            what.append(f"{_listing(nodes)} server{'s' if nodes != [1] else ''}")
        out.append(f"{_listing(stack_name(f, b) for f, b in stacks)}: {combos} combination"
                   f"{'s' if combos != 1 else ''} ({'; '.join(what)}): {reason}")
    return out
