"""The host's share of a run's start-up: where the time went between the command
(`invoke bench`'s process starting) and bench starting the launcher, phase by phase.
The ranks measure the rest against the launch time (lab.worker.train.startup_phases);
bench adds these to the run's record (figures.startup_host_s, figures.startup_total_s),
so the whole fixed cost of a run is in every record, and `invoke bench
--profile-startup` prints it. Standard library only: the host never imports torch."""
from __future__ import annotations

import os
import time

# In the order they happen; a phase that did not happen for a launch counts 0.
# interpreter: from the process starting to bench's task running (Python, invoke,
# tasks.py); plan: the flags read and checked (lab.host.request.plan); runner: where the ranks
# run chosen (the image or the cluster looked for); probe: the ranks' stack probed (or
# read from its cache, lab.host.places.stack_cache); checks: the request checked against it
# (and MNIST fetched); prepare: the run's folder, the launch's commands, and with
# --ceiling the compute ceiling measured before the run.
HOST_PHASES = ("interpreter", "plan", "runner", "probe", "checks", "prepare")


def process_started_at() -> float | None:
    """When this process started (Unix time, to the kernel's clock tick: 10 ms), from
    its start in /proc/self/stat against the time since boot now (not /proc/stat's boot
    time: whole seconds); None where there is no /proc."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        # Field 22 (starttime, in clock ticks since boot) counts from after the
        # command's name, which is in parentheses and may hold spaces.
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class HostClock:
    """Marks of the host's phases for the next launch. `begin` at the command (the
    anchor: the process's start); `mark` at the end of each phase; `phases(launched_at)`
    for a launch, after which `restart` anchors the next launch of the same command
    (a sweep) at the end of this one, so each record's host phases are its own."""

    def __init__(self):
        self.anchor: float | None = None
        self.marks: dict[str, float] = {}

    def begin(self, entered: float | None = None) -> None:
        """The command started: its process's start, and `entered` (default: now) when
        bench's task began running (the end of the interpreter phase)."""
        entered = time.time() if entered is None else entered
        started = process_started_at()
        self.anchor = started if started is not None and started <= entered else entered
        self.marks = {"interpreter": entered}

    def mark(self, phase: str) -> None:
        if phase not in HOST_PHASES:
            raise ValueError(f"unknown host phase {phase!r}")
        if self.anchor is not None:
            self.marks[phase] = time.time()

    def skip(self, seconds: float) -> None:
        """Leave `seconds` spent waiting (for another run's hold: lab.host.places.hold) out
        of every phase: the anchor and the marks move on by them."""
        if self.anchor is not None and seconds > 0:
            self.anchor += seconds
            self.marks = {k: v + seconds for k, v in self.marks.items()}

    def restart(self, at: float | None = None) -> None:
        if self.anchor is not None:
            self.anchor, self.marks = (time.time() if at is None else at), {}

    def phases(self, launched_at: float) -> dict[str, float] | None:
        """Seconds of each host phase from the anchor to `launched_at`; None when the
        clock was never begun (bench called as a library, not from the command)."""
        if self.anchor is None:
            return None
        out, t = {}, self.anchor
        for phase in HOST_PHASES[:-1]:
            end = self.marks.get(phase)
            if end is None or end < t:
                out[phase] = 0.0
                continue
            out[phase], t = end - t, end
        out["prepare"] = max(launched_at - t, 0.0)
        return {k: round(v, 3) for k, v in out.items()}


# The command's clock (bench's task begins it; lab.host.run.bench marks and reads it).
CLOCK = HostClock()
