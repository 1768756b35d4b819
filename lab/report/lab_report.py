"""`invoke report RESULTS_DIR`: the lab report from the records alone — report.md with
the template's environment table, the within-server and across-server tables, the
compression table, the failures, the scalability curves (PNG files beside it) and an
analysis whose every sentence is computed from the figures.

Pure functions build each table from records; `write` is the edge that reads the
records and writes the files."""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from lab.common import results
from lab.common.config import COMPRESSIONS, DATA_PARALLEL_STRATEGIES
from lab.report import markdown, summary


class ReportError(Exception):
    """Nothing to report on, or a folder that is not there: one sentence."""


# ---------------------------------------------------------------- reading

def load(path: str) -> list[dict]:
    """Every record under path: one run folder, or a results folder holding several."""
    p = Path(path)
    if not p.exists():
        raise ReportError(f"{path} does not exist: give a results folder (results/ or results/<run-id>)")
    files = [p / results.RESULTS_FILE] if (p / results.RESULTS_FILE).exists() else \
        sorted(p.glob(f"*/{results.RESULTS_FILE}"))
    records = []
    for f in files:
        records += results.read_records(f)[0]
    if not records:
        raise ReportError(f"no records in {path}: run `invoke bench` first (its records go to "
                          f"results/<run-id>/results.jsonl)")
    return records


def ok(records):
    return [r for r in records if r.get("status") == "ok"]


# What makes runs comparable besides framework, back end, compression and workers:
# runs that differ in any of these are never put in one group, curve or sentence.
SETUP_FIELDS = ("model", "data", "device", "batch_size", "epochs", "max_steps", "threads")


def setup_key(r: dict) -> tuple:
    """The setup, and the strategy (summary.strategy_name): runs of different strategies
    are never one group, curve or sentence either."""
    c = r.get("config", {})
    return (*(c.get(k) for k in SETUP_FIELDS), summary.strategy_name(c))


def setup_label(r: dict, records: list[dict]) -> str:
    """'' when every record shares one setup; else what tells this one apart, such as
    'resnet50, batch 8: '."""
    keys = {setup_key(x) for x in records}
    if len(keys) < 2:
        return ""
    c = r.get("config", {})
    fields = (*SETUP_FIELDS, "strategy")
    varying = [k for i, k in enumerate(fields) if len({key[i] for key in keys}) > 1]
    parts = [f"batch {c.get(k)}" if k == "batch_size" else
             f"{k.replace('_', ' ')} {c.get(k)}" if k in ("epochs", "max_steps", "threads") else
             summary.strategy_name(c) if k == "strategy" else
             str(c.get(k)) for k in varying]
    return ", ".join(parts) + ": "


# ---------------------------------------------------------------- tables

def _md(headers, rows) -> str:
    return markdown.table(headers, rows)


def environment(records: list[dict]) -> list[tuple[str, str]]:
    """The template's environment table, from the manifests of the ok records."""
    good = ok(records)
    if not good:
        return [("records", "no successful run: no environment to describe")]
    m = good[-1]["manifest"]
    hosts = sorted({h for r in good for h in r["world"]["hosts"]})
    gpus = m.get("gpus")
    if isinstance(gpus, dict) and gpus.get("devices"):
        names = sorted({d["name"] for d in gpus["devices"]})
        gpu_text = f"{gpus['count']} x {', '.join(names)} per server"
    else:
        gpu_text = "none (CPU ranks)"
    nics = m.get("nics") if isinstance(m.get("nics"), list) else []
    physical = [n for n in nics if n.get("driver") != "virtual"]
    nic_text = ", ".join(f"{n['name']} ({n['driver']}"
                         + (f", {n['speed_mbps']} Mb/s" if n.get("speed_mbps") else "") + ")"
                         for n in physical) or "none reported"
    image = m.get("image") or {}
    labels = image.get("labels") or {}
    label_text = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in sorted(labels.items())
                           if k.endswith(("_version", "flavor", "gpu_operations")))
    mpi = m.get("mpi")
    mpi_text = f"{mpi['implementation']} {mpi['version']}" if isinstance(mpi, dict) and "version" in mpi else "n/a"
    rows = [
        ("servers", f"{len(hosts)}: {', '.join(hosts)}"),
        ("CPU", str(m.get("cpu_model"))),
        ("NIC model and count", f"{len(physical)}: {nic_text}"),
        ("GPU model and count", gpu_text),
        ("GPU interconnect", m.get("gpu_topology") or "n/a (fewer than two GPUs)"),
        ("OS", str(m.get("os"))),
        ("GPU driver", m.get("driver") or "n/a"),
        ("framework packages", f"torch {m.get('torch')}, torchvision {m.get('torchvision')}, "
                               f"horovod {m.get('horovod')}, python {m.get('python')}"),
        ("CUDA", m.get("cuda") or "n/a (CPU build of torch)"),
        ("cuDNN", str(m.get("cudnn") or "n/a")),
        ("NCCL", str(m.get("nccl") or "n/a")),
        ("MPI", mpi_text),
        ("image", f"{image.get('id', 'none: local processes')[:19]}" + (f" ({label_text})" if label_text else "")),
    ]
    return rows


def result_rows(records: list[dict], across: bool) -> list[list]:
    """The template's results table (back end, servers, devices per server, time per
    step, throughput, speedup) plus efficiency and accuracy; failed and skipped runs are
    rows that say so."""
    rows = []
    for row in summary.rows(records):
        rec = row["record"]
        nodes = rec["world"]["nodes"]
        if (nodes > 1) != across:
            continue
        label = setup_label(rec, records) + f"{row['framework']} / {row['back end']}" + (
            f" / {row['compression']}" if row.get("compression") not in (None, "none") else "")
        if "failed" in row:
            rows.append([label, nodes, "", row["np"], f"{row.get('status', 'failed').upper()}: "
                         f"{row['failed'][:120]}", "", "", "", "", 1])
            continue
        rows.append([label, row["servers"], row["devices per server"], row["np"],
                     f"{row['time per step (ms)']:.2f}", summary.with_spread(row, "throughput (img/s)"),
                     summary.with_spread(row, "speedup"), summary.with_spread(row, "efficiency"),
                     "n/a" if row.get("accuracy") is None else f"{row['accuracy']:.2%}",
                     row.get("runs", 1)])
    return rows


RESULT_HEADERS = ["framework / back end", "servers", "devices per server", "workers",
                  "time per step (ms)", "throughput (img/s)", "speedup", "efficiency", "accuracy",
                  "runs"]


def _median_record(runs: list[dict]) -> dict:
    """One record standing for a combination's repeats: the first, with its timing
    figures replaced by the repeats' medians (accuracy and bytes: the first run's
    median too, they are the same from run to run when nothing but timing varies)."""
    if len(runs) == 1:
        return runs[0]
    figs = dict(runs[0]["figures"])
    for k in ("throughput_img_s", "step_time_mean_s", "test_accuracy"):
        vals = [r["figures"][k] for r in runs if r["figures"].get(k) is not None]
        if vals:
            figs[k] = statistics.median(vals)
    return {**runs[0], "figures": figs}


def _compression_groups(records: list[dict]) -> dict:
    """(setup, framework, backend, np, nodes) -> {compression: median record}."""
    runs = defaultdict(lambda: defaultdict(list))
    for r in ok(records):
        c = r["config"]
        runs[(setup_key(r), c["framework"], c["backend"], r["world"]["np"],
              r["world"]["nodes"])][c["compression"]].append(r)
    return {k: {comp: _median_record(rs) for comp, rs in v.items()} for k, v in runs.items()}


def compression_rows(records: list[dict]) -> list[list]:
    """Per framework, back end and worker count: each compression's time, throughput,
    accuracy and bytes per step, with the saving against uncompressed."""
    groups = _compression_groups(records)
    rows = []
    for key in sorted(groups, key=str):
        comps = groups[key]
        label = setup_label(next(iter(comps.values())), records) + f"{key[1]} / {key[2]}"
        if len(comps) < 2:
            continue
        base = comps.get("none")
        for name in sorted(comps, key=lambda x: COMPRESSIONS.index(x)
                           if x in COMPRESSIONS else len(COMPRESSIONS)):
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


COMPRESSION_HEADERS = ["framework / back end", "workers", "compression", "time per step (ms)",
                       "throughput (img/s)", "accuracy", "payload bytes/step", "wire bytes/step (est.)",
                       "payload saved"]


def failure_rows(records: list[dict]) -> list[list]:
    return [[r["config"].get("framework"), r["config"].get("backend"), r["config"].get("compression"),
             r["world"]["np"], r.get("status"), (r.get("error") or {}).get("host") or "",
             (r.get("error") or {}).get("reason", "")]
            for r in records if r.get("status") != "ok"]


def _mb(n: float) -> str:
    return f"{n / 1e6:,.2f}" if n < 1e8 else f"{n / 1e6:,.0f}"


def has_strategies(records: list[dict]) -> bool:
    """Whether any run spread its work other than by the frameworks' data parallelism."""
    return any(summary.strategy_name(r.get("config", {})) != "ddp" for r in ok(records))


def strategy_label(r: dict, records: list[dict]) -> str:
    """The strategy's name after what else tells its setup apart ('resnet50: zero1'),
    and its framework and back end where runs of this strategy used more than one (ddp
    by Horovod and by torch: 'ddp (horovod / gloo)')."""
    c = r.get("config", {})
    name = summary.strategy_name(c)
    same = [x for x in records if summary.strategy_name(x.get("config", {})) == name]
    stacks = {(x.get("config", {}).get("framework"), x.get("config", {}).get("backend"))
              for x in same}
    if len(stacks) > 1:
        name += f" ({c.get('framework')} / {c.get('backend')})"
    return setup_label(r, same) + name


def strategy_rows(records: list[dict]) -> list[list]:
    """The source benchmark's table (seeds/004): strategy, servers x devices per server,
    throughput, memory per device, accuracy, and the batch each row used; memory per
    device is what each rank held in parameters, gradients and optimizer state (measured
    from its tensors) and its peak (RSS on CPUs, torch's max allocated on GPUs), rank by
    rank, of the repeats' first run (they hold the same)."""
    rows = []
    for row in summary.rows(records):
        if "failed" in row:
            continue
        r = row["record"]
        f = r["figures"]
        held = f.get("held_bytes")
        peak = f.get("peak_memory_bytes") or []
        rows.append([
            strategy_label(r, records),
            f"{row['framework']} / {row['back end']}",
            f"{row['servers']} x {row['devices per server']}",
            summary.with_spread(row, "throughput (img/s)"),
            " / ".join(_mb(h["total"]) for h in held) if held else "n/a",
            " / ".join(_mb(p) for p in peak) if peak else "n/a",
            "n/a" if row.get("accuracy") is None else f"{row['accuracy']:.2%}",
            f.get("batch_semantics") or f"{r['config'].get('batch_size')} per process",
            row.get("runs", 1)])
    return rows


STRATEGY_HEADERS = ["strategy", "framework / back end", "servers x devices", "throughput (img/s)",
                    "held per device (MB: params + grads + optimizer)",
                    "peak per device (MB)", "accuracy", "batch", "runs"]


def memory_bars(records: list[dict]) -> list[tuple[str, int, dict]]:
    """(strategy label, rank, held bytes by kind) for each rank of each strategy row at
    its highest process count: what the memory chart draws."""
    rows = [row for row in summary.rows(records) if "failed" not in row
            and row["record"]["figures"].get("held_bytes")]
    top: dict = {}
    for row in rows:
        label = strategy_label(row["record"], records)
        if row["np"] >= top.get(label, (0, None))[0]:
            top[label] = (row["np"], row)
    out = []
    for label, (np_, row) in top.items():
        for rank, held in enumerate(row["record"]["figures"]["held_bytes"]):
            out.append((f"{label}, np {np_}", rank, held))
    return out


HELD_KINDS = (("parameters", "tab:blue"), ("gradients", "tab:orange"),
              ("optimizer_state", "tab:green"))


def memory_figure(records: list[dict]):
    """memory.png: for each strategy (at its highest process count), one bar per rank,
    stacked by parameters, gradients and optimizer state, in MB."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    bars = memory_bars(records)
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(bars) + 2), 4.5))
    xs = list(range(len(bars)))
    bottom = [0.0] * len(bars)
    for kind, color in HELD_KINDS:
        heights = [b[2].get(kind, 0) / 1e6 for b in bars]
        ax.bar(xs, heights, bottom=bottom, color=color, label=kind.replace("_", " "))
        bottom = [a + h for a, h in zip(bottom, heights)]
    ax.set_xticks(xs, [f"{b[0]}, rank {b[1]}" for b in bars], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("MB held per device")
    ax.set_title("Memory per device by strategy (measured from each rank's tensors)")
    ax.legend()
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- curves

def series(records: list[dict]) -> dict:
    """(setup label, framework, backend, compression, nodes>1) -> sorted [(workers,
    throughput)], the median of the ok runs (the repeats) per worker count."""
    runs = defaultdict(lambda: defaultdict(list))
    for r in ok(records):
        c = r["config"]
        key = (setup_label(r, records), c["framework"], c["backend"], c["compression"],
               r["world"]["nodes"] > 1)
        runs[key][r["world"]["np"]].append(r["figures"]["throughput_img_s"])
    return {k: sorted((n, statistics.median(ts)) for n, ts in v.items()) for k, v in runs.items()}


FRAMEWORK_COLORS = {"horovod": "tab:blue", "ddp": "tab:orange", "none": "tab:green"}
COMPRESSION_STYLES = {"none": "-", "fp16": "--", "int8": "-.", "int8-naive": ":"}


def panels(records: list[dict]) -> dict:
    """What the curves show: {(setup label, back end, across servers): {(framework,
    compression): [(workers, throughput summary, speedup summary or None)]}}, from the
    table's rows (medians of the repeats with their spread)."""
    out: dict = defaultdict(lambda: defaultdict(list))
    for row in summary.rows(records):
        if "failed" in row:
            continue
        r = row["record"]
        key = (setup_label(r, records), row["back end"], r["world"]["nodes"] > 1)
        out[key][(row["framework"], row["compression"])].append(
            (row["np"], row["throughput_summary"], row.get("speedup_summary")))
    return {k: {s: sorted(v, key=lambda p: p[0]) for s, v in series_.items()}
            for k, series_ in sorted(out.items(), key=str)}


def figures(records: list[dict]) -> dict:
    """{file name: matplotlib Figure}: throughput and speedup against workers, one panel
    per model setup and back end (and across servers), colour by framework, line style
    by compression, error bars from the repeats' spread, the ideal line on each panel."""
    import math

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    data = panels(records)
    if not data:
        return {}
    out = {}
    for name, ylabel in (("throughput.png", "throughput (images/s)"),
                         ("speedup.png", "speedup (x, against 1 worker)")):
        cols = min(3, len(data))
        rows_ = math.ceil(len(data) / cols)
        fig, axes = plt.subplots(rows_, cols, figsize=(5 * cols, 3.8 * rows_), squeeze=False)
        drawn = False
        for ax, ((setup, backend, across), series_) in zip(axes.flat, data.items()):
            xmax = max(n for pts in series_.values() for n, _, _ in pts)
            ideal_drawn = False
            for k, ((fw, comp), pts) in enumerate(series_.items()):
                # Series side by side at each worker count, so their error bars do not
                # hide one another.
                dx = (k - (len(series_) - 1) / 2) * 0.03
                xs = [n + dx for n, _, _ in pts]
                if name == "throughput.png":
                    ys = [t.median for _, t, _ in pts]
                    lo = [t.median - t.low for _, t, _ in pts]
                    hi = [t.high - t.median for _, t, _ in pts]
                    one = next((t.median for n, t, _ in pts if n == 1), None)
                    ideal = ([1, xmax], [one, one * xmax]) if one else None
                else:
                    pts = [p for p in pts if p[2] is not None]
                    if not pts:
                        continue
                    xs = [n + dx for n, _, _ in pts]
                    ys = [sp.median for _, _, sp in pts]
                    lo = [sp.median - sp.low for _, _, sp in pts]
                    hi = [sp.high - sp.median for _, _, sp in pts]
                    ideal = ([1, xmax], [1, xmax])
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3,
                            color=FRAMEWORK_COLORS.get(fw, "tab:gray"),
                            linestyle=COMPRESSION_STYLES.get(comp, "-"), label=f"{fw}, {comp}")
                drawn = True
                if ideal and (name == "throughput.png" or not ideal_drawn):
                    ax.plot(*ideal, color=FRAMEWORK_COLORS.get(fw, "tab:gray") if name == "throughput.png"
                            else "grey", linewidth=0.8, alpha=0.5, linestyle=(0, (1, 2)))
                    ideal_drawn = True
            ax.set_title(f"{setup}{backend}" + (", across servers" if across else ""), fontsize=10)
            ax.set_xticks(sorted({n for pts in series_.values() for n, _, _ in pts}))
            ax.set_xlabel("workers (processes)")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(data):]:
            ax.set_visible(False)
        # One legend for the figure: colours are frameworks, line styles compressions.
        frameworks = sorted({fw for s in data.values() for fw, _ in s})
        comps = [c for c in COMPRESSION_STYLES if any(c == cc for s in data.values() for _, cc in s)]
        handles = ([Line2D([], [], color=FRAMEWORK_COLORS.get(f, "tab:gray"), label=f) for f in frameworks]
                   + [Line2D([], [], color="black", linestyle=COMPRESSION_STYLES[c], label=c) for c in comps]
                   + [Line2D([], [], color="grey", linestyle=(0, (1, 2)), label="ideal (linear)")])
        fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 7), fontsize=8)
        fig.suptitle(("Throughput" if name == "throughput.png" else "Speedup")
                     + " against workers (error bars: the repeats' spread)", fontsize=11)
        fig.tight_layout(rect=(0, 0.07, 1, 0.95))
        if drawn:
            out[name] = fig
        else:
            plt.close(fig)
    return out


def plot(records: list[dict], out_dir: Path) -> list[str]:
    """throughput.png and speedup.png (and memory.png when strategies ran); returns the
    file names written."""
    import matplotlib.pyplot as plt
    written = []
    figs = dict(figures(records))
    if has_strategies(records):
        mem = memory_figure(records)
        if mem is not None:
            figs["memory.png"] = mem
    for name, fig in figs.items():
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


# ---------------------------------------------------------------- analysis

def data_parallel(r: dict) -> bool:
    """Whether the run split its data over the processes (each a batch of its own: more
    processes, more images a step). The analysis ranks and splits into compute and
    communication only these: a pipeline keeps its batch whatever the process count, so
    its scaling is of another kind (the Parallel strategies table shows it)."""
    return (r.get("config", {}).get("strategy") or "ddp") in DATA_PARALLEL_STRATEGIES


def analysis(records: list[dict]) -> list[str]:
    """Sentences computed from the figures; none is written without its numbers."""
    out = []
    eff = []
    table = summary.rows(records)
    for row in table:
        r = row["record"]
        if r.get("status") == "ok" and row.get("efficiency") is not None and r["world"]["np"] > 1 \
                and data_parallel(r):
            eff.append((row["efficiency"], r, row))
    if eff:
        top_np = max(r["world"]["np"] for _, r, _ in eff)
        at_top = sorted(((e, r, row) for e, r, row in eff if r["world"]["np"] == top_np),
                        key=lambda x: -x[0])
        e, r, row = at_top[0]
        c = r["config"]
        text = (f"At {top_np} workers, {setup_label(r, records)}{c['framework']} over {c['backend']}"
                f"{' with ' + c['compression'] if c['compression'] != 'none' else ''} scaled best: "
                f"{e:.0%} efficiency ({row['throughput (img/s)']:,.0f} images/s")
        # A difference is called one only when the intervals of the repeats do not overlap.
        tied = [x for x in at_top[1:] if row["speedup_summary"].overlaps(x[2]["speedup_summary"])]
        if row["speedup_summary"].n > 1 and tied:
            text += (f"; its speedup interval overlaps {len(tied)} other setup(s)' at this count, "
                     f"so the runs do not tell them apart")
        out.append(text + ").")
        low = sorted(((e2, r2) for e2, r2, _ in eff if e2 < 0.8 and r2 is not r),
                     key=lambda x: x[1]["world"]["np"])
        for e, r in low[:3]:
            c = r["config"]
            out.append(f"Efficiency fell to {e:.0%} for {setup_label(r, records)}{c['framework']} "
                       f"over {c['backend']}"
                       f"{' (' + c['compression'] + ')' if c['compression'] != 'none' else ''} at "
                       f"{r['world']['np']} workers on {r['world']['nodes']} server(s).")
    # compute-to-communication: a worker's step at np=1 is compute; what the step gains
    # with more workers is communication and waiting.
    base = {}
    for row in table:
        if "failed" not in row and row["np"] == 1:
            base[summary.config_key(row["record"])] = row["time per step (ms)"] / 1000
    ratios = []
    for row in table:
        r = row["record"]
        b = base.get(summary.config_key(r)) if "failed" not in row else None
        if b and r["world"]["np"] > 1 and data_parallel(r):
            comm = row["time per step (ms)"] / 1000 - b
            if comm > 0:
                ratios.append((b / comm, r, b, comm))
    for ratio, r, b, comm in sorted(ratios, key=lambda x: (x[1]["config"]["framework"],
                                                          x[1]["config"]["backend"],
                                                          x[1]["world"]["np"]))[:6]:
        c = r["config"]
        out.append(f"{setup_label(r, records)}{c['framework']} over {c['backend']}"
                   f"{' (' + c['compression'] + ')' if c['compression'] != 'none' else ''}, "
                   f"{r['world']['np']} workers: {b * 1000:.1f} ms of compute (the 1-worker step) "
                   f"against {comm * 1000:.1f} ms more per step for communication and waiting, "
                   f"a compute-to-communication ratio of {ratio:.2f}.")
    # compression (medians of the repeats)
    groups = _compression_groups(records)
    for (_, fw, be, n, _nodes), comps in sorted(groups.items(), key=str):
        plain = comps.get("none")
        if not plain or n < 2 or summary.accuracy(plain) is None:
            continue
        fw = setup_label(plain, records) + fw
        pa = plain["figures"]["test_accuracy"]
        for name in ("fp16", "int8"):
            if name in comps:
                f = comps[name]["figures"]
                saved = 1 - f["payload_bytes_per_step"] / plain["figures"]["payload_bytes_per_step"] \
                    if f.get("payload_bytes_per_step") and plain["figures"].get("payload_bytes_per_step") else None
                out.append(f"{fw} over {be}, {n} workers: {name} reached {f['test_accuracy']:.2%} "
                           f"against {pa:.2%} uncompressed ({(f['test_accuracy'] - pa) * 100:+.2f} points)"
                           + (f" and handed {saved:.0%} fewer gradient bytes to the collective" if saved is not None else "")
                           + f"; its step took {f['step_time_mean_s'] * 1000:.1f} ms against "
                             f"{plain['figures']['step_time_mean_s'] * 1000:.1f} ms.")
        if "int8-naive" in comps:
            f = comps["int8-naive"]["figures"]
            z = f.get("codec_zeroed_fraction")
            out.append(f"{fw} over {be}, {n} workers: the naive 8-bit cast ended at {f['test_accuracy']:.2%} "
                       f"(chance is 10%) against {pa:.2%} uncompressed: "
                       + (f"{z:.1%} of the nonzero gradient values were sent as 0, because a cast to "
                          f"int8 truncates every value below 1, so the weights barely moved; scaling "
                          f"each chunk into the 8-bit range (int8) keeps them."
                          if z is not None else "its zeroed share was not recorded."))
    bad = [r for r in records if r.get("status") == "failed"]
    if bad:
        out.append(f"{len(bad)} run(s) failed; they are listed under Failures with the rank, "
                   f"host and reason recorded.")
        for r in bad:     # bench's stall watch (lab.host.stall): the diagnosis, in full
            if "stalled" in (r.get("error") or {}):
                c = r["config"]
                out.append(f"{c.get('framework')} over {c.get('backend')}, {r['world']['np']} "
                           f"workers, {r['error']['reason']}")
    skipped = [r for r in records if r.get("status") == "skipped"]
    if skipped:
        out.append(f"{len(skipped)} combination(s) could not run on this machine and were skipped "
                   f"(reasons under Failures).")
    return out


# ---------------------------------------------------------------- writing

def render(records: list[dict], images: list[str], source: str) -> str:
    n_ok = len(ok(records))
    times = sorted(r.get("started_at", "") for r in records)
    parts = ["# Distributed training lab report\n",
             f"Generated by `invoke report` from {len(records)} record(s) in `{source}` "
             f"({n_ok} ok, {len(records) - n_ok} failed or skipped), runs from "
             f"{times[0][:19]} to {times[-1][:19]} UTC. Every figure below comes from those records.\n",
             "## Environment\n", _md(["item", "value"], environment(records)), ""]
    within = result_rows(records, across=False)
    across = result_rows(records, across=True)
    parts += ["## Results within one server\n",
              _md(RESULT_HEADERS, within) if within else "No single-server run.", ""]
    parts += ["## Results across servers\n",
              _md(RESULT_HEADERS, across) if across else
              "No multi-server run (`invoke up` and `invoke bench --nodes 2` make one).", ""]
    comp = compression_rows(records)
    parts += ["## Gradient compression\n",
              _md(COMPRESSION_HEADERS, comp) if comp else
              "No configuration was run with more than one compression.", ""]
    if has_strategies(records):
        parts += ["## Parallel strategies\n", _md(STRATEGY_HEADERS, strategy_rows(records)), "",
                  "Held: the bytes each rank keeps in parameters, gradients and optimizer state, "
                  "summed over its tensors' storages; peak: its resident set on CPUs, torch's "
                  "peak allocation on GPUs; one figure per rank, rank 0 first.", ""]
        if "memory.png" in images:
            parts += ["![memory](memory.png)\n"]
    curves = [i for i in images if i != "memory.png"]
    if curves:
        parts += ["## Scalability\n"] + [f"![{i.split('.')[0]}]({i})\n" for i in curves]
    parts += ["## Analysis\n"] + [f"- {s}" for s in analysis(records)] + [""]
    fails = failure_rows(records)
    if fails:
        parts += ["## Failures\n", _md(["framework", "back end", "compression", "workers", "status",
                                         "host", "reason"], fails), ""]
    parts += ["Speedup and efficiency are against the same configuration with 1 worker; the "
              "compute-to-communication ratio takes the 1-worker step as compute and the extra "
              "step time with more workers as communication and waiting. Wire bytes are an "
              "estimate for ring algorithms (see the results schema).", ""]
    return "\n".join(parts)


def write(path: str) -> Path:
    records = load(path)
    out_dir = Path(path)
    images = plot(records, out_dir)
    report = out_dir / "report.md"
    report.write_text(render(records, images, str(path)))
    return report
