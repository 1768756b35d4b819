"""Where the cost model's terms come from (lab.report.prediction uses them):

- a prediction of a configuration (cost_model.predict_target) takes only what one worker
  measured and doctor's sweeps: one_worker (the 1-worker row's step, backward, steps one
  by one, gradients, settings and cores, and its compute ceiling of one process from
  ceilings: `bench --ceiling`, figures.ceiling), sweep_fit (the back end's collective from
  doctor's sweeps, `invoke doctor --save FOLDER`: SWEEP_FILE) and sweep_check (that fit
  against doctor's sweeps at more ranks). A ceiling measured at N processes only checks
  the prediction (the report shows both);
- the explained figure (the row's own measurements, never a prediction): its compute
  parts' slowdown (explained_slowdown) and its ranks' mean wait (mean_wait).

Standard library only."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from lab.common.link import DELAY, rate_gbs, tbf_burst_bytes
from lab.report import algorithms, step_parts, summary
from lab.report import cost_model as cm

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


def own_cores(record: dict) -> bool:
    """Whether the run's servers had cores of their own (the simulated cluster's pinned
    nodes: world.node_cores): rows with and without never share a term."""
    return bool((record.get("world") or {}).get("node_cores"))


def ceilings(records: list[dict]) -> dict[tuple, float]:
    """(compute_key, processes, servers, own_cores) -> the median images per second of every
    ok record's compute ceiling there (figures.ceiling, all the processes together)."""
    found: dict[tuple, list[float]] = {}
    for r in records:
        c = (r.get("figures") or {}).get("ceiling") if r.get("status") == "ok" else None
        if c and c.get("images_per_s"):
            key = (compute_key(r), c.get("processes", r["world"]["np"]), r["world"]["nodes"], own_cores(r))
            found.setdefault(key, []).append(c["images_per_s"])
    return {k: statistics.median(v) for k, v in found.items()}


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


# What a prediction of a target takes: one worker's run and doctor's sweeps (cost_model.predict_target)


def one_worker(one: dict, ceilings_: dict | None = None) -> cm.OneWorker:
    """cost_model.OneWorker of a 1-worker row (summary.rows'): its median step, its backward
    (step parts), its steps one by one (the repeats' together), its gradients and settings,
    the cores its server had and its compute ceiling of one process (`ceilings_`:
    ceilings(); the ceiling at 1 process of its compute key, None where not measured)."""
    r = one["record"]
    c, f, w = r.get("config", {}), r.get("figures") or {}, r.get("world") or {}
    compute = one["time per step (ms)"] / 1000
    parts = step_parts.of_row(one)
    values = f.get("gradient_values")
    grad = 4.0 * values if values else float(f.get("payload_bytes_per_step") or 0)
    steps = [s for x in one.get("records") or [r] for s in (x.get("step_times_s") or [])]
    hv = w.get("horovod") or {}
    return cm.OneWorker(
        framework=c.get("framework", "ddp"), backend=w.get("controller") or c.get("backend"),
        compute_s=compute, backward_s=compute * parts["backward"] / parts["step"] if parts and parts["step"] else None,
        grad_bytes=grad, payload_bytes=float(f.get("payload_bytes_per_step") or grad),
        op=f.get("collective") or "allreduce", batch=int(c.get("batch_size") or 1), threads=int(c.get("threads") or 1),
        cores=w.get("cores"), step_times_s=steps or None,
        ceiling_img_s=(ceilings_ or {}).get((compute_key(r), 1, 1, own_cores(r))),
        tensors=cm.MODEL_TENSORS.get(c.get("model"), cm.DEFAULT_TENSORS),
        tensor_bytes=[4.0 * v for v in f["gradient_tensors"]] if f.get("gradient_tensors") else None,
        cycle_s=cm.horovod_cycle_s(hv), fusion_bytes=hv.get("fusion_threshold_bytes", cm.HOROVOD_FUSION),
        strategy=c.get("strategy") or "ddp")


def _sweep_points(entry: dict) -> list[dict]:
    """A sweep's points as the fit takes them: Horovod's without the wait for its cycle
    (cost_model.horovod_collective_s; a sweep saved before doctor recorded its cycle time
    ran at the default)."""
    if entry.get("framework") != "horovod":
        return [p for p in entry["points"] if p.get("time_s")]
    cycle = cm.horovod_cycle_s(entry)
    return [{**p, "time_s": cm.horovod_collective_s(p["time_s"], cycle), "timed_s": p["time_s"]}
            for p in entry["points"] if p.get("time_s")]


def sweep_place(place: str | None, across: bool) -> str | None:
    """Where a sweep for ranks at `place` was timed: across servers, the cluster's; within
    one, the place's own (the cluster's containers: the image's)."""
    return "cluster" if across else ("image" if place == "cluster" else place)


def sweep_fit(sweeps: list[dict], backend: str | None, place: str | None, across: bool,
              ranks: int = 2) -> cm.Fit | None:
    """The back end's collective fitted (cost_model.fit, two regimes where it needs them) on
    doctor's sweeps alone at `ranks` ranks: those timed where ranks at `place` exchange
    (sweep_place; `place` None: any) across servers or not; across servers without one,
    the sweep within one (its host's costs: target_fit moves it to the target's link);
    the back end's sweep whichever framework timed it (Horovod's over Gloo and DDP's run
    gloo::allreduce alike). None where doctor swept no collective of the back end."""
    def pick(across_: bool) -> list[dict]:
        want = sweep_place(place, across_) if place else None
        return [e for e in sweeps if e.get("backend") == backend and bool(e.get("across")) == across_
                and (want is None or e.get("place") == want or (not across_ and place is None))
                and (e.get("ranks") or 2) == ranks]
    chosen = (pick(True) if across else []) or pick(False)
    if not chosen and place:
        chosen = [e for e in sweeps if e.get("backend") == backend and not e.get("across")
                  and (e.get("ranks") or 2) == ranks]
    if not chosen:
        return None
    e0 = chosen[0]
    link = e0.get("link", "") if e0.get("across") else ""
    gbs, delay, burst = link_of(link, 2 if e0.get("across") else 1)
    points = [p for e in chosen if (e.get("link", "") if e.get("across") else "") == link for p in _sweep_points(e)]
    fit = cm.fit(points, gbs, delay, burst, backend=backend)
    if fit is None or not e0.get("across") or min(p["size_bytes"] for p in points) <= cm.SMALL_BYTES:
        return fit
    # across servers with no small message timed: the latency of the host's own sweep (the same
    # stack's small messages) plus the link's delay, the bandwidth the cross-server sweep's
    host = sweep_fit(sweeps, backend, place, False, ranks)
    if host is None or host.alpha_s <= fit.alpha_s:
        return fit
    def left(p: dict) -> float:      # its time less the latency's steps
        return p["time_s"] - (host.alpha_s + delay) * algorithms.steps(p["op"], p["ranks"], backend, p["size_bytes"])
    betas = [left(p) / algorithms.wire_bytes(p["op"], p["size_bytes"], p["ranks"], backend)
             for p in points if left(p) > 0]
    beta = statistics.median(betas) if betas else None
    if not beta:
        return fit
    return cm.Fit(host.alpha_s + delay, beta, fit.points, fit.sizes, "latency from the host's sweep (no small "
                  "message timed across servers), bandwidth from the cross-server sweep", gbs, delay, backend, burst)


def sweep_check(fit_: cm.Fit, sweeps: list[dict], backend: str | None) -> list[dict]:
    """The fit (made at 2 ranks) against each point doctor timed at more ranks (its `ranks`):
    (ranks, size_bytes, measured_s, predicted_s, error), within one server."""
    out = []
    for e in sweeps:
        if e.get("backend") != backend or e.get("across") or (e.get("ranks") or 2) <= 2:
            continue
        for p in _sweep_points(e):
            pred = fit_.time(p["op"], p["size_bytes"], e["ranks"])
            out.append({"ranks": e["ranks"], "size_bytes": p["size_bytes"], "measured_s": p["time_s"],
                        "predicted_s": pred, "error": pred / p["time_s"] - 1})
    return out


def link_of(spec: str, nodes: int) -> tuple[float | None, float, float]:
    """(rate in GB/s, delay in s, token bucket in bytes) of a multi-server run's shaped
    link (`--link` spec: 1gbit, 100mbit/2ms); (None, 0, 0) else."""
    spec = spec or ""
    if nodes < 2 or not spec:
        return None, 0.0, 0.0
    delay = spec.partition("/")[2]
    m = DELAY.match(delay) if delay else None
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    return (rate_gbs(spec), float(m.group(1)) * scale[m.group(2).lower()] if m else 0.0,
            float(tbf_burst_bytes(spec) or 0))
