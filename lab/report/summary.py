"""The results table of the lab report (back end, servers, devices per server, time per
step, throughput, speedup), computed from records alone."""
from __future__ import annotations

from lab.common import metrics
from lab.report import markdown

COLUMNS = ("model", "framework", "back end", "compression", "servers", "devices per server", "np",
           "time per step (ms)", "throughput (img/s)", "speedup", "efficiency", "accuracy")

# Fields that make two runs "the same configuration" apart from the number of processes.
_SAME = ("model", "framework", "backend", "device", "data", "batch_size", "compression",
         "epochs", "max_steps", "threads")


def accuracy(record: dict) -> float | None:
    """The test accuracy, or None on synthetic data: random labels have nothing to learn,
    so a figure near 10% there means nothing."""
    if record.get("config", {}).get("data") == "synthetic":
        return None
    return record["figures"]["test_accuracy"]


def config_key(record: dict) -> tuple:
    c = record.get("config", {})
    return tuple(c.get(k) for k in _SAME)


def rows(records: list[dict]) -> list[dict]:
    """One row per record, in order; speedup and efficiency against the fastest
    one-process ok run of the same configuration among these records."""
    baselines: dict[tuple, float] = {}
    for r in records:
        if r.get("status") == "ok" and r["world"]["np"] == 1:
            key = config_key(r)
            baselines[key] = max(baselines.get(key, 0.0), r["figures"]["throughput_img_s"])
    out = []
    for r in records:
        c = r.get("config", {})
        row = {"model": c.get("model"), "framework": c.get("framework"),
               "back end": c.get("backend"), "compression": c.get("compression"),
               "np": r["world"]["np"]}
        if r.get("status") != "ok":
            row.update({"servers": r["world"]["nodes"], "devices per server": None,
                        "failed": r.get("error", {}).get("reason", "failed"),
                        "status": r.get("status", "failed")})
            out.append(row)
            continue
        w, f = r["world"], r["figures"]
        row.update({"servers": w["nodes"], "devices per server": w["devices_per_node"],
                    "time per step (ms)": f["step_time_mean_s"] * 1000,
                    "throughput (img/s)": f["throughput_img_s"],
                    "accuracy": accuracy(r)})
        base = baselines.get(config_key(r))
        if base:
            s = metrics.speedup(f["throughput_img_s"], base)
            row["speedup"] = s
            row["efficiency"] = metrics.efficiency(s, w["np"])
        out.append(row)
    return out


def render(table_rows: list[dict]) -> str:
    def cell(row, col):
        if "failed" in row and col not in ("model", "framework", "back end", "compression", "np",
                                           "servers"):
            if col != "time per step (ms)":
                return ""
            reason = row["failed"]
            return (row.get("status", "failed").upper() + ": "
                    + (reason if len(reason) <= 70 else reason[:67] + "..."))
        if "failed" in row and col == "servers":
            return "" if row.get("servers") is None else str(row["servers"])
        v = row.get(col)
        if v is None:
            return "n/a" if col in ("speedup", "efficiency", "accuracy") else ""
        if col == "time per step (ms)":
            return f"{v:.2f}"
        if col == "throughput (img/s)":
            return f"{v:,.0f}" if v >= 100 else f"{v:.2f}"
        if col in ("speedup",):
            return f"{v:.2f}"
        if col in ("efficiency", "accuracy"):
            return f"{v:.1%}"
        return str(v)

    return markdown.table(COLUMNS, [[cell(r, c) for c in COLUMNS] for r in table_rows])
