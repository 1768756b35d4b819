"""What `invoke bench` prints when it is done: the results table of its records (what
did not run listed once per reason under it), the jobs relaunched after a failure, each run against the compute ceiling
measured around it (figures.ceiling), and where the records are."""
from __future__ import annotations

import os

from lab.common import display, results
from lab.report import summary, tables


def ceiling_line(r: dict) -> str | None:
    c = r.get("figures", {}).get("ceiling")
    if not c or r.get("status") != "ok":
        return None
    n, t = r["world"]["np"], r["figures"]["throughput_img_s"]
    shape = "x".join(map(str, c["input"])) if c.get("input") else "?"
    where = f" over {', '.join(c['hosts'])}" if c.get("hosts") else ""
    rep = r.get("config", {}).get("repeat", 0)
    return (f"np={n}" + (f", {r['world'].get('nodes', 1)} node(s)" if r["world"].get("nodes", 1) > 1 else "")
            + (f", repeat {rep + 1}" if rep else "")
            + f": {t:,.4g} images/s = {t / c['images_per_s']:.0%} of the compute ceiling, "
            f"{c['images_per_s']:,.4g} images/s (the model's steps on {shape} input, "
            f"{c.get('classes', '?')} classes, with no framework in {n} independent process(es)"
            f"{where}; {c['before']:,.4g} before the run, {c['after']:,.4g} after)")


def restart_line(r: dict) -> str | None:
    """A job relaunched by --max-restarts: how it ended, and per relaunch what failed,
    the step it resumed from and the time the fault cost (record's restarts)."""
    relaunches = r.get("restarts")
    if not relaunches:
        return None
    rep = r.get("config", {}).get("repeat", 0)
    each = [f"{(e.get('error') or {}).get('reason', 'a failure')}, resumed from step "
            f"{e.get('resumed_from_step')}" + (f" ({e['lost_s']:.1f} s lost)" if e.get("lost_s") is not None
                                               else "") for e in relaunches]
    return (f"np={r['world']['np']}" + (f", repeat {rep + 1}" if rep else "")
            + f": {r.get('status')} after {len(relaunches)} relaunch(es): " + "; ".join(each))


def checkpoint_line(r: dict) -> str | None:
    """--checkpoint-every's overhead in a run: the checkpoints its (last) launch wrote, the
    seconds each took (every rank waiting) and their share of that launch's training loop
    (figures.checkpoints: written, total_s, share)."""
    c = (r.get("figures") or {}).get("checkpoints")
    if not c or r.get("status") != "ok":
        return None
    rep = r.get("config", {}).get("repeat", 0)
    n = c["written"]
    each = f"{c['total_s'] / n:.3f} s each" if n else "none"
    share = f", {c['share']:.1%} of the run" if c.get("share") is not None else ""
    last = " (its last launch)" if r.get("restarts") else ""
    return (f"np={r['world']['np']}" + (f", repeat {rep + 1}" if rep else "")
            + f": checkpoints{last}: {n} written, {each}{share}")


def render(records: list[dict], run_dir: str, width: int | None = None) -> str:
    """The table of the runs that ran (a failed one with its reason as a numbered note),
    then what did not run, once per reason (lab.report.tables.not_run), the ceilings and
    where the records are; fitted to a terminal's `width` (None: as wide as they are)."""
    ran = [r for r in records if r.get("status") != "skipped"]
    lines = [summary.render(summary.rows(ran), width)] if ran else []
    skipped = tables.not_run(records)
    if skipped:
        lines.append("not run:\n" + "\n".join(f"- {line}" for line in skipped))
    lines += [line for line in map(restart_line, records) if line]
    lines += [line for line in map(checkpoint_line, records) if line]
    lines += [line for line in map(ceiling_line, records) if line]
    lines.append(f"records: {os.path.join(run_dir, results.RESULTS_FILE)}")
    table = lines[:1] if ran else []
    return "\n".join(table + [display.wrap(ln, width) for text in lines[len(table):] for ln in text.split("\n")])


def startup_table(records: list[dict]) -> str:
    """`invoke bench --profile-startup`: each run's start-up, seconds by phase, from the
    command (in a sweep: the previous launch's end) to the first timed step — the host's
    phases (figures.startup_host_s), then the slowest rank's (figures.startup_phases_s)."""
    from tabulate import tabulate
    rows, head = [], []
    for r in records:
        f = r.get("figures") or {}
        if r.get("status") != "ok" or not f.get("startup_phases_s"):
            continue
        host = f.get("startup_host_s") or {}
        ranks = f["startup_phases_s"]
        rep = r.get("config", {}).get("repeat", 0)
        phases = [*host, *ranks]            # in the order they happen, as recorded
        head = head if len(head) > len(phases) else ["run", *phases, "total"]
        rows.append([f"np {r['world']['np']}" + (f", repeat {rep + 1}" if rep else ""),
                     *host.values(), *ranks.values(), f.get("startup_total_s", f.get("startup_s"))])
    if not rows:
        return "start-up: no run recorded its start-up"
    return "start-up, seconds by phase (command to the first timed step):\n" + tabulate(
        rows, headers=head, floatfmt=".2f", missingval="-")
