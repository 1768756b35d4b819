"""The scalability curves: throughput and speedup against workers (throughput.png,
speedup.png), one panel per setup and back end, with the repeats' spread as error bars
and the ideal line; matplotlib is imported only when a figure is drawn."""
from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from lab.report import summary
from lab.report.records import ok, oversubscribed, setup_label
from lab.report.strategies import has_strategies, memory_figure


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
    compression): [(workers, throughput summary, speedup summary or None, oversubscribed)]}},
    from the table's rows (medians of the repeats with their spread)."""
    out: dict = defaultdict(lambda: defaultdict(list))
    for row in summary.rows(records):
        if "failed" in row:
            continue
        r = row["record"]
        key = (setup_label(r, records), row["back end"], r["world"]["nodes"] > 1)
        out[key][(row["framework"], row["compression"])].append(
            (row["np"], row["throughput_summary"], row.get("speedup_summary"),
             any(oversubscribed(x) for x in row["records"])))
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
        drawn = marked = False
        for ax, ((setup, backend, across), series_) in zip(axes.flat, data.items()):
            xmax = max(n for pts in series_.values() for n, *_ in pts)
            ideal_drawn = False
            for k, ((fw, comp), pts) in enumerate(series_.items()):
                # Series side by side at each worker count, so their error bars do not
                # hide one another.
                dx = (k - (len(series_) - 1) / 2) * 0.03
                xs = [n + dx for n, *_ in pts]
                if name == "throughput.png":
                    ys = [t.median for _, t, *_ in pts]
                    lo = [t.median - t.low for _, t, *_ in pts]
                    hi = [t.high - t.median for _, t, *_ in pts]
                    one = next((t.median for n, t, *_ in pts if n == 1), None)
                    ideal = ([1, xmax], [one, one * xmax]) if one else None
                else:
                    pts = [p for p in pts if p[2] is not None]
                    if not pts:
                        continue
                    xs = [n + dx for n, *_ in pts]
                    ys = [sp.median for _, _, sp, _ in pts]
                    lo = [sp.median - sp.low for _, _, sp, _ in pts]
                    hi = [sp.high - sp.median for _, _, sp, _ in pts]
                    ideal = ([1, xmax], [1, xmax])
                ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3,
                            color=FRAMEWORK_COLORS.get(fw, "tab:gray"),
                            linestyle=COMPRESSION_STYLES.get(comp, "-"), label=f"{fw}, {comp}")
                drawn = True
                over = [(x, y) for x, y, p in zip(xs, ys, pts) if p[3]]
                if over:        # oversubscribed: ringed, never read as scaling
                    ax.scatter(*zip(*over), s=110, facecolors="none", edgecolors="red",
                               linewidths=1.4, zorder=5, label="_oversubscribed")
                    marked = True
                if ideal and (name == "throughput.png" or not ideal_drawn):
                    ax.plot(*ideal, color=FRAMEWORK_COLORS.get(fw, "tab:gray") if name == "throughput.png"
                            else "grey", linewidth=0.8, alpha=0.5, linestyle=(0, (1, 2)))
                    ideal_drawn = True
            ax.set_title(f"{setup}{backend}" + (", across servers" if across else ""), fontsize=10)
            ax.set_xticks(sorted({n for pts in series_.values() for n, *_ in pts}))
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
                   + [Line2D([], [], color="grey", linestyle=(0, (1, 2)), label="ideal (linear)")]
                   + ([Line2D([], [], marker="o", linestyle="", markerfacecolor="none",
                              markeredgecolor="red", label="oversubscribed")] if marked else []))
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
