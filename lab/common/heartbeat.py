"""Where each rank says how far it got, and how long silence means a stall: the one
format the ranks write (lab.worker.heartbeat) and bench's stall watch reads
(lab.host.stall). Standard library only.

Each rank keeps <run>/heartbeats/<attempt>/rank-N.json (its phase and step, replaced
atomically while it advances) and rank-N.stack (its Python stacks, written by
faulthandler's watchdog when the rank itself has not advanced for its bound)."""
from __future__ import annotations

import json
import os
import re

# The phases of a rank, in order; "step" and "warm-up" carry the step number and
# where in the step the rank is ("before": loading its batch or anywhere in the loop
# outside the step; "in": forward, backward and the step's collectives).
PHASES = ("import", "rendezvous", "setup", "warm-up", "step", "evaluation", "finish", "done")
FLUSH_S = 0.5          # a rank writes its heartbeat at most this often
# The default bound (no --stall-s): the rendezvous a fixed RENDEZVOUS_S (under
# lab.worker.dist's 300 s collective timeout, which would end it with a failure saying
# less); setup (data, model, a strategy's engine, the first broadcast), the steps before
# one has been timed and the finish (the last gathers, the record) a fixed STARTUP_S;
# steps a multiple of the slowest step so far, never under STEP_MIN_S (a loaded 2-core
# machine runs ResNet-50 steps of several seconds; ten times the slowest is no jitter).
RENDEZVOUS_S = 180.0
STARTUP_S = 300.0
IMPORT_S = 120.0       # importing torch: never less, even with a short --stall-s
STEP_FACTOR = 10.0
STEP_MIN_S = 60.0


def folder(run_dir, attempt: str) -> str:
    return os.path.join(str(run_dir), "heartbeats", attempt or "manual")


def beat_path(run_dir, attempt: str, rank: int) -> str:
    return os.path.join(folder(run_dir, attempt), f"rank-{rank}.json")


def stack_path(run_dir, attempt: str, rank: int) -> str:
    return os.path.join(folder(run_dir, attempt), f"rank-{rank}.stack")


def bound_s(stall_s: float, phase: str, slowest_step_s: float | None,
            eval_steps: float = 0) -> float:
    """Seconds without an advance after which a rank in `phase` counts as stalled.
    stall_s > 0 (--stall-s): that, in every phase but the import of torch; 0: the
    default above (evaluation: the slowest step times the test batches, times the
    factor)."""
    if phase == "import":
        return max(stall_s, IMPORT_S)
    if stall_s > 0:
        return stall_s
    if phase == "rendezvous":
        return RENDEZVOUS_S
    if phase in ("warm-up", "step") and slowest_step_s:
        return max(STEP_MIN_S, STEP_FACTOR * slowest_step_s)
    if phase == "evaluation" and slowest_step_s:
        return max(STARTUP_S, STEP_FACTOR * slowest_step_s * max(1.0, eval_steps))
    return STARTUP_S


def write(path: str, beat: dict) -> None:
    """Replace the heartbeat at once (a reader never sees half of one)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(beat, f)
    os.replace(tmp, path)


def read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def describe(beat: dict | None) -> str:
    """"step 20 (before its step)", "rendezvous", "not started"."""
    if not beat:
        return ("not started (no heartbeat: its launcher never ran the worker, or it writes "
                "to a results folder that is not the one bench reads)")
    phase = beat.get("phase", "?")
    if phase in ("warm-up", "step"):
        where = {"before": "before its step: loading its batch or outside the step",
                 "in": "inside its step: forward, backward, collectives"}.get(beat.get("where"), "")
        return f"{phase} {beat.get('step')}" + (f" ({where})" if where else "")
    if phase == "evaluation":
        return f"evaluation after step {beat.get('step')}"
    return phase


# faulthandler's dump: "Thread 0x00007f... (most recent call first):" (or "Current
# thread ..."), then '  File "path", line N in name' per frame, most recent first
# (CPython's Python/traceback.c, dump_frame and write_thread_id).
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def main_thread_frames(dump: str, main_ident: int | None) -> list[str]:
    """The frames of the main thread in a faulthandler dump (the last dump in the text),
    most recent first, as "file.py:LINE in name"; the first thread when the main one's id
    is unknown."""
    threads: dict[int, list[str]] = {}
    order: list[int] = []
    current = None
    for line in dump.splitlines():
        if line.startswith("Timeout ("):        # a new dump: forget the older one
            threads, order, current = {}, [], None
            continue
        m = _THREAD.match(line)
        if m:
            current = int(m.group(1), 16)
            threads[current] = []
            order.append(current)
            continue
        m = _FRAME.match(line)
        if m and current is not None:
            threads[current].append(f"{os.path.basename(m.group(1))}:{m.group(2)} in {m.group(3)}")
    if main_ident in threads:
        return threads[main_ident]
    return threads[order[0]] if order else []
