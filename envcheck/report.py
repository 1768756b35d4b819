"""Rendering the doctor's results: a table (where, check, status, value, fix), a
one-line summary, or JSON. Nothing here measures anything.

The table fits the columns lab.common.display.width decides (the terminal's, else
$COLUMNS, else WIDTH, 120): a check's name wraps within its column, a value or a
fix wraps over two lines of its column, and one longer than that is a numbered note under
the table (its cell says `[n]`), wrapped to the same width; `width=None` (doctor --wide) puts everything on its
row, however long. JSON always carries everything."""
from __future__ import annotations

import json
import re
import textwrap

from envcheck.probes import FAIL, PASS, SKIP, WARN
from lab.common import display

ORDER = (PASS, WARN, FAIL, SKIP)


def short(name: str, value) -> str:
    """One readable cell for a probe's value."""
    if value is None:
        return ""
    if name.startswith("collectives") and isinstance(value, dict):
        return collectives_line(value)
    if name == "nccl_all_reduce_perf" and isinstance(value, dict):
        big = value["rows"][-1]
        return (f"{value['gpus']} GPU(s): busbw {big['busbw_gbs']:.3g} GB/s, algbw "
                f"{big['algbw_gbs']:.3g} GB/s at {big['size_bytes'] / 2**20:g} MiB")
    if name == "mpi_hello" and isinstance(value, dict):
        return (f"{len(value['ranks'])}/{value['np']} ranks on {', '.join(value['hosts'])}; "
                f"all-reduce {'OK' if value['allreduce_ok'] else 'WRONG'}; MPIX_Query_cuda_support "
                f"(the library's build): {value.get('cuda_support_query')}")
    if name == "horovod" and isinstance(value, dict):
        return (f"{value['version']}: {'/'.join(value.get('frameworks', []))}; controllers "
                f"{'/'.join(value.get('controllers', []))}; ops {'/'.join(value.get('tensor_operations', []))}; "
                f"GPU ops {value.get('gpu_operations')}")
    if name == "gpus" and isinstance(value, dict):
        names = sorted({d["name"] for d in value.get("devices", [])})
        return f"{value.get('count')} x {', '.join(names)}; driver {value.get('driver')}"
    if name == "lab_images" and isinstance(value, dict):
        return "; ".join(f"{tag} ({v.get('flavor')}, torch {v.get('torch_version')}"
                         + (f", CUDA {v['cuda_version']}, {v.get('horovod_gpu_operations')}" if v.get("cuda_version") else "")
                         + ")" for tag, v in value.items())
    if name == "cudnn" and isinstance(value, int):
        from lab.common.kit import cudnn_version_text
        return f"{cudnn_version_text(value)} ({value})"
    if name == "mpi_cuda_build":
        return "CUDA-aware (ompi_info)" if value else "not CUDA-aware (ompi_info)"
    if name == "memlock" and isinstance(value, int):
        return f"{value / 2**20:g} MiB"
    if name == "shm" and isinstance(value, dict):
        return f"{value['bytes'] / 2**30:.2f} GiB"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def size_text(nbytes: int) -> str:
    """4 KiB, 16 MiB, 1 GiB: a message size as nccl-tests' sweeps name them."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes / 1024:g} KiB"


# Why one rank gets a copy instead of collectives (nccl-tests doc/PERFORMANCE.md: the bus
# factors are 0 at n = 1, all-reduce's 2(n-1)/n and the gathers' (n-1)/n).
ONE_RANK = ("one rank: no collective timed, since nothing crosses a bus and nccl-tests' bus "
            "bandwidth is 0 by definition; its copy instead")


def collectives_line(value: dict) -> str:
    """Each collective's bus bandwidth at the largest size, as a share of the reference
    (the memory copy bandwidth; on GPUs also their links, NVLink or PCIe), and the
    all-reduce's time at the smallest size; nccl-tests' all-reduce beside, where it ran.
    One rank: its copy's bandwidth at the largest size and time at the smallest, and why."""
    if not value["ops"] and value.get("copy"):
        big, small = value["copy"][-1], value["copy"][0]
        what = "device-to-device copy" if value["backend"] == "nccl" else "memory copy"
        return (f"{value['backend']}, {ONE_RANK}: {what} {big['gbs']:.3g} GB/s at "
                f"{size_text(big['size_bytes'])} (read + written), {small['time_us']:.0f} us at "
                f"{size_text(small['size_bytes'])}")
    refs = [r for r in (value.get("reference"), value.get("link")) if r and r.get("gbs")]
    parts = []
    for op, rows in value["ops"].items():
        big = rows[-1]
        share = "/".join(f"{big['busbw_gbs'] / r['gbs']:.0%}" for r in refs)
        parts.append(f"{op} {big['busbw_gbs']:.3g}" + (f" ({share})" if share else ""))
    big = next(iter(value["ops"].values()))[-1]
    small = value["ops"].get("allreduce", next(iter(value["ops"].values())))[0]
    head = f"{value['backend']}, {value['ranks']} ranks, busbw GB/s at {size_text(big['size_bytes'])}"
    of = (" (share of the " + " / of ".join(f"{r['name']}, {r['gbs']:.3g} GB/s" for r in refs) + ")"
          if refs else "")
    line = (f"{head}{of}: {', '.join(parts)}; all-reduce {small['time_us']:.0f} us at "
            f"{size_text(small['size_bytes'])}")
    ref = value.get("nccl_tests")
    if ref:
        line += (f"; nccl-tests all_reduce_perf (the reference), {ref['gpus']} GPU(s): busbw "
                 f"{ref['busbw_gbs']:.3g} GB/s at {size_text(ref['size_bytes'])}")
    return line


HEADERS = ["where", "check", "status", "value", "fix"]
WIDTH = display.DEFAULT  # where there is no terminal and no $COLUMNS: 120
GAP = "  "           # between columns
CHECK_MAX = 30       # a longer check name wraps within this
VALUE_MIN = 12       # the fewest columns the value and the fix are each given
CELL_LINES = 2       # a value or fix wraps over this many lines at most, else it is a note


def _one_line(text) -> str:
    return " ".join(str(text or "").split())


def rows(checks: list[dict]) -> list[list[str]]:
    return [[c["where"], c["name"], c["status"], _one_line(short(c["name"], c["value"])),
             _one_line(c["fix"])] for c in checks]


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


def _lines(cells: list[list[str]], widths: list[int]) -> list[str]:
    """One row (each cell a list of lines) as text lines, the last column unpadded."""
    height = max(len(c) for c in cells)
    out = []
    for i in range(height):
        parts = [(c[i] if i < len(c) else "").ljust(w) for c, w in zip(cells, widths)]
        out.append(GAP.join(parts).rstrip())
    return out


def table(checks: list[dict], width: int | None = WIDTH) -> str:
    """A plain-text table for the terminal, at most `width` columns wide (None: as wide
    as its longest row), long values and fixes moved to numbered notes under it."""
    body = rows(checks)
    if width is None:
        widths = [max(len(x) for x in col) for col in zip(HEADERS, *body)]
        return "\n".join(_lines([[h] for h in HEADERS], widths)
                         + [GAP.join("-" * w for w in widths)]
                         + [ln for r in body for ln in _lines([[c] for c in r], widths)])
    w_where = max(len(x) for x in [HEADERS[0]] + [r[0] for r in body])
    w_status = max(len(x) for x in [HEADERS[2]] + [r[2] for r in body])
    w_check = min(CHECK_MAX, max(len(x) for x in [HEADERS[1]] + [r[1] for r in body]))
    # value and fix keep VALUE_MIN columns each: on a narrow terminal the check's name
    # wraps in fewer columns first, and only then is the table wider than asked
    fixed = w_where + w_status + 4 * len(GAP)
    w_check = max(len(HEADERS[1]), min(w_check, width - fixed - 2 * VALUE_MIN))
    left = max(width - fixed - w_check, 2 * VALUE_MIN)
    # The split between value and fix that leaves the fewest notes (ties: the most even).
    w_value = min(range(len(HEADERS[3]), left - len(HEADERS[4]) + 1),
                  key=lambda v: (sum(len(_wrap(r[3], v)) > CELL_LINES for r in body)
                                 + sum(len(_wrap(r[4], left - v)) > CELL_LINES for r in body),
                                 abs(left - 2 * v)))
    w_value = min(w_value, max(len(x) for x in [HEADERS[3]] + [r[3] for r in body]))
    w_fix = left - w_value
    notes: list[str] = []

    def fit(text: str, room: int, what: str, row: list[str]) -> list[str]:
        lines = _wrap(text, room)
        if len(lines) <= CELL_LINES:
            return lines
        notes.append(f"[{len(notes) + 1}] {row[1]} ({row[0]}), {what}: {text}")
        return [f"[{len(notes)}]"]

    lines = _lines([[h] for h in HEADERS], [w_where, w_check, w_status, w_value, w_fix])
    lines.append(GAP.join("-" * w for w in (w_where, w_check, w_status, w_value, w_fix)))
    for r in body:
        cells = [[r[0]], textwrap.wrap(r[1], w_check, break_on_hyphens=False) or [""], [r[2]],
                 fit(r[3], w_value, "value", r), fit(r[4], w_fix, "fix", r)]
        lines += _lines(cells, [w_where, w_check, w_status, w_value, w_fix])
    if notes:
        lines.append("")
        for n in notes:
            lines += textwrap.wrap(n, width, subsequent_indent="    ", break_on_hyphens=False,
                                   break_long_words=True)
    return "\n".join(lines)


def line(text: str, width: int | None = WIDTH) -> str:
    """A message printed beside the table (where the stack is checked), wrapped to width."""
    return text if width is None else "\n".join(textwrap.wrap(text, width, break_on_hyphens=False)
                                                 or [""])


NO_GPU = re.compile(r"\bno (NVIDIA )?GPU|fewer than two GPUs", re.I)


def fold_skips(checks: list[dict]) -> tuple[list[dict], list[str]]:
    """(the rows to show, the lines under the table): on a machine without a GPU, the
    checks skipped for want of one (the `gpus` check's SKIP, and every SKIP whose reason
    says there is no GPU) as one line with the cause; nothing folded where fewer than two are."""
    cause = next((c["fix"] for c in checks if c["name"] == "gpus" and c["status"] == SKIP), None)
    if cause is None:
        return checks, []
    folded = [c for c in checks if c["status"] == SKIP
              and (c["name"] == "gpus" or NO_GPU.search(str(c.get("fix") or "")))]
    if len(folded) < 2:
        return checks, []
    names = ", ".join(c["name"].removeprefix("finding: ") for c in folded)
    return ([c for c in checks if not any(c is f for f in folded)],
            [f"skipped {len(folded)} checks that need a GPU ({names}): {_one_line(cause)} "
             f"(`invoke doctor --all` shows each)"])


def counts(checks: list[dict]) -> dict:
    return {s: sum(1 for c in checks if c["status"] == s) for s in ORDER}


SLOW_CHECK_S = 1.0     # a check this long is named in the summary line


def summary(checks: list[dict], seconds: float, width: int | None = None) -> str:
    """The one-line verdict under the table, wrapped to `width` (None: one line)."""
    n = counts(checks)
    verdict = "problems found" if n[FAIL] else "nothing failed"
    slow = sorted((c for c in checks if (c.get("seconds") or 0) >= SLOW_CHECK_S),
                  key=lambda c: -c["seconds"])[:3]
    took = "; slowest: " + ", ".join(f"{c['name']} {c['seconds']:.1f} s" for c in slow) if slow else ""
    return display.wrap(f"doctor: {len(checks)} checks in {seconds:.1f} s: {n[PASS]} PASS, {n[WARN]} WARN, "
                        f"{n[FAIL]} FAIL, {n[SKIP]} SKIP; {verdict}{took}", width)


def as_json(checks: list[dict], seconds: float, notes: list[str]) -> str:
    return json.dumps({"checks": checks, "counts": counts(checks), "seconds": round(seconds, 2),
                       "notes": notes}, default=str)
