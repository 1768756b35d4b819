"""The scalability curves as a student draws them: throughput and speedup against
workers (throughput.png, speedup.png), one panel per model, a line per framework and back
end (solid within one server, dashed across servers, from the same 1-worker baseline),
the repeats' spread as error bars and the ideal line; the configurations that ran at one
worker count only (the strategies, compression at 2 workers) have no curve and go to a
chart of their own (one-count.png). matplotlib is imported only when a figure is drawn."""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

from lab.report import summary
from lab.report.records import SETUP_NAMES, link_label, ok, oversubscribed, setup_key, setup_label, setup_part
from lab.report.strategies import has_strategies, memory_figure

CURVE_FILES = ("throughput.png", "speedup.png")
ONE_COUNT_FILE = "one-count.png"


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


# A line's colour is its framework and back end, the same in every panel and figure.
STACK_COLORS = {("horovod", "gloo"): "tab:blue", ("horovod", "mpi"): "tab:purple",
                ("horovod", "nccl"): "tab:cyan", ("horovod", "ccl"): "tab:red",
                ("ddp", "gloo"): "tab:orange",
                ("ddp", "mpi"): "tab:brown", ("ddp", "nccl"): "tab:pink",
                ("none", "gloo"): "tab:green", ("none", "nccl"): "tab:olive"}
# What else tells a panel's lines of one colour apart (compression, a setup): the marker.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
ACROSS_STYLE, WITHIN_STYLE = "--", "-"
IDEAL_STYLE = (0, (1, 2))


def told_apart(r: dict, records: list[dict]) -> str:
    """What tells r's setup apart from the others of `records` (setup_label's fields),
    leaving out a field that tells nothing the fields before it do not (the torch of a
    place: 'cluster', not 'cluster, torch 2.13.0+cpu'); '' when they share one setup."""
    keys = {setup_key(x) for x in records}
    kept: list[int] = []
    for i in range(len(SETUP_NAMES)):
        if len({tuple(k[j] for j in kept + [i]) for k in keys}) > len({tuple(k[j] for j in kept) for k in keys}):
            kept.append(i)
    mine = setup_key(r)
    return ", ".join(setup_part(SETUP_NAMES[i], mine[i], r) for i in kept if mine[i] is not None)


def _stack(row: dict) -> str:
    comp = row["compression"]
    return f"{row['framework']} / {row['back end']}" + (f", {comp}" if comp not in (None, "none") else "")


def lines(records: list[dict]) -> tuple[dict, list[dict]]:
    """What the curves show, from the table's rows (medians of the repeats with their
    spread): ({model: {label: line}}, the rows on no curve). A line is one configuration
    within one server, or across servers from its 1-worker run within one (the speedups'
    baseline); it needs two worker counts. Each line: {"stack": (framework, back end),
    "variant": what else tells it apart in its panel
    (compression, setup; link), "across": bool, "points":
    [(workers, throughput summary, speedup summary or None, oversubscribed)]}."""
    rows = [row for row in summary.rows(records) if "failed" not in row]
    baselines: dict = {}
    for row in rows:
        if row["np"] == 1 and row["servers"] == 1:
            baselines.setdefault(summary.config_key(row["record"]), row)
    by_line: dict = defaultdict(list)
    for row in rows:
        r = row["record"]
        by_line[(summary.config_key(r), row["servers"] > 1, link_label(r))].append(row)
    drawn = {}
    for (config, across, link), rs in by_line.items():
        pts = rs + ([baselines[config]] if across and config in baselines else [])
        if len({row["np"] for row in pts}) > 1:
            drawn[(config, across, link)] = sorted(pts, key=lambda row: row["np"])
    on_curve = {id(row) for pts in drawn.values() for row in pts}
    by_model: dict = defaultdict(dict)
    for (config, across, link), pts in drawn.items():
        model = pts[0]["model"]
        panel = [x for (c, *_), p in drawn.items() if p[0]["model"] == model for row in p
                 for x in row["records"]]
        top = pts[-1]
        comp = top["compression"] if top["compression"] not in (None, "none") else ""
        apart = ", ".join(filter(None, (comp, told_apart(top["record"], panel))))
        label = (f"{top['framework']} / {top['back end']}" + (f", {apart}" if apart else "")
                 + (f", across servers{link}" if across else ""))
        by_model[model][label] = {
            # the link is the marker's too: two links' lines across servers are otherwise alike
            "stack": (top["framework"], top["back end"]), "variant": (apart, link), "across": across,
            "points": [(row["np"], row["throughput_summary"], row.get("speedup_summary"),
                        any(oversubscribed(x) for x in row["records"])) for row in pts]}
    return dict(by_model), [row for row in rows if id(row) not in on_curve]


def panels(records: list[dict]) -> dict:
    """{model: {label: line}}: lines(records)' curves."""
    return lines(records)[0]


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _curve_figure(name: str, data: dict):
    """One of CURVE_FILES from panels(): None when no line has two worker counts."""
    plt = _pyplot()
    from matplotlib.lines import Line2D
    speedup = name == "speedup.png"
    shown = {}
    for model, lines_ in data.items():
        keep = {label: dict(line, points=[p for p in line["points"] if p[2] is not None or not speedup])
                for label, line in lines_.items()}
        keep = {label: line for label, line in keep.items() if len({p[0] for p in line["points"]}) > 1}
        if keep:
            shown[model] = keep
    if not shown:
        return None
    cols = 1 if len(shown) == 1 else 2
    rows_ = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(9 * cols, 4.2 * rows_ + 0.8), squeeze=False,
                             layout="constrained")
    marked = any_across = False
    for ax, (model, lines_) in zip(axes.flat, shown.items()):
        variants = list(dict.fromkeys(line["variant"] for line in lines_.values()))
        xmax = max(p[0] for line in lines_.values() for p in line["points"])
        for k, (label, line) in enumerate(lines_.items()):
            pts = line["points"]
            # Lines side by side at each worker count, so their error bars do not hide
            # one another.
            dx = (k - (len(lines_) - 1) / 2) * 0.03
            xs = [n + dx for n, *_ in pts]
            value = [(sp if speedup else t) for _, t, sp, _ in pts]
            ys = [v.median for v in value]
            color = STACK_COLORS.get(line["stack"], "tab:gray")
            ax.errorbar(xs, ys, yerr=[[v.median - v.low for v in value], [v.high - v.median for v in value]],
                        marker=MARKERS[variants.index(line["variant"]) % len(MARKERS)], capsize=3,
                        color=color, linestyle=ACROSS_STYLE if line["across"] else WITHIN_STYLE,
                        label=label)
            any_across |= line["across"]
            over = [(x, y) for x, y, p in zip(xs, ys, pts) if p[3]]
            if over:        # oversubscribed: ringed, never read as scaling
                ax.scatter(*zip(*over), s=110, facecolors="none", edgecolors="red",
                           linewidths=1.4, zorder=5, label="_oversubscribed")
                marked = True
            one = next((t.median for n, t, *_ in pts if n == 1), None)
            if not speedup and one:     # each line's own: its 1-worker throughput times workers
                ax.plot([1, xmax], [one, one * xmax], color=color, linewidth=0.8, alpha=0.5,
                        linestyle=IDEAL_STYLE, label="_ideal")
        if speedup:
            ax.plot([1, xmax], [1, xmax], color="grey", linewidth=0.8, alpha=0.7,
                    linestyle=IDEAL_STYLE, label="_ideal")
        ax.set_title(model, fontsize=11)
        ax.set_xticks(sorted({p[0] for line in lines_.values() for p in line["points"]}))
        ax.set_xlabel("workers (processes)")
        ax.set_ylabel("speedup (x, against 1 worker)" if speedup else "throughput (images/s)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8, frameon=False)
    for ax in list(axes.flat)[len(shown):]:
        ax.remove()
    # One legend for the figure: what the line styles and marks mean (colours and
    # markers: each panel's own legend).
    handles = ([Line2D([], [], color="black", linestyle=WITHIN_STYLE, label="within one server")]
               + ([Line2D([], [], color="black", linestyle=ACROSS_STYLE, label="across servers")]
                  if any_across else [])
               + [Line2D([], [], color="grey", linestyle=IDEAL_STYLE,
                         label="ideal (linear)" if speedup else "ideal (linear, from 1 worker)")]
               + ([Line2D([], [], marker="o", linestyle="", markerfacecolor="none",
                          markeredgecolor="red", label="oversubscribed")] if marked else []))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8)
    fig.suptitle(("Speedup" if speedup else "Throughput")
                 + " against workers (error bars: the repeats' spread)", fontsize=12)
    return fig


def figures(records: list[dict]) -> dict:
    """{file name: matplotlib Figure}: throughput and speedup against workers, one panel
    per model, colour by framework and back end, solid within one server and dashed
    across servers, a marker for what else tells a panel's lines apart, error bars from
    the repeats' spread, the ideal line; and one-count.png when some configuration ran
    at one worker count only."""
    data, alone = lines(records)
    out = {}
    for name in CURVE_FILES:
        fig = _curve_figure(name, data)
        if fig is not None:
            out[name] = fig
    if alone:
        out[ONE_COUNT_FILE] = one_count_figure(alone)
    return out


def one_count_figure(rows: list[dict]):
    """one-count.png: the throughput of each configuration that ran at one worker count
    only (no curve to draw), one panel per model, a bar per configuration with the
    repeats' spread."""
    plt = _pyplot()
    by_model: dict = defaultdict(list)
    for row in rows:
        by_model[row["model"]].append(row)
    heights = [0.9 + 0.32 * len(rs) for rs in by_model.values()]
    fig, axes = plt.subplots(len(by_model), 1, figsize=(10, sum(heights) + 0.8), squeeze=False,
                             height_ratios=heights, layout="constrained")
    for ax, (model, rs) in zip(axes.flat, by_model.items()):
        recs = [x for row in rs for x in row["records"]]
        labels = [", ".join(filter(None, (told_apart(row["record"], recs), _stack(row))))
                  + f", {row['np']} workers" + (f" on {row['servers']} servers" if row["servers"] > 1 else "")
                  + (" (oversubscribed)" if any(oversubscribed(x) for x in row["records"]) else "")
                  for row in rs]
        thr = [row["throughput_summary"] for row in rs]
        ys = list(range(len(rs)))
        ax.barh(ys, [t.median for t in thr], xerr=[[t.median - t.low for t in thr], [t.high - t.median for t in thr]],
                color=[STACK_COLORS.get((row["framework"], row["back end"]), "tab:gray") for row in rs],
                capsize=3)
        ax.set_yticks(ys, labels, fontsize=8)
        ax.invert_yaxis()           # the first row on top, as in the tables
        ax.set_title(model, fontsize=11)
        ax.set_xlabel("throughput (images/s)")
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle("Configurations run at one worker count only (error bars: the repeats' spread)",
                 fontsize=12)
    return fig


def plot(records: list[dict], out_dir: Path) -> list[str]:
    """throughput.png and speedup.png (one-count.png when some configuration ran at one
    worker count only, memory.png when strategies ran); returns the file names written."""
    plt = _pyplot()
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
