"""`invoke predict`: a configuration not run, predicted from what one worker measured on
the machine a user has (lab.report.cost_model.predict_target): a results folder's 1-worker
run, its 1-process compute ceiling where `--ceiling` measured one, and doctor's sweeps
saved there (`invoke doctor --save FOLDER`); or a stated single-device throughput and
batch with the model's gradient bytes. The target: workers, workers per server, the
link's rate and latency, the all-reduce's algorithm and the cores of a server. It prints
the predicted step, throughput, speedup and scaling efficiency, each assumption in one
sentence, and the fit against doctor's sweeps at more than 2 ranks where there are some.
The report's what-if table (lab.report.prediction.what_if) is made by the same function."""
from __future__ import annotations

from lab.common.link import rate_gbs
from lab.report import algorithms, model_inputs, summary
from lab.report import cost_model as cm
from lab.report.cost_assumptions import ASSUMPTIONS
from lab.report.records import ReportError, config_label, load


def parse_link(link: str) -> float | None:
    """'10gbit' -> 10.0 (Gbit/s); '' -> None; ReportError (one sentence) else."""
    if not link:
        return None
    gbs = rate_gbs(link)
    if not gbs or "/" in link:
        raise ReportError(f"--link takes a rate as tc writes it (1gbit, 100mbit, 25gbit), not {link!r}; "
                          f"the latency goes in --latency-us")
    return gbs * 8


def target(np: int, per_server: int = 0, link: str = "", latency_us: float = 0.0, algorithm: str = "auto",
           cores: int = 0) -> cm.Target:
    """The target of the flags, checked (ReportError: one sentence)."""
    if np < 1:
        raise ReportError("--np is the workers to predict: give 1 or more")
    if per_server < 0 or cores < 0 or latency_us < 0:
        raise ReportError("--per-server, --cores and --latency-us are 0 (the default) or more")
    if algorithm not in algorithms.ALGORITHMS:
        raise ReportError(f"--algorithm is one of {', '.join(algorithms.ALGORITHMS)}, not {algorithm!r}")
    gbit = parse_link(link)
    if per_server and per_server < np and not gbit:
        raise ReportError("workers on more than one server need the link between them: add --link (10gbit)")
    return cm.Target(workers=np, per_server=per_server or None, link_gbit=gbit, latency_s=latency_us * 1e-6,
                     algorithm=None if algorithm == "auto" else algorithm, cores=cores or None)


def _pick(rows: list[dict], records: list[dict], framework: str, backend: str, model: str, place: str) -> dict:
    """The one 1-worker row the filters leave (ReportError naming the choices else)."""
    def fits(row):
        c, w = row["record"].get("config", {}), row["record"].get("world", {})
        return ((not framework or c.get("framework") == framework)
                and (not backend or (w.get("controller") or c.get("backend")) == backend)
                and (not model or c.get("model") == model) and (not place or summary.place(row["record"]) == place))
    found = [r for r in rows if fits(r)]
    if len(found) == 1:
        return found[0]
    names = "; ".join(config_label(r["record"], records, " / ") for r in (found or rows))
    if not found:
        raise ReportError(f"no 1-worker run there matches the filters: it has {names or 'none'}")
    raise ReportError(f"{len(found)} 1-worker runs there match; pick one with --framework, --backend, "
                      f"--model or --place: {names}")


def from_results(folder: str, framework: str = "", backend: str = "", model: str = "",
                 place: str = "") -> tuple[cm.OneWorker, list, str]:
    """(the 1-worker run of the folder's records, the sweeps stored there, its name)."""
    records = load(folder)
    rows = [r for r in summary.rows(records) if r.get("runs") and r["np"] == 1 and r.get("servers") == 1]
    if not rows:
        raise ReportError(f"no 1-worker run under {folder}: `invoke bench --np 1 --ceiling` measures one")
    row = _pick(rows, records, framework, backend, model, place)
    return (model_inputs.one_worker(row, model_inputs.ceilings(records)), model_inputs.load_sweeps(folder),
            config_label(row["record"], records, " / "))


def stated(throughput: float, batch: int, gradient_mb: float, framework: str, backend: str,
           cores: int = 0) -> cm.OneWorker:
    """A OneWorker from a stated single-device throughput (images/s) and batch, and the
    model's gradient size (MB, float32): its backward two thirds of the step, no spread."""
    if throughput <= 0 or batch < 1 or gradient_mb <= 0:
        raise ReportError("a stated device takes --throughput (images/s), --batch and --gradient-mb, each above 0")
    grad = gradient_mb * 1e6
    return cm.OneWorker(framework=framework or "ddp", backend=backend or "gloo", compute_s=batch / throughput,
                        backward_s=None, grad_bytes=grad, payload_bytes=grad, batch=batch, cores=cores or None)


def lines(one: cm.OneWorker, fit: cm.Fit | None, t: cm.Target, source: str, sweeps: list[dict]) -> list[str]:
    """What `invoke predict` prints."""
    p = cm.predict_target(one, fit, t)
    where = (f"{t.workers} workers" + (f", {t.on_server} a server on {t.servers} servers at {t.link_gbit:g} Gbit/s"
                                       + (f", {t.latency_s * 1e6:g} us latency" if t.latency_s else "")
                                       if t.servers > 1 else " on one server"))
    head = f"Predicted from {source}: {where}"
    if p["why"]:
        return [head + ":", f"not predicted: {p['why']}"]
    f = p["fit"]
    out = [head + ":",
           f"step {p['step_s'] * 1000:.4g} ms (compute {p['compute_s'] * 1000:.4g} = the 1-worker "
           f"{one.compute_s * 1000:.4g} x {p['slowdown']:.3g}, exposed communication {p['exposed_s'] * 1000:.3g} "
           f"in {p['buckets']} collective(s), waiting {p['waiting_s'] * 1000:.3g})",
           f"throughput {p['throughput_img_s']:.4g} images/s, speedup {p['speedup']:.3g}x over one worker, "
           f"scaling efficiency {100 * p['efficiency']:.0f}%"]
    if f is not None:
        out.append(f"collective: alpha {f.alpha_s * 1e6:.3g} us a step, {1 / f.beta_s_per_byte / 1e9 if f.beta_s_per_byte else float('inf'):.3g} "
                   f"GB/s a rank ({f.how}; {f.points} points of doctor's sweeps, {f.backend}"
                   + (f", algorithm {t.algorithm}" if t.algorithm else ", the back end's algorithm") + ")")
        checks = model_inputs.sweep_check(fit, sweeps, one.backend)
        if checks:
            errs = sorted(abs(c["error"]) for c in checks)
            out.append(f"checked against doctor's sweeps at {sorted({c['ranks'] for c in checks})} ranks: median "
                       f"absolute error {100 * errs[len(errs) // 2]:.0f}%, largest {100 * errs[-1]:.0f}% "
                       f"({len(checks)} points)")
    if p.get("ceiling_img_s") and t.on_server > 1:
        out.append(f"compute ceiling implied at {t.workers} processes: {p['ceiling_img_s']:.4g} images/s "
                   f"(`invoke bench --np {t.on_server} --ceiling` measures one to check it)")
    out.append("Assumptions:")
    out += [f"- {ASSUMPTIONS[a]}" for a in dict.fromkeys(p["assumptions"]) if a in ASSUMPTIONS]
    return out


def run(results: str = "", np: int = 2, per_server: int = 0, link: str = "", latency_us: float = 0.0,
        algorithm: str = "auto", cores: int = 0, framework: str = "", backend: str = "", model: str = "",
        place: str = "", throughput: float = 0.0, batch: int = 0, gradient_mb: float = 0.0, sweeps_from: str = "") -> list[str]:
    """`invoke predict`'s lines (ReportError: one sentence)."""
    t = target(np, per_server, link, latency_us, algorithm, cores)
    if throughput or batch or gradient_mb:
        one = stated(throughput, batch, gradient_mb, framework, backend, cores)
        sweeps = model_inputs.load_sweeps(sweeps_from) if sweeps_from else []
        source = f"a stated device: {throughput:g} images/s at batch {batch}, {gradient_mb:g} MB of gradients"
    elif results:
        one, sweeps, source = from_results(results, framework, backend, model, place)
        source = f"the 1-worker run of {source} under {results}"
        sweeps += model_inputs.load_sweeps(sweeps_from) if sweeps_from else []
    else:
        raise ReportError("give --results FOLDER (a results folder with a 1-worker run) or --throughput, --batch and "
                          "--gradient-mb")
    fit = model_inputs.sweep_fit(sweeps, one.backend, None, t.servers > 1)
    if fit is None and t.workers > 1:
        raise ReportError(f"no doctor sweep of {one.backend}'s collective there: `invoke doctor --save "
                          f"{sweeps_from or results or 'RESULTS'}` measures one (across servers: with --nodes 2)")
    return lines(one, fit, t, source, sweeps)


NUMBERS = {"np": int, "per_server": int, "latency_us": float, "cores": int, "throughput": float, "batch": int,
           "gradient_mb": float}


def from_flags(flags: dict) -> list[str]:
    """run() of `invoke predict`'s flags (strings from the command line or invoke.yaml's
    section), each number checked (ReportError: one sentence naming the flag)."""
    args = dict(flags)
    for name, kind in NUMBERS.items():
        if name in args and args[name] not in ("", None):
            try:
                args[name] = kind(args[name])
            except (TypeError, ValueError):
                flag = "--" + name.replace("_", "-")
                raise ReportError(f"{flag} takes a {'whole ' if kind is int else ''}number, not {args[name]!r}") from None
    unknown = set(args) - set(run.__code__.co_varnames[:run.__code__.co_argcount])
    if unknown:
        raise ReportError(f"invoke predict has no setting {', '.join(sorted(unknown))}")
    return run(**{k: v for k, v in args.items() if v not in ("", None)})
