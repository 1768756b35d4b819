"""Where the cost model's predicted terms come from, apart from the step they predict
(lab.report.prediction uses them):

- the compute slowdown at N ranks on S servers: N x the compute ceiling of one process
  over that of N processes placed as the ranks are (`bench --ceiling`, figures.ceiling),
  from any run of the same model, input, batch, threads, precision, device and place
  (the ceiling runs no framework, so every configuration of a sweep shares it). A row
  whose N-process ceiling no run measured is not predicted: the report says so and names
  the flag that measures it. The row's own step parts give only the "explained" figure;
- the contention beyond the ceiling (the framework's threads and waits sharing the
  ranks' cores): the median ratio of step-part slowdown to ceiling slowdown over the
  other configurations at the same ranks of the same framework and model (contention);
  where the framework ran the model nowhere else, the other frameworks' on the model
  times the framework's ratio to theirs on the configurations of other models that both
  ran (_scaled: framework and model multiply);
- waiting for the slowest rank: the median of the mean waits that the other
  configurations measured at the same ranks, of the same framework first, scaled so
  where it never ran the model (others_wait);
- the collective's points: the runs' own probes (figures.collective_alone) and the size
  sweeps `invoke doctor --save FOLDER` stores (SWEEP_FILE): torch.distributed's Gloo
  sweep (DDP's back end, on this machine or in the image, and across the cluster's nodes
  on its shaped link) and Horovod's over MPI.

Standard library only."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from lab.report import step_parts, summary

SWEEP_FILE = "doctor-collectives.jsonl"
# doctor's sweeps through Horovod (envcheck.stack), each under mpirun: the back end each times.
HOROVOD_SWEEPS = {"collectives_mpi": "mpi", "collectives_ccl": "ccl"}
SWEEP_OP = "allreduce"          # the op the data-parallel step's fit is made of


def compute_key(record: dict) -> tuple:
    """What a compute ceiling depends on: the model, its input and batch, the threads,
    precision and device, where it ran and the stack (not the framework: it runs none)."""
    c = record.get("config", {})
    return (c.get("model"), c.get("data"), c.get("batch_size"), c.get("threads"), c.get("precision"),
            c.get("device"), summary.place(record), summary.stack(record))


def ceilings(records: list[dict]) -> dict[tuple, float]:
    """(compute_key, processes, servers) -> the median images per second of every ok
    record's compute ceiling there (figures.ceiling, all the processes together)."""
    found: dict[tuple, list[float]] = {}
    for r in records:
        c = (r.get("figures") or {}).get("ceiling") if r.get("status") == "ok" else None
        if c and c.get("images_per_s"):
            key = (compute_key(r), c.get("processes", r["world"]["np"]), r["world"]["nodes"])
            found.setdefault(key, []).append(c["images_per_s"])
    return {k: statistics.median(v) for k, v in found.items()}


def ceiling_slowdown(record: dict, np: int, servers: int, table: dict) -> float | None:
    """N x the 1-process ceiling over the N-process one on `servers` servers (table:
    ceilings()); None where either is missing."""
    key = compute_key(record)
    one, many = table.get((key, 1, 1)), table.get((key, np, servers))
    return np * one / many if one and many else None


def no_ceiling(np: int, servers: int) -> str:
    """Why a row is not predicted without its ceiling, in one sentence."""
    where = f"{servers} servers" if servers > 1 else "1 server"
    return (f"no compute ceiling of this model, batch and place at 1 process and at {np} processes on "
            f"{where} (`invoke bench --ceiling` measures it beside each run)")


def mean_wait(row: dict) -> float | None:
    """What the ranks waited in the collective for the slowest (seconds): in each record the
    mean over its ranks (each rank's mean over its typical steps), the median over repeats.
    The mean, not the most: rank i joins at a_i and waits max(a) - a_i, so the step, the
    last one's arrival plus the collective, is the ranks' mean arrival (the mean compute)
    plus their mean wait plus the collective."""
    waits = [statistics.fmean(x["parts_s"]["waiting"] for x in ranks) for r in row.get("records") or []
             if (ranks := [x for x in ((r.get("figures") or {}).get("step_parts") or {}).get("ranks") or []
                           if x.get("parts_s")])]
    return statistics.median(waits) if waits else None


def framework_key(record: dict) -> tuple:
    """(framework, the back end it ran: Horovod's controller where it records one)."""
    c = record.get("config", {})
    return c.get("framework"), record["world"].get("controller") or c.get("backend")


def _framework(row: dict) -> tuple:
    return framework_key(row["record"])


def others_wait(row: dict, rows: list[dict]) -> tuple[float | None, str | None]:
    """(the median of mean_wait over the other rows (other configurations) at the row's
    ranks, from whom): those of its framework and back end, compute key and servers where
    any measured it, else of its framework and back end and model (any place and servers),
    else the other frameworks' at its compute key and servers scaled by its framework's
    ratio to theirs on other models (_scaled), else of its compute key and servers (any
    framework); (None, None) where none measured it. The framework first: how long the ranks wait for the slowest is its threads' doing
    as much as the model's (Horovod over Gloo's ResNet-50 ranks waited 1.4 to 4 times DDP's
    on one server in the model benchmark's two runs: docs/pages/report.md)."""
    mine, key = summary.group_key(row["record"]), compute_key(row["record"])
    near = [(r, w) for r in rows if r.get("runs") and summary.group_key(r["record"]) != mine
            and r["np"] == row["np"] and (w := mean_wait(r)) is not None]
    here = lambda r: compute_key(r["record"]) == key and r["servers"] == row["servers"]  # noqa: E731
    for how, pick in (("its framework, model, place and servers", lambda r: _framework(r) == _framework(row)
                       and here(r)),
                      ("its framework and model", lambda r: _framework(r) == _framework(row)
                       and compute_key(r["record"])[:6] == key[:6])):
        waits = [w for r, w in near if pick(r)]
        if waits:
            return statistics.median(waits), how
    scaled = _scaled(row, near, here)
    if scaled is not None:
        return scaled, SCALED
    waits = [w for r, w in near if here(r)]
    return (statistics.median(waits), "its model, place and servers") if waits else (None, None)


SCALED = "other frameworks on its model, scaled by its framework's ratio to theirs on other models"  # a `how`


def _scaled(row: dict, values: list[tuple[dict, float]], here) -> float | None:
    """Where the row's framework measured nothing on its model: for each other framework
    or back end G that measured it (rows `here` picks), G's median there times the median,
    over the configurations of the other models that both ran (same compute key, servers
    and link), of the row's framework's value over G's (framework and model taken to
    multiply); the median over the G that have both. None without any."""
    fw, model = _framework(row), compute_key(row["record"])[:6]

    def by_config(framework: tuple) -> dict[tuple, float]:
        found: dict[tuple, list[float]] = {}
        for r, v in values:
            if _framework(r) == framework and compute_key(r["record"])[:6] != model:
                link = (r["record"].get("config", {}).get("link") or "") if r["servers"] > 1 else ""
                found.setdefault((compute_key(r["record"]), r["servers"], link), []).append(v)
        return {k: statistics.median(v) for k, v in found.items()}
    mine, out = by_config(fw), []
    for g in sorted({_framework(r) for r, _ in values} - {fw}, key=str):
        there, theirs = [v for r, v in values if _framework(r) == g and here(r)], by_config(g)
        ratios = [mine[k] / theirs[k] for k in sorted(mine.keys() & theirs.keys(), key=str) if theirs[k] > 0]
        if there and ratios:
            out.append(statistics.median(there) * statistics.median(ratios))
    return statistics.median(out) if out else None


def explained_slowdown(row: dict, one: dict) -> float | None:
    """The row's own compute parts (forward, backward, optimizer, other) over its 1-worker
    row's: what explains its step, never a prediction of it; where a record's note says a
    part holds some of the exchange, the backward is left out of both."""
    parts, parts_one = step_parts.of_row(row), step_parts.of_row(one)
    if not (parts and parts_one):
        return None
    noted = any(((r.get("figures") or {}).get("step_parts") or {}).get("note")
                for r in row["records"] + one["records"])
    keys = [k for k in step_parts.COMPUTE if not (noted and k == "backward")]
    one_s = sum(parts_one[k] for k in keys)
    return sum(parts[k] for k in keys) / one_s if one_s > 0 else None


def contention(row: dict, measured: list[tuple[dict, float]]) -> tuple[float, str | None]:
    """(the compute's slowdown beyond the ceiling's, from whom): the median of `measured`'s
    ratios (each another row's explained_slowdown over its ceiling_slowdown) over the other
    configurations at the row's ranks of its framework and back end and its model (input,
    batch, threads, precision, device; any place and servers) where any, else the other
    frameworks' on its model scaled by its framework's ratio to theirs on other models
    (_scaled), else of its framework and back end, else all; (1, None) without. Carried along the framework and
    the model, not the place: the framework's threads and waits sharing the ranks' cores
    are what it measures, and they grow with the model's step."""
    mine, model = summary.group_key(row["record"]), compute_key(row["record"])[:6]
    near = [(r, v) for r, v in measured if summary.group_key(r["record"]) != mine and r["np"] == row["np"]]
    on_model = lambda r: compute_key(r["record"])[:6] == model  # noqa: E731
    values = [v for r, v in near if _framework(r) == _framework(row) and on_model(r)]
    if values:
        return statistics.median(values), "its framework and model"
    scaled = _scaled(row, near, on_model)
    if scaled is not None:
        return scaled, SCALED
    for how, pick in (("its framework", lambda r: _framework(r) == _framework(row)), ("others", lambda r: True)):
        values = [v for r, v in near if pick(r)]
        if values:
            return statistics.median(values), how
    return 1.0, None


# doctor's sweeps


def sweep_entries(checks: list[dict], link: str = "") -> list[dict]:
    """What `invoke doctor` measured of the collectives' cost, as the fit reads it: one
    entry per passed sweep of doctor's checks (envcheck.collectives' value), keyed as the
    records' fits are (lab.report.prediction.fit_key): torch.distributed's Gloo is DDP's
    back end, Horovod's sweeps run over MPI and oneCCL; where it ran (the check's: local processes or
    the image), across the nodes the cluster and its `link`."""
    out = []
    for c in checks:
        v = c.get("value") if c.get("status") == "PASS" else None
        rows = (v or {}).get("ops", {}).get(SWEEP_OP) if isinstance(v, dict) else None
        if not rows or c.get("name") not in ("collectives", *HOROVOD_SWEEPS, "collectives_across"):
            continue
        across = c["name"] == "collectives_across"
        framework, backend = (("horovod", HOROVOD_SWEEPS[c["name"]]) if c["name"] in HOROVOD_SWEEPS
                              else ("ddp", v.get("backend")))
        if backend not in ("gloo", "mpi", "ccl"):
            continue        # NCCL's sweep: no CPU back end of the kit's runs
        out.append({"framework": framework, "backend": backend,
                    "place": "cluster" if across else ("image" if c.get("where", "").startswith("image")
                                                       else "local"), "across": across,
                    "link": link if across else "", "ranks": v.get("ranks"),
                    **({"cycle_time_ms": v["cycle_time_ms"]} if "cycle_time_ms" in v else {}),
                    "points": [{"op": SWEEP_OP, "size_bytes": p["size_bytes"], "ranks": v.get("ranks"),
                                "time_s": p["time_us"] / 1e6} for p in rows if p.get("time_us")]})
    return out


def save_sweeps(entries: list[dict], folder: str) -> Path | None:
    """Append doctor's sweeps to FOLDER/SWEEP_FILE (where the report finds them); None
    where there is none to save."""
    if not entries:
        return None
    path = Path(folder) / SWEEP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for e in entries:
            f.write(json.dumps(e) + "\n")
    return path


def load_sweeps(*folders: str) -> list[dict]:
    """Every sweep stored in each folder, the run folders under it and the folder above
    it (results/, where `invoke doctor --save results` puts it); unreadable lines skipped."""
    files: set[Path] = set()
    for folder in folders:
        p = Path(folder)
        files |= {f for f in (p / SWEEP_FILE, p.parent / SWEEP_FILE, *p.glob(f"*/{SWEEP_FILE}")) if f.is_file()}
    out = []
    for f in sorted(files):
        for line in f.read_text().splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict) and e.get("points"):
                out.append(e)
    return out


def sweep_key(entry: dict) -> tuple:
    """The fit_key of the runs a sweep's cost is theirs."""
    return (entry["framework"], entry["backend"], entry["place"], bool(entry["across"]),
            entry.get("link", "") if entry["across"] else "")
