"""What a job's launcher says about the rank that ended first, read from its output as it
streams; and that output condensed for the user (a launcher's own Python traceback cut
to its last line, torchrun's failure report to one line). A rank killed from outside (SIGKILL, as the out-of-memory killer
does) writes no failure file, and its peers' files only say that a connection broke:
the launcher is the one witness. What each launcher prints (captured here, in
tests/fixtures/launchers/):

- torch.distributed.run: a "Root Cause (first observed failure):" block with
  `rank : R (local_rank: L)`, `host : H`, `exitcode : -9 (pid: P)` — a negative exit
  code is the signal (torch/distributed/elastic/multiprocessing/errors) — after a
  "Failures:" block of the other ranks that failed, alike. The root cause is the
  failure seen first, and a rank's peer that exits at once when the rank is killed can
  be seen in the same poll: then the root cause is the peer (exit code 1) and the
  killed rank is under "Failures:" (captured in CI, 2026-11-23). A rank ended by a
  signal the agent does not send when it stops the others (SIGTERM) is preferred.
- horovodrun over Gloo: "Process R exit with status code C." as each rank ends, R being
  the slot's rank (horovod/runner/gloo_run.py, _exec_command_fn), then "The first
  process to do so was:\\nProcess name: R\\nExit code: C"; ranks run under a shell, so a
  signal shows as 128 + its number.
- mpirun (Open MPI 4.1): "mpirun noticed that process rank R with PID P on node H
  exited on signal S (Name)." for a signal; "Process name: [[J,1],R]" then
  "Exit code: C" for the first non-zero exit.
- srun (Slurm 22.05), when its tasks are the ranks (Horovod over MPI under Slurm):
  "srun: error: node2: task 1: Exited with exit code 7", "...: task 1: Killed" ("tasks
  2-3: ..." when several end at once: the first is taken; src/srun/launch_slurm.c); the
  tasks KillOnBadExit ends after the first show "Terminated" (captured on the
  simulated cluster). Read only when the runner says tasks are ranks
  (`srun_tasks_are_ranks`): under DDP a task is a node's torch.distributed.run.
"""
from __future__ import annotations

import collections
import re
import signal as _signal
import threading

from lab.common import progress
from lab.host.watch.failures import RankEnd, cause, from_exit_code, rank_on, srun_task_end

_NODE_PREFIX = re.compile(r"^\[[\w.-]+\] ")          # the cluster runner's "[node2] "
_MPIRUN_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_HOROVOD_EXIT = re.compile(r"^Process (\d+) exit with status code (-?\d+)\.$")
_PROCESS_NAME = re.compile(r"^\s*Process name: (?:\[\[\d+,\d+\],(\d+)\]|(\d+))\s*$")
_EXIT_CODE = re.compile(r"^\s*Exit code: (-?\d+)\s*$")
_SRUN_TASK = re.compile(r"^srun: error: (\S+): tasks? (\d+)[\d,-]*: (.*)$")
_TORCHRUN_FIELD = re.compile(r"^\s*(rank|host|exitcode)\s*: (.*)$")
# torchrun's report's border: "=" times the widest of its title ("<module> FAILED") and its
# failures' lines, at most 60 (torch/distributed/elastic/multiprocessing/errors/__init__.py,
# ChildFailedError.format_msg and _MSG_FORMAT_TEMPLATE): 8 or more
_BORDER = re.compile(r"^={8,}\s*$")
# the lines between its title and its closing border: section lines, "Failures:", "Root
# Cause ...:", "[i]:", and indented ones (fields, <NO_OTHER_FAILURES>, an error file's stack)
_REPORT_LINE = re.compile(r"^(-{8,}|Failures:|Root Cause \(first observed failure\):|\[\d+\]:|\s.*|)\s*$")


class LauncherWatch:
    """Feed it every line of a job's output (`line`); it passes them on to `echo`,
    with a launcher's traceback condensed to its last line and torchrun's failure report
    to one line (a line of "=" is held back until the next says whether it opens one, and
    a report's lines until its closing border; a line that is not the report's lets
    what was held go on as it was), keeps the last lines it
    passed on (`tail`), and remembers the rank to blame among those the launcher reports
    as ended abnormally (`first`: the first, unless a later one was killed by a signal
    or lost over ssh: cause)."""

    def __init__(self, echo, tail: int = 40, srun_tasks_are_ranks: bool = False):
        self.echo = echo
        self.srun_tasks_are_ranks = srun_tasks_are_ranks
        self._srun_terminated: list[RankEnd] = []
        self.tail: collections.deque[str] = collections.deque(maxlen=tail)
        self.first: RankEnd | None = None
        self._traceback: list[str] | None = None
        self._prefix = ""
        self._pending_name: int | None = None
        self._torchrun: dict | None = None
        self._torchrun_others: list[dict] | None = None   # torchrun's "Failures:" block
        self._others: list[dict] = []
        self._horovod_exits: list[RankEnd] = []
        self._border: str | None = None         # a line of "=" that may open torchrun's report
        self._report: list[str] | None = None   # torchrun's failure report, held back
        self._report_root = False                # its "Root Cause" block began
        self._report_tb: str | None = None       # its root cause's traceback's last line
        self._reported: tuple[RankEnd, list[RankEnd]] | None = None   # its root cause, others

    def _out(self, text: str) -> None:
        self.tail.append(text)
        self.echo(text)

    def line(self, raw: str) -> None:
        m = _NODE_PREFIX.match(raw)
        prefix, text = (m.group(0), raw[m.end():]) if m else ("", raw)
        self._parse(text)
        # torchrun's failure report (a border of "=", "<module> FAILED", its "Failures:"
        # and "Root Cause" blocks, a border): read above, said in one line.
        if self._report is not None:
            if _BORDER.match(text) and self._report_root:
                title, self._report = self._report[1], None
                self._out(f"{prefix}(the launcher's failure report, condensed) {self._said(title)}")
                return
            if not _BORDER.match(text) and _REPORT_LINE.match(text):
                self._report.append(raw)
                self._report_read(text)
                return
            # not the report's (another launcher's, unprefixed): what was held goes on as
            # it was, and this line is read afresh
            held, self._report = self._report, None
            for h in held:
                self._out(h)
        if self._border is not None:
            border, self._border = self._border, None
            if text.rstrip().endswith(" FAILED"):
                self._report, self._report_root, self._report_tb = [border, raw], False, None
                self._reported = None
                return
            self._out(border)
        if self._traceback is None and _BORDER.match(text):
            self._border = raw
            return
        # A launcher's own traceback (a rank's lines carry the launcher's rank prefix,
        # and the kit's worker prints one line, not a traceback): its last line only.
        if self._traceback is not None:
            if text.startswith((" ", "\t")) or not text.strip():
                self._traceback.append(text)
                return
            self._traceback = None
            self._out(f"{prefix}(the launcher's traceback, condensed) {text}")
            return
        if text.startswith("Traceback (most recent call last):"):
            self._traceback, self._prefix = [], prefix
            return
        self._out(raw)

    def _report_read(self, text: str) -> None:
        """Within the report: whether its root cause began, and its traceback's last line
        (the field, or the error file's call stack indented below it)."""
        if text.startswith("Root Cause"):
            self._report_root = True
        elif self._report_root:
            m = re.match(r"^\s+traceback\s*: ?(.*)$", text)
            if m:
                self._report_tb = m.group(1).strip()
            elif self._report_tb is not None and text.strip():
                self._report_tb = text.strip()

    def _said(self, title: str) -> str:
        """torchrun's report in one line: what failed, the first failure it observed, the
        others it listed."""
        m = _NODE_PREFIX.match(title)
        what = (title[m.end():] if m else title).strip().removesuffix(" FAILED")
        if self._reported is None:
            return f"{what} ended abnormally"
        root, others = self._reported
        said = f"{what} ended abnormally; first observed: {rank_on(root)} {root.how()}"
        said += "".join(f"; also {rank_on(o)} {o.how()}" for o in others)
        tb = self._report_tb
        if tb and tb not in ("-", "<N/A>") and not tb.startswith(("To enable traceback", "Signal ")):
            said += f"; its traceback ends: {tb}"       # the rank's error file (@record)
        return said

    def close(self) -> None:
        """The output ended: a traceback still open is said in one line; a report cut short
        is passed on as it was."""
        for held in ([self._border] if self._border is not None else []) + (self._report or []):
            self._out(held)
        self._border = self._report = None
        if self._traceback is not None:
            self._out(f"{self._prefix}(the launcher printed a traceback that ended without "
                      f"its exception line)")
            self._traceback = None
        self._finish_torchrun()
        if self.first is None and self._horovod_exits:
            self.first = self._horovod_exits[0]
        if self.first is None and self._srun_terminated:
            self.first = self._srun_terminated[0]

    def _found(self, end: RankEnd) -> None:
        # One output may hold several launchers' reports (a Slurm job's file: a torchrun
        # per node, in any order): a rank killed by a signal reported after its peer's
        # exit 1 (the connection reset) is still the one to blame (cause).
        self.first = end if self.first is None else cause([self.first, end])

    def _finish_torchrun(self) -> None:
        t, self._torchrun = self._torchrun, None
        if t and "rank" in t and "exitcode" in t:
            root = from_exit_code(t["rank"], t["exitcode"], t.get("host"))
            others = [from_exit_code(o["rank"], o["exitcode"], o.get("host")) for o in self._others
                      if "rank" in o and "exitcode" in o]
            self._reported = (root, others)
            self._found(cause([root, *others]))

    def _torchrun_field(self, into: dict, text: str) -> bool:
        f = _TORCHRUN_FIELD.match(text)
        if not f:
            return False
        key, value = f.groups()
        if key == "host":
            into["host"] = value.strip()
        else:
            number = re.match(r"-?\d+", value.strip())
            if number:
                into[key] = int(number.group(0))
        return True

    def _parse(self, text: str) -> None:
        if self._torchrun is not None:
            if not self._torchrun_field(self._torchrun, text) and (
                    text.startswith("====") or text.startswith("----")):
                self._finish_torchrun()
            return
        if self._torchrun_others is not None:
            if re.match(r"^\[\d+\]:\s*$", text.strip()):
                self._torchrun_others.append({})
            elif self._torchrun_others and self._torchrun_field(self._torchrun_others[-1], text):
                pass
            elif text.startswith("====") or text.startswith("----"):
                self._others, self._torchrun_others = self._torchrun_others, None
            return
        if text.startswith("Failures:"):
            self._torchrun_others = []
            return
        if text.startswith("Root Cause (first observed failure):"):
            self._torchrun = {}
            return
        m = _SRUN_TASK.match(text) if self.srun_tasks_are_ranks else None
        if m:
            end = srun_task_end(int(m.group(2)), m.group(1), m.group(3))
            if end is not None:
                # The ones srun ended after the first (KillOnBadExit) say Terminated.
                if end.signal == _signal.SIGTERM:
                    self._srun_terminated.append(end)
                else:
                    self._found(end)
            return
        m = _MPIRUN_SIGNAL.search(text)
        if m:
            self._found(RankEnd(int(m.group(1)), m.group(2), None, int(m.group(3))))
            return
        m = _HOROVOD_EXIT.match(text)
        if m and int(m.group(2)) != 0:
            self._horovod_exits.append(from_exit_code(int(m.group(1)), int(m.group(2)), shell=True))
            return
        m = _PROCESS_NAME.match(text)
        if m:
            self._pending_name = int(m.group(1) or m.group(2))
            return
        m = _EXIT_CODE.match(text)
        if m and self._pending_name is not None:
            # "The first process to do so was": horovodrun's (shell) or mpirun's. As in
            # torchrun's block, a rank horovodrun saw killed by a signal other than SIGTERM
            # comes first: under load its peer's exit 1 (a connection reset) is seen first.
            end = from_exit_code(self._pending_name, int(m.group(1)), shell=bool(self._horovod_exits))
            self._found(cause([end, *self._horovod_exits]))
            self._pending_name = None


class StreamWatches:
    """A LauncherWatch per output stream: the lines of a job of several parts (the
    cluster's nodes, your servers) arrive on one thread per part, prefixed "[host] ", and
    two launchers' failure blocks printed at once must never be read as one (a rank of
    one node blamed with another node's host or exit code). Lines are taken under a
    lock; `first` is the first abnormal end any stream reported, in the order seen, with
    the same preference a launcher's own block gets: a rank killed by a signal other than
    SIGTERM comes before peers that exited with a code. When a rank on node2 is SIGKILLed,
    its peer on node1 exits 1 at once ("Connection reset by peer") and node1's launcher
    may print its block first (captured on the simulated cluster, 2026-11-26)."""

    def __init__(self, echo, tail: int = 40, **kw):
        self.echo, self._kw = echo, kw
        self._lock = threading.Lock()
        self._watches: dict[str, LauncherWatch] = {}
        self._seen: list[RankEnd] = []
        self.tail: collections.deque[str] = collections.deque(maxlen=tail)

    def _out(self, text: str) -> None:          # called with the lock held
        if progress.parse(text) is None:        # a failure's log tail has no progress lines
            self.tail.append(text)
        self.echo(text)

    def _note(self, watch: LauncherWatch) -> None:
        if watch.first is not None and all(watch.first is not x for x in self._seen):
            self._seen.append(watch.first)

    def line(self, raw: str) -> None:
        m = _NODE_PREFIX.match(raw)
        key = m.group(0) if m else ""
        with self._lock:
            watch = self._watches.get(key)
            if watch is None:
                watch = self._watches[key] = LauncherWatch(self._out, **self._kw)
            watch.line(raw)
            self._note(watch)

    def close(self) -> None:
        with self._lock:
            for watch in self._watches.values():
                watch.close()
                self._note(watch)

    @property
    def first(self) -> RankEnd | None:
        with self._lock:
            return cause(self._seen)

    @property
    def ends(self) -> list[RankEnd]:
        """Each stream's first abnormal end, in the order they were seen."""
        with self._lock:
            return list(self._seen)
