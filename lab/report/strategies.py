"""The source benchmark's table of parallel strategies (seeds/004): strategy, servers x
devices, throughput, memory per device, accuracy and batch; and the chart of what each
rank holds (memory.png)."""
from __future__ import annotations

from lab.report import summary
from lab.report.records import ok, setup_label


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
    rank, of the repeats' first run (they hold the same). On GPUs the peak cell adds what
    torch's caching allocator reserved at its peak (figures.peak_reserved_bytes), which
    is what the device had to have free."""
    rows = []
    for row in summary.rows(records):
        if "failed" in row:
            continue
        r = row["record"]
        f = r["figures"]
        held = f.get("held_bytes")
        peak = f.get("peak_memory_bytes") or []
        reserved = f.get("peak_reserved_bytes") or [None] * len(peak)
        rows.append([
            strategy_label(r, records),
            f"{row['framework']} / {row['back end']}",
            f"{row['servers']} x {row['devices per server']}",
            summary.with_spread(row, "throughput (img/s)"),
            " / ".join(_mb(h["total"]) for h in held) if held else "n/a",
            " / ".join(_mb(p) + (f" ({_mb(r)} reserved)" if r is not None else "")
                       for p, r in zip(peak, reserved)) if peak else "n/a",
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
    # Constrained layout makes room for the rotated names (tight_layout warned it could
    # not), in a figure sized to hold them: a name at 7 points, rotated 60 degrees, takes
    # about 0.05 inch down and 0.03 inch to the left a character (without the room the
    # layout's axes collapse and matplotlib says so).
    names = [f"{b[0]}, rank {b[1]}" for b in bars]
    longest = max(map(len, names))
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(bars) + 2, 0.03 * longest + 5), 4 + 0.05 * longest),
                           layout="constrained")
    xs = list(range(len(bars)))
    bottom = [0.0] * len(bars)
    for kind, color in HELD_KINDS:
        heights = [b[2].get(kind, 0) / 1e6 for b in bars]
        ax.bar(xs, heights, bottom=bottom, color=color, label=kind.replace("_", " "))
        bottom = [a + h for a, h in zip(bottom, heights)]
    ax.set_xticks(xs, names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("MB held per device")
    ax.set_title("Memory per device by strategy (measured from each rank's tensors)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))      # beside the bars, never on one
    return fig
