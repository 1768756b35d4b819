"""What a run writes into the request's results file beside the ranks' own records: the
runs skipped (with their reason), a failed or interrupted launch, and the facts only
the host knows, added onto the records a launch wrote (where its ranks ran and whether
they were oversubscribed, the host's start-up phases, the compute ceiling around it, a
scheduler's final state)."""
from __future__ import annotations

import dataclasses
import os

from lab.common import results
from lab.common.config import RunConfig
from lab.host.places.launch import resolve_framework
from lab.host.request.plan import Plan, label
from lab.host.settings import base_config


def skip(plan: Plan, left: list, reason: str, skipped: set, progress, echo) -> None:
    """The runs `left` (one combination's, from this repeat on) skipped: said once, and
    recorded once per process count (`progress`: bench's Progress, its total lowered)."""
    base, s = plan.settings, left[0].settings
    rfile = results.run_dir(base.results_dir, base.run_id) / results.RESULTS_FILE
    nps = list(dict.fromkeys(j.np for j in left))
    skipped.update((left[0].combination, n) for n in nps)
    progress.total -= len(left)
    counts = "" if nps == list(s.np) else f" (np {', '.join(map(str, nps))})"
    echo(f"-- skipped {label(s)}{counts}: {reason}")
    os.makedirs(rfile.parent, exist_ok=True)
    for n in nps:      # --resume: not those recorded ok
        # a skipped run's ranks never ran: auto as for a stack not known (ddp)
        framework = resolve_framework(s.framework, {}, s.strategy)[0]
        cfg = dataclasses.replace(base_config(s, framework),
                                  run_id=base.run_id, expected_np=n, link=s.link)
        results.append_record(rfile, results.make_record(
            "skipped", run_id=base.run_id, config=cfg.as_record(), np=n, nodes=s.nodes,
            started_at=results.now_iso(), error={"reason": reason}))


def skip_refused(plan, jobs, refused: dict, progress, echo, skipped: set | None) -> list:
    """`jobs` less the process counts `refused` names: those skipped, said and recorded
    with their reason (skip), for this repeat and
    the plan's later ones."""
    if not refused:
        return jobs
    skipped = set() if skipped is None else skipped
    first = jobs[0]
    by_reason: dict[str, set] = {}
    for np in dict.fromkeys(j.np for j in jobs):
        if np in refused:
            by_reason.setdefault(refused[np], set()).add(np)
    for reason, nps in by_reason.items():
        skip(plan, [j for j in plan.jobs if j.combination == first.combination and j.np in nps
                    and j.repeat >= first.repeat], reason, skipped, progress, echo)
    return [j for j in jobs if j.np not in refused]


def oversubscription(machines: list[tuple[str, int, int]], threads: int) -> tuple[dict, str | None]:
    """The record's world.cores and world.oversubscribed for ranks placed on machines
    (name, ranks, cores), and the one line to print when the ranks' threads exceed a
    machine's cores: its "efficiency" would measure the scheduler, not the scaling."""
    worst = max(machines, key=lambda m: m[1] * threads / max(m[2], 1))
    name, ranks, cores = worst
    over = ranks * threads > cores
    line = None
    if over:
        where = f" on {name}" if name else ""
        line = (f"oversubscribed: {ranks} rank(s) x {threads} thread(s){where} share {cores} core(s); "
                f"their time per step measures the scheduler as much as the training, and the "
                f"report will not read this row as scaling (lower --np or --threads, or add nodes)")
    return {"cores": cores, "oversubscribed": over}, line


def add_world(rfile, before: int, fields: dict) -> None:
    """Facts only bench knows (where the ranks ran), onto the records this launch wrote."""
    def update(rec):
        rec.setdefault("world", {}).update(fields)
        return rec
    results.update_records(rfile, before, update)


def add_startup(rfile, before: int, host: dict) -> None:
    """The host's start-up phases (lab.host.run.startup) onto the records this launch wrote,
    and the whole start-up: from the command (or, in a sweep, the previous launch's end)
    to the first timed step."""
    def update(rec):
        f = rec.get("figures")
        if rec.get("status") != "ok" or f is None:
            return None
        f["startup_host_s"] = host
        if f.get("startup_s") is not None:
            f["startup_total_s"] = round(sum(host.values()) + f["startup_s"], 3)
        return rec
    results.update_records(rfile, before, update)


def add_ceiling(rfile, before: int, cfg: RunConfig, measured: dict) -> None:
    """The ceiling measured around a run, into that run's record (figures.ceiling)."""
    def update(rec):
        if rec.get("status") != "ok" or rec.get("config", {}).get("repeat") != cfg.repeat:
            return None
        rec.setdefault("figures", {})["ceiling"] = measured
        return rec
    results.update_records(rfile, before, update)


def add_scheduler_state(rfile, before: int, facts: dict) -> None:
    """Slurm's final state and exit code onto the records its job's ranks wrote (they
    write before the job ends, so only bench knows them)."""
    def update(rec):
        sched = rec.get("world", {}).get("scheduler")
        if not sched or sched.get("job_id") != facts["job_id"]:
            return None
        sched.update(state=facts.get("state"), exit_code=facts.get("exit_code"))
        return rec
    results.update_records(rfile, before, update)


def record_failure(rfile, cfg: RunConfig, np: int, nodes: int, started: str, error: dict) -> None:
    results.append_record(rfile, results.make_record(
        "failed", run_id=cfg.run_id, config=cfg.as_record(), np=np, nodes=nodes,
        started_at=started, error=error))
