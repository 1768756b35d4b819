"""The report's sentences: on each predicted configuration (lab.report.prediction's
predictions), what its predicted step is made of and the step its own measurements explain;
on each multi-worker row with its 1-worker row, predicted or not (prediction.measured), what
the measured parts say it lost against one worker and what fp16 would buy it."""
from __future__ import annotations

from lab.common.link import rate_gbs
from lab.report import cost_model as cm
from lab.report import records as rec
from lab.report import step_parts, summary


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "n/a" if v is None else format(v, spec)


def _ms(seconds: float) -> str:
    """Milliseconds to one decimal, to two below 1 ms (0.04, not 0.0)."""
    return f"{seconds * 1000:.2f}" if seconds < 0.001 else f"{seconds * 1000:.1f}"


def explained(e: dict | None) -> str:
    """'; explained by its own parts 13.0 ms (slowdown 1.25, waiting 1.5 ms)' or ''."""
    if not e:
        return ""
    return (f"; explained by its own measurements (not a prediction): {e['step_ms']:.1f} ms (its compute "
            f"parts' slowdown {e['slowdown']:.2f}, its own wait {e['waiting_ms']:.1f} ms)")


def sentences(records: list[dict], preds: list[dict]) -> list[str]:
    """What explains each configuration's step, in one sentence each."""
    out = []
    for p in preds:
        name = rec.config_label(p["row"]["record"], records)
        where = _where(p)
        m = p["model"]
        head = (f"{name} {where}: predicted {p['predicted_ms']:.1f} ms ({p['compute_ms']:.1f} compute x "
                f"{m['slowdown']:.2f}{_contention(m)}, {m['exposed_s'] * 1000:.1f} exposed of {m['buckets']} "
                f"collective(s) costing {_ms(m['collectives_s'])} ms{_cycles(m)}, "
                f"{m['waiting_s'] * 1000:.1f} waiting{_whose(m.get('waiting_from'))}), measured {p['step_ms']:.1f} ms"
                f"{explained(p.get('explained'))}")
        out.append(head + ".")
    return out


def _contention(m: dict) -> str:
    """' (of which contention 1.16, as the other configurations of its framework and model
    measured it)' where the slowdown carries the others' contention; '' else."""
    if not m.get("contention_from") or m.get("slowdown_from") != "ceiling":
        return ""
    return f" (of which contention {m['contention']:.2f}, {_as(m['contention_from'])})"


def _whose(source: str | None) -> str:
    """' (as the other configurations of its framework and model measured it)': whose wait
    the row carries; '' else."""
    if not source:
        return ""
    return " (its own)" if source == "itself" else f" ({_as(source)})"


def _as(source: str) -> str:
    """'as the other configurations of its framework and model measured it' (model_inputs'
    `how`)."""
    if source == "the 1-worker run's step spread":
        return "from the 1-worker run's spread of steps"
    return "as the other configurations measured it" if source == "others" else \
        f"as the other configurations of {source} measured it"


def _where(p: dict) -> str:
    """'at 2 workers on 2 servers at 100mbit': where a row (a prediction or a split) ran."""
    return (f"at {p['np']} workers" + (f" on {p['servers']} servers" if p["servers"] > 1 else "")
            + rec.link_label(p["row"]["record"]))


def split_sentences(records: list[dict], splits: list[dict]) -> list[str]:
    """Each row of prediction.measured that lost time against one worker: where it went,
    measured (with or without a prediction of its step)."""
    out = []
    for s in splits:
        if s["gap"]["lost"] > 0:
            name = rec.config_label(s["row"]["record"], records)
            where = _where(s)
            out.append(f"{name} {where}: {_measured_split(s)}")
    return out


def _cycles(m: dict) -> str:
    """' in 2.4 Horovod cycles with work (a mean over their phase against the backward), each
    costing 18.5 ms beyond its collectives' where Horovod's cycle cost was fitted, ', of
    which 0.6 ms a collective DDP's bucket cost, fitted on the other configurations' where
    DDP's bucket cost was."""
    if m["cycle_cost_s"]:
        return (f" in {m['cycles']:.1f} Horovod cycles with work (a mean over their phase against the backward), "
                f"each costing {_ms(m['cycle_cost_s'])} ms beyond its collectives")
    if m.get("bucket_cost_s"):
        return (f", of which {m['bucket_cost_s'] * 1000:.1f} ms a collective DDP's bucket cost, fitted on the "
                f"other configurations")
    return ""


def _with_fp16(p: dict, rows: list[dict]) -> dict | None:
    # p: an entry of prediction.measured (its row's measured parts; no prediction needed)
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


def fp16_sentences(records: list[dict], splits: list[dict]) -> list[str]:
    """What fp16 would buy each uncompressed configuration of prediction.measured (from its
    measured parts, not the cost model: no compute ceiling needed), then measured."""
    rows = summary.rows(records)
    out = []
    for p in splits:
        f = _with_fp16(p, rows)
        if f is None or p["collective"] is None:
            continue
        name = rec.config_label(p["row"]["record"], records)
        where = _where(p)
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
    share = p["collective"]["busbw_gbs"] / gbs
    return (f", {share:.0%} of its {spec.partition('/')[0]} link"
            + (": above its rate, as the link's token bucket lets a pause's first bytes through unshaped"
               if share > 1 else ""))


def _measured_split(p: dict) -> str:
    """The measured parts of what the step lost against one worker (step_parts.gap); `p`: an
    entry of prediction.measured."""
    c, g = p["collective"], p["gap"]
    lost = g["lost"]

    def share(x):       # signed: a part that shrank shows below 0%, and the four add up to 100% (rounded)
        return f"{x / lost:.0%} ({x * 1000:.1f} ms)"
    grew = ("compute that shrank" if g["compute"] < 0 else
            "compute slowed by ranks contending for the cores (more ranks than cores)" if p["oversubscribed"]
            else "compute that grew (cores and memory shared by more ranks)")
    predicted = (f", predicted {p['predicted_speedup']:.2f}" if p.get("predicted_speedup") is not None
                 else " (not predicted)")
    alone = (f" (the {c['op']} of {_mb(c['size_bytes'])}: {c['time_s'] * 1000:.1f} ms alone{_cycle_wait(p, c)} at "
             f"{c['busbw_gbs']:.3g} GB/s bus bandwidth{_of_link(p)})") if c else ""
    return (f"measured, of the {lost * 1000:.1f} ms the step lost against one worker, "
            f"{share(g['communication'])} is exposed communication{alone}, "
            f"{share(g['waiting'])} waiting for the slowest rank, {share(g['compute'])} {grew}, "
            f"and {share(g['unexplained'])} not in the parts (each part's median over repeats). "
            f"Speedup measured {_fmt(p['speedup'], '.2f')}{predicted}.")


def _cycle_wait(p: dict, c: dict) -> str:
    """', at least one cycle of Horovod's background thread (1.0 ms; the bandwidth is of the
    whole time),' for a Horovod row whose timing the model takes a cycle out of (a
    synchronous Horovod operation takes at least a cycle: cost_model.horovod_collective_s);
    '' else."""
    r = p["row"]["record"]
    if r.get("config", {}).get("framework") != "horovod":
        return ""
    cycle_s = cm.horovod_cycle_s(r["world"].get("horovod"))
    if cm.horovod_collective_s(c["time_s"], cycle_s) == c["time_s"]:
        return ""
    return (f", at least one cycle of Horovod's background thread ({cycle_s * 1000:.1f} ms; the bandwidth is of the "
            f"whole time),")


def _mb(b: float) -> str:
    return f"{b / 1e6:.3g} MB"
