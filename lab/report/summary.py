"""The results table of the lab report (back end, servers, devices per server, time per
step, throughput, speedup), computed from records alone."""
from __future__ import annotations

import statistics

from lab.common import display, metrics, options, stats
from lab.report import markdown

COLUMNS = ("model", "framework", "back end", "compression", "servers", "devices per server", "np",
           "time per step (ms)", "throughput (img/s)", "speedup", "efficiency", "accuracy")

# Fields that make two runs "the same configuration" apart from the number of processes;
# and the strategy, as strategy_name gives it: the fields that set a strategy apart, with
# their defaults (micro_batches 0 is 4), and none of those that do not apply to it.
_SAME = (*options.SETUP_FIELDS, "framework", "backend", "compression")


def accuracy(record: dict) -> float | None:
    """The test accuracy, or None on synthetic data: random labels have nothing to learn,
    so a figure near 10% there means nothing."""
    if record.get("config", {}).get("data") == "synthetic":
        return None
    return record["figures"]["test_accuracy"]


def strategy_name(config: dict) -> str:
    """How a run spread its work, as the tables name it: 'ddp' for the frameworks' data
    parallelism (records made before strategies existed included), else the strategy with
    what sets it apart: 'pipeline (gpipe, 4 micro-batches)', 'deepspeed (ZeRO 1)'."""
    s = config.get("strategy") or "ddp"
    if s == "pipeline":
        return f"pipeline ({config.get('schedule', 'gpipe')}, {config.get('micro_batches') or 4} micro-batches)"
    if s == "rpc-pipeline":
        return f"rpc-pipeline ({config.get('micro_batches') or 4} micro-batches)"
    if s == "deepspeed":
        return f"deepspeed (ZeRO {config.get('zero_stage', 0)})"
    return s


def place(record: dict) -> str | None:
    """Where the ranks ran (world.place, bench's runner: local, image, cluster, ...);
    records made before bench wrote it: the image when the manifest names one, else
    local processes; None when the record says neither (a skipped run)."""
    w, m = record.get("world", {}), record.get("manifest")
    if w.get("place"):
        return w["place"]
    if isinstance(m, dict):
        return "image" if (m.get("image") or {}).get("id") else "local"
    return None


def stack(record: dict) -> str | None:
    """The ranks' torch, with its build (2.9.0+cpu, 2.9.0+cu130); None when not recorded."""
    m = record.get("manifest")
    return m.get("torch") if isinstance(m, dict) else None


def config_key(record: dict) -> tuple:
    """The configuration, where it ran and its stack: runs of one run folder made in
    different places (local processes and the image) or stacks are never one row."""
    c = record.get("config", {})
    # a setup field a record lacks (written before its option existed) is its default
    return (*(c.get(k, options.BY_NAME[k].value) for k in _SAME), strategy_name(c), place(record),
            stack(record))


def group_key(record: dict) -> tuple:
    """Runs that are repeats of one another: the same configuration, process count,
    servers and link, and the cluster's nodes with cores of their own or not
    (world.node_cores)."""
    return (config_key(record), record["world"]["np"], record["world"]["nodes"],
            record.get("config", {}).get("link", "") or "", bool(record["world"].get("node_cores")))


def rows(records: list[dict]) -> list[dict]:
    """One row per configuration and process count (its repeats together: the median,
    and its spread in "throughput" and "speedup", lab.common.stats), in the order the
    records first appear; a failed or skipped record is a row of its own. Speedup and
    efficiency are against the one-process runs of the same configuration: the ratio of
    the medians, its interval carried through."""
    good = [r for r in records if r.get("status") == "ok"]
    groups: dict[tuple, list[dict]] = {}
    for r in good:
        groups.setdefault(group_key(r), []).append(r)
    baselines: dict[tuple, list[float]] = {}
    for r in good:
        if r["world"]["np"] == 1:
            baselines.setdefault(config_key(r), []).append(r["figures"]["throughput_img_s"])
    out, done = [], set()
    for r in records:
        c = r.get("config", {})
        row = {"strategy": strategy_name(c), "model": c.get("model"), "framework": c.get("framework"),
               "back end": c.get("backend"), "compression": c.get("compression"),
               "precision": c.get("precision") or "fp32", "np": r["world"]["np"], "record": r,
               "compiled": bool(c.get("compile"))}
        if r.get("status") != "ok":
            row.update({"servers": r["world"]["nodes"], "devices per server": None,
                        "failed": r.get("error", {}).get("reason", "failed"),
                        "status": r.get("status", "failed"), "records": [r]})
            out.append(row)
            continue
        key = group_key(r)
        if key in done:
            continue
        done.add(key)
        runs = groups[key]
        tput = [x["figures"]["throughput_img_s"] for x in runs]
        thr = stats.summarize(tput)
        accs = [accuracy(x) for x in runs]
        row.update({"servers": r["world"]["nodes"], "devices per server": r["world"]["devices_per_node"],
                    "records": runs, "runs": len(runs),
                    "time per step (ms)": statistics.median(
                        x["figures"]["step_time_mean_s"] for x in runs) * 1000,
                    "throughput (img/s)": thr.median, "throughput_summary": thr,
                    "accuracy": None if None in accs else statistics.median(accs),
                    "compile (s)": compile_seconds(runs),
                    "noisy": thr.relative_spread if stats.noisy(tput) else None})
        base = baselines.get(config_key(r))
        if base and r["world"]["np"] == 1:
            # The baseline itself: 1 by definition (its spread is in its throughput).
            sp = stats.Summary(len(runs), 1.0, 1.0, 1.0, "baseline")
            row["speedup"], row["speedup_summary"] = 1.0, sp
            row["efficiency"] = 1.0
        elif base:
            sp = stats.ratio(tput, base)
            row["speedup"], row["speedup_summary"] = sp.median, sp
            row["efficiency"] = metrics.efficiency(sp.median, r["world"]["np"])
        out.append(row)
    return out


def compile_seconds(runs: list[dict]) -> float | None:
    """--compile: the median of the runs' compiler seconds (figures.compile_s); None for
    eager runs."""
    seconds = [x["figures"]["compile_s"] for x in runs if x["figures"].get("compile_s") is not None]
    return statistics.median(seconds) if seconds else None


def _num(v: float, col: str) -> str:
    if col == "throughput (img/s)":
        return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"
    if col == "speedup":
        return f"{v:.2f}"
    return f"{v:.0%}"


def with_spread(row: dict, col: str) -> str:
    """The median, then its spread in brackets when there are repeats; * marks a noisy row."""
    v = row.get(col)
    if v is None:
        return "n/a"
    summ = row.get({"throughput (img/s)": "throughput_summary", "speedup": "speedup_summary",
                    "efficiency": "speedup_summary"}[col])
    scale = 1 / row["np"] if col == "efficiency" else 1
    text = _num(v, col)
    if summ is not None and summ.n > 1 and summ.kind != "baseline":
        text += f" ({_num(summ.low * scale, col)}-{_num(summ.high * scale, col)})"
    if col == "throughput (img/s)" and row.get("noisy"):
        text += " *"
    return text


def footnotes(table_rows: list[dict]) -> list[str]:
    """What the brackets mean and which rows are noisy, for under a table."""
    out = []
    kinds = sorted({r["throughput_summary"].kind for r in table_rows
                    if r.get("throughput_summary") is not None and r["throughput_summary"].n > 1})
    if kinds:
        ns = sorted({r["runs"] for r in table_rows if r.get("runs", 1) > 1})
        out.append(f"Figures are medians of {'/'.join(map(str, ns))} repeated runs; in brackets "
                   + " or ".join({"min-max": "the lowest and highest run (fewer than "
                                             f"{stats.BOOTSTRAP_FROM} repeats)",
                                  "95% bootstrap": "a 95% bootstrap interval of the median"}[k]
                                 for k in kinds)
                   + "; a speedup's interval is carried through from both medians' runs.")
    for r in table_rows:
        if r.get("noisy"):
            summ = r["throughput_summary"]
            out.append(f"* {r['framework']} over {r['back end']}, {r['compression']}, np {r['np']}: "
                       f"its {summ.n} runs differ by {r['noisy']:.0%} of their median "
                       f"(more than {stats.NOISY:.0%}: the machine's speed, or where its scheduler put the ranks, changed between them), "
                       f"so read this row as noise-prone.")
    return out


def render(table_rows: list[dict], width: int | None = None) -> str:
    """The results table in Markdown (the report's), or, given a terminal's `width`
    (lab.common.display.width), narrowed by column to fit it, its notes wrapped."""
    repeated = any(r.get("runs", 1) > 1 for r in table_rows)
    strategies = any(r.get("strategy", "ddp") != "ddp" for r in table_rows)
    columns = (("strategy",) if strategies else ()) + COLUMNS + (("runs",) if repeated else ())
    if any(r.get("precision", "fp32") != "fp32" for r in table_rows):     # else every row is fp32
        at = columns.index("compression") + 1
        columns = columns[:at] + ("precision",) + columns[at:]
    if any(r.get("compiled") for r in table_rows):     # else every row ran eagerly
        at = columns.index("time per step (ms)")
        columns = columns[:at] + ("compile (s)",) + columns[at:]

    # A run that did not finish: its status in the row, its reason a numbered note under
    # the table (no cell holds a sentence).
    reasons = {id(r): i for i, r in enumerate((r for r in table_rows if "failed" in r), 1)}

    def cell(row, col):
        if "failed" in row and col not in ("strategy", "model", "framework", "back end", "compression",
                                           "precision", "np", "servers"):
            if col != "time per step (ms)":
                return ""
            return f"{row.get('status', 'failed').upper()} [{reasons[id(row)]}]"
        if "failed" in row and col == "servers":
            return "" if row.get("servers") is None else str(row["servers"])
        if col in ("throughput (img/s)", "speedup", "efficiency"):
            return with_spread(row, col)
        v = row.get(col)
        if v is None:
            return {"accuracy": "n/a", "compile (s)": "eager"}.get(col, "")
        if col == "time per step (ms)":
            return f"{v:.2f}"
        if col == "accuracy":
            return f"{v:.1%}"
        if col == "compile (s)":
            return f"{v:.1f}"
        return str(v)

    cells = [[cell(r, c) for c in columns] for r in table_rows]
    table = markdown.table(columns, cells) if width is None else display.table(list(columns), cells, width)
    notes = [f"[{reasons[id(r)]}] {r['failed']}" for r in table_rows if "failed" in r]
    notes += footnotes(table_rows)
    return table + ("\n\n" + "\n".join(display.wrap(n, width) for n in notes) if notes else "")
