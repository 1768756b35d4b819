"""Which rank to blame for a job that failed, and how it ended: from what its launcher
reported (read by lab.host.watch.launcher_output), the failure files its ranks wrote, and the
nodes that stopped. A rank killed from outside (SIGKILL, as the out-of-memory killer does)
writes no failure file, and its peers' files only say that a connection broke: the
launcher is the one witness."""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import signal as _signal
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lab.common import progress

if TYPE_CHECKING:
    from lab.host.places.base import JobResult


def rank_on(end: "RankEnd") -> str:
    return f"rank {end.rank}" + (f" on {end.host}" if end.host else "")


def signal_name(number: int) -> str:
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass
class RankEnd:
    rank: int
    host: str | None = None
    exit_code: int | None = None      # its exit status, when it exited
    signal: int | None = None         # the signal that ended it, when one did

    def how(self) -> str:
        if self.signal is not None:
            return f"was killed by signal {self.signal} ({signal_name(self.signal)})"
        if self.exit_code == SSH_ERROR:
            return (f"exited with code {SSH_ERROR} (over ssh: the remote command was killed by a "
                    f"signal, or the connection failed)")
        return f"exited with code {self.exit_code}"


SSH_ERROR = 255     # ssh(1): "exits with the exit status of the remote command or with 255
#                     if an error occurred"; horovodrun over Gloo reaches another node's rank
#                     over ssh, and a rank SIGKILLed there was reported as "exit with status
#                     code 255" (the simulated cluster, 2026-11-27): not signal 127
SIGNALS_MAX = 64    # a shell's 128+N for a command killed by signal N (N up to SIGRTMAX)


def from_exit_code(rank: int, code: int, host: str | None = None, shell: bool = False) -> RankEnd:
    if code < 0:
        return RankEnd(rank, host, None, -code)
    if shell and 128 < code <= 128 + SIGNALS_MAX:
        return RankEnd(rank, host, code, code - 128)
    return RankEnd(rank, host, code, None)


def srun_task_end(task: int, host: str, what: str) -> RankEnd | None:
    """srun's "task N: <what>": an exit code, or a signal by its strsignal(3) name."""
    m = re.match(r"Exited with exit code (\d+)", what)
    if m:
        return RankEnd(task, host, int(m.group(1)), None)
    names = {"Killed": _signal.SIGKILL, "Terminated": _signal.SIGTERM,
             "Out Of Memory": _signal.SIGKILL,      # the OOM killer's SIGKILL
             "Segmentation fault": _signal.SIGSEGV, "Aborted": _signal.SIGABRT,
             "Bus error": _signal.SIGBUS, "Interrupt": _signal.SIGINT}
    for name, sig in names.items():
        if what.startswith(name):
            return RankEnd(task, host, None, int(sig))
    return None


def cause(ends: list[RankEnd]) -> RankEnd | None:
    """The rank to blame among `ends` (in the order seen): the first killed by a signal a
    launcher does not send when it stops the others (SIGTERM), else the first. A killed
    rank's peer exits at once (a connection reset) and is often reported before it."""
    killed = [e for e in ends if e.signal not in (None, _signal.SIGTERM)]
    lost = [e for e in ends if e.signal is None and e.exit_code == SSH_ERROR]   # over ssh: the
    return (killed or lost or ends or [None])[0]     # remote rank killed, or its link lost


def attribute_failure(res: JobResult, failure_dir, dead: dict,
                      launcher: RankEnd | None = None, beats: dict | None = None) -> tuple[dict, str]:
    """(the rank and host to blame, when known; the reason) for a job that failed. A
    node that stopped comes first; then a rank the launcher saw killed by a signal, or
    whose ssh said 255 (SSH_ERROR; it wrote nothing, and its peers' failure files only
    describe their reaction); then the
    earliest failure file a rank wrote; then what the launcher said of the first rank
    that exited non-zero; then the launcher's own last words. A launcher that names the
    rank alone (horovodrun over Gloo) gets its host from the rank's last heartbeat
    (`beats`: rank -> heartbeat, lab.host.watch.stall.StallWatch.beats)."""
    beat = (beats or {}).get(launcher.rank) if launcher and launcher.host is None else None
    if beat and beat.get("host"):
        launcher = dataclasses.replace(launcher, host=beat["host"])
    if dead:
        host, state = next(iter(dead.items()))
        if isinstance(state, dict):     # a runner's own sentence (a pod that never ran)
            return {"rank": None, "host": host}, state["reason"]
        return {"rank": None, "host": host}, f"node {host} stopped during the run ({state})"
    sched = res.scheduler or {}
    if sched and not sched.get("job_id"):            # sbatch refused it
        return {}, res.why
    if sched.get("failed_nodes"):                     # Slurm: NODE_FAIL, naming the node
        return {"rank": None, "host": sched["failed_nodes"][0]}, res.why
    if sched and sched.get("state") not in ("COMPLETED", "FAILED") and res.returncode is not None:
        return {}, res.why                            # cancelled, preempted, out of memory, ...
    if res.returncode == 0:
        return {}, "the job exited normally but wrote no record"
    if res.returncode is None:
        return {}, f"the job {res.why}"
    end = {"rank": launcher.rank, "host": launcher.host, "exit_code": launcher.exit_code,
           "signal": launcher.signal} if launcher else None
    where = f" on {launcher.host}" if launcher and launcher.host else ""
    if launcher and (launcher.signal is not None or launcher.exit_code == SSH_ERROR):
        return end, f"rank {launcher.rank}{where} {launcher.how()}"     # its peers' files: reactions
    if sched.get("state") == "FAILED" and not launcher and not first_failure(str(failure_dir)):
        return {}, res.why
    info = first_failure(str(failure_dir))
    if info:
        return info, f"rank {info['rank']} on {info['host']} failed: {info['reason']}"
    if launcher:
        return end, f"rank {launcher.rank}{where} {launcher.how()}"
    return {}, f"the launcher exited with {res.returncode}: {_failure_reason_from_tail(res.tail)}"


def first_failure(failure_dir: str) -> dict | None:
    """The earliest failure any rank wrote for one launch."""
    found = []
    for path in glob.glob(os.path.join(failure_dir, "rank-*.json")):
        try:
            with open(path) as f:
                found.append(json.load(f))
        except (OSError, json.JSONDecodeError):
            continue
    if not found:
        return None
    # The first to fail is the cause: a rank writes its file before it exits, and its
    # peers fail only once it is gone.
    found.sort(key=lambda x: (x.get("t", float("inf")), x.get("rank", 0)))
    return found[0]


def _failure_reason_from_tail(tail: list[str]) -> str:
    tail = [line for line in tail if progress.parse(line) is None]
    for line in reversed(tail):
        if "failed:" in line or "Error" in line:
            return line.strip()[:300]
    return (tail[-1].strip()[:300] if tail else "no output")
