"""Where each rank says how far it got, and how long silence means a stall: the one
format the ranks write (lab.worker.heartbeat) and bench's stall watch reads
(lab.host.watch.stall). Standard library only.

Two channels carry a heartbeat to the watch; the place to run says which
(Runner.heartbeat_channel) and bench tells the ranks in CHANNEL_VAR:
- "folder": each rank keeps <run>/heartbeats/<attempt>/rank-N.json (its phase and step,
  replaced atomically while it advances) and rank-N.stack (its Python stacks, written by
  faulthandler's watchdog when the rank itself has not advanced for its bound);
- "stream" (and "logs", an API's copy of the same output): each rank prints one line
  `@lab-beat {json}` when its heartbeat changed (at most every STREAM_S), and
  `@lab-stack {json}` with its main thread's top frames when it has not advanced for its
  bound; the watch finds them in the launcher's output behind any prefix the launcher
  puts before a rank's line (mpirun's "[1,0]<stdout>:", horovodrun's "[0]<stdout>:",
  torchrun's "[default0]:") and bench keeps them out of what it echoes and records.

The bound (seconds without an advance after which a rank counts as stalled), by phase;
S is --stall-s (0: auto):
- import (of torch): max(S, IMPORT_S);
- rendezvous: S, or RENDEZVOUS_S when auto;
- setup, finish (and done/failed: a launcher that has not exited after every rank is
  done is ended after this): S, or STARTUP_S when auto;
- a step (warm-up or timed): never under the floor F = S (auto: STEP_MIN_S), and
  once a step has been timed, STEP_FACTOR times the slowest step so far when that is
  more; in the very first step, once its forward is timed (the rank marks where it is in
  the step: forward, backward, optimizer; on a GPU the device is synchronised at both
  ends of that forward, whose calls otherwise return once their kernels are queued),
  STEP_FACTOR times FORWARD_SHARE times that forward; before that first forward is timed nothing of this run's speed is known:
  max(S, STARTUP_S). So --stall-s bounds silence outside steps and is a floor for steps,
  never a cap that cuts a step that is merely slow;
- compile (--compile: the compiler running inside a step, lab.worker.compiled): max(S,
  COMPILE_S), whatever the steps took: a compile costs tens of steps' time or more;
- evaluation: max(S or STARTUP_S, STEP_FACTOR x the slowest step x the test batches);
- checkpoint (a checkpoint saved after a step, or loaded at a relaunch's start; the rank
  says which in `where`, "save" or "load", and the bytes of the state in
  `checkpoint_bytes` once it knows them): never under the bound outside steps (S, or
  STARTUP_S when auto) nor the step's once a step was timed, and the bytes at
  CHECKPOINT_MB_S (LAB_CHECKPOINT_MB_S when set) when that takes longer, so a large save
  on slow shared storage is not cut as a stall."""
from __future__ import annotations

import json
import os
import re

# The phases of a rank, in order; "step" and "warm-up" carry the step number and
# where in the step the rank is ("before": loading its batch or anywhere in the loop
# outside the step; "forward", "backward" (DDP waits for its all-reduce at its end),
# "optimizer" (Horovod's synchronize waits there; lab.worker.strategies.base cites
# both); "in": inside a strategy's step that marks no part of it). "checkpoint": between
# steps, saving one ("save"), or in setup, a relaunch loading one ("load").
PHASES = ("import", "rendezvous", "setup", "checkpoint", "warm-up", "step", "compile", "evaluation",
          "finish", "done")
FLUSH_S = 0.5          # a rank writes its heartbeat at most this often
STREAM_S = 2.0         # a rank prints its heartbeat line at most this often
CHANNEL_VAR = "LAB_HEARTBEAT_CHANNEL"
CHANNELS = ("folder", "stream", "logs")
BEAT_MARK, STACK_MARK = "@lab-beat ", "@lab-stack "
# The defaults (see above): the rendezvous under lab.worker.dist's 300 s collective
# timeout, which would end it with a failure saying less; a loaded 2-core machine runs
# ResNet-50 steps of several seconds, and ten times the slowest is no jitter.
RENDEZVOUS_S = 180.0
STARTUP_S = 300.0
IMPORT_VAR = "LAB_IMPORT_S"
CHECKPOINT_VAR = "LAB_CHECKPOINT_MB_S"


def _from_env(var: str, default: float, unit: str, short: str) -> float:
    """`var` as a number above 0 when set, else `default`; any other value ends the
    program with one sentence naming it and the way back to the default."""
    text = os.environ.get(var, "").strip()
    try:
        value = float(text) if text else default
    except ValueError:
        value = -1.0
    if not value > 0:
        raise SystemExit(f"{var} must be a number of {unit} above 0, not {text!r}: "
                         f"unset it for the default {default:g} {short}")
    return value


# The import's bound: LAB_IMPORT_S seconds when set (a node whose Python lives on a slow
# shared filesystem needs more; a test of the queue, less), else 120 s; importing torch
# is never bounded less, even with a short --stall-s.
IMPORT_S = _from_env(IMPORT_VAR, 120.0, "seconds", "s")
# The write (or read) rate a checkpoint's bound assumes, in MB/s: LAB_CHECKPOINT_MB_S when
# set, else 20. Not measured here: a conservative choice for shared storage under load.
# One 1 Gbit/s link carries about 110 MB/s to an NFS server before several ranks and
# jobs share it and torch.save's file is fsynced (lab.worker.checkpoint.write_atomic); a
# cloud's cold network disk starts lower still. A slower store sets it lower; a rank
# whose save needs longer than its bytes at this rate is called stalled.
CHECKPOINT_MB_S = _from_env(CHECKPOINT_VAR, 20.0, "MB per second", "MB/s")
# The compiler's bound (--compile): LAB_COMPILE_S seconds when set, else 1200. Not measured
# as a ceiling: ResNet-50's compile took minutes on this 2-core machine (docs/pages/running.md),
# and a compile waits for no other rank.
COMPILE_VAR = "LAB_COMPILE_S"
COMPILE_S = _from_env(COMPILE_VAR, 1200.0, "seconds", "s")
STEP_FACTOR = 10.0
STEP_MIN_S = 60.0
FORWARD_SHARE = 3.0    # a step is about three forwards (the backward about two)


def folder(run_dir, attempt: str) -> str:
    return os.path.join(str(run_dir), "heartbeats", attempt or "manual")


def beat_path(run_dir, attempt: str, rank: int) -> str:
    return os.path.join(folder(run_dir, attempt), f"rank-{rank}.json")


def stack_path(run_dir, attempt: str, rank: int) -> str:
    return os.path.join(folder(run_dir, attempt), f"rank-{rank}.stack")


def bound_s(stall_s: float, phase: str, slowest_step_s: float | None,
            eval_steps: float = 0, forward_s: float | None = None,
            checkpoint_bytes: int | None = None) -> float:
    """Seconds without an advance after which a rank in `phase` counts as stalled (the
    rules are the module's docstring). `forward_s`: the first step's forward, timed;
    `checkpoint_bytes`: the state a checkpoint phase saves or loads."""
    if phase == "checkpoint":
        ordinary = max(bound_s(stall_s, "setup", None),
                       bound_s(stall_s, "step", slowest_step_s) if slowest_step_s else 0.0)
        return max(ordinary, (checkpoint_bytes or 0) / (CHECKPOINT_MB_S * 1e6))
    if phase == "import":
        return max(stall_s, IMPORT_S)
    if phase == "compile":
        return max(stall_s, COMPILE_S)
    if phase in ("warm-up", "step"):
        floor = stall_s if stall_s > 0 else STEP_MIN_S
        if slowest_step_s:
            return max(floor, STEP_FACTOR * slowest_step_s)
        if forward_s:
            return max(floor, STEP_FACTOR * FORWARD_SHARE * forward_s)
        return max(stall_s, STARTUP_S)
    if phase == "evaluation" and slowest_step_s:
        return max(stall_s if stall_s > 0 else STARTUP_S,
                   STEP_FACTOR * slowest_step_s * max(1.0, eval_steps))
    if stall_s > 0:
        return stall_s
    return RENDEZVOUS_S if phase == "rendezvous" else STARTUP_S


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


WHERE = {"before": "before its step: loading its batch or outside the step",
         "forward": "in its step's forward", "backward": "in its step's backward and its all-reduce",
         "optimizer": "in its optimizer's step (Horovod: waiting for its all-reduce)",
         "in": "inside its step: forward, backward, collectives"}


def describe(beat: dict | None) -> str:
    """"step 20 (before its step)", "rendezvous", "not started"."""
    if not beat:
        return ("not started (no heartbeat: its launcher never ran the worker, or it writes "
                "to a results folder that is not the one bench reads)")
    phase = beat.get("phase", "?")
    if phase in ("warm-up", "step"):
        where = WHERE.get(beat.get("where"), "")
        return f"{phase} {beat.get('step')}" + (f" ({where})" if where else "")
    if phase == "evaluation":
        return f"evaluation after step {beat.get('step')}"
    if phase == "checkpoint":
        return checkpoint_doing(beat)
    if phase == "compile":
        return f"compiling in step {beat.get('step')}"
    return phase


def megabytes(n: int | None) -> str:
    """"96 MB", "0.17 MB"; "size not known yet" before the rank said it."""
    if n is None:
        return "size not known yet"
    return f"{n / 1e6:,.0f} MB" if n >= 10e6 else f"{n / 1e6:.2g} MB"


def checkpoint_doing(beat: dict) -> str:
    """"saving a checkpoint after step 20 (96 MB)", "loading a checkpoint (96 MB)"."""
    size = megabytes(beat.get("checkpoint_bytes"))
    if beat.get("where") == "load":
        return f"loading a checkpoint ({size})"
    return f"saving a checkpoint after step {beat.get('step')} ({size})"


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


def marker_line(mark: str, fields: dict) -> str:
    """One line of the stream channel: BEAT_MARK or STACK_MARK, then compact JSON."""
    return mark + json.dumps(fields, separators=(",", ":"))


_MARKER = re.compile(r"(@lab-beat|@lab-stack) (\{.*\})\s*$")


def parse_marker(line: str) -> tuple[str, dict] | None:
    """("beat" or "stack", its fields) for a marker line, wherever a launcher's prefix put
    it in the line; None for any other line (or a marker cut short)."""
    m = _MARKER.search(line)
    if not m:
        return None
    try:
        fields = json.loads(m.group(2))
    except ValueError:
        return None
    if not isinstance(fields, dict) or not isinstance(fields.get("rank"), int):
        return None
    return ("beat" if m.group(1) == "@lab-beat" else "stack"), fields
