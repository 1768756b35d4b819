"""Bench's stall watch: while a job runs, read each rank's heartbeat (lab.common.heartbeat,
written by lab.worker.heartbeat); when no rank has advanced for the bound, collect where
each one is (phase, step, the top frames of its main thread's stack, which the rank's
own watchdog wrote) and stop the job, so that bench records a `failed` run whose error
names the culprit and the ranks waiting for it (lab.host.watch.stall_diagnosis).

The watch runs on a thread of its own beside any runner's run() and ends a stalled job
with the runner's own stop(), so it is the same in every place to run. The heartbeats
reach it over the place's channel (Runner.heartbeat_channel): the run's folder, and,
where the ranks' folder is not this machine's ("stream": servers over SSH; "logs": a
Kubernetes job's log), marker lines in the job's output, which bench hands to `line`.
The bound starts when the ranks do (`started`: a batch job is RUNNING, not queued).
Horovod's own stall check (its "Missing ranks" report on rank 0's output) is read from
the job's lines too and kept in the record. A launcher that has not exited within the
bound after every rank is done or failed is ended (`launcher_ended`)."""
from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time

from lab.common import heartbeat
from lab.host.watch.stall_diagnosis import diagnose, process_state

POLL_S = 1.0
DUMP_WAIT_S = 10.0     # how long to wait for the ranks' stacks once a stall is seen

# Horovod's stall check (horovod/common/stall_inspector.cc, CheckForStalledTensors, 0.28.1):
# "One or more tensors were submitted to be reduced, gathered or broadcasted by subset of
# ranks and are waiting for remainder of ranks for more than N seconds. ..." then
# "Missing ranks:" and one line per rank, "R: [tensor, ...]" ("R!:" once past
# HOROVOD_STALL_SHUTDOWN_TIME_SECONDS). Under horovodrun the lines carry "[0]<stderr>:".
_HVD_START = re.compile(r"waiting for remainder of ranks for more than (\d+) seconds")
_HVD_MISSING = re.compile(r"(?:^|[:>\]\s])(\d+)!?: \[(.*)\]\s*$")
# The tag a launcher puts before a rank's output: mpirun --tag-output "[1,0]<stdout>:",
# horovodrun "[0]<stdout>:", torch.distributed.run --tee "[default0]:", srun --label "0: ".
_TAG_AT_END = re.compile(r"(?:\[[\w,]+\](?:<std(?:out|err)>)?:|^\s*\d+: ?)$")


class StallWatch:
    """Start it before the job, `line` every output line, `close` after the job; if it
    fired, `error` is the failed record's error; `launcher_ended` says it ended a
    launcher that outlived its ranks. `started`: whether the ranks run yet (the runner's
    ranks_started); `channel`: the place's heartbeat channel."""

    def __init__(self, folder: str, np: int, stall_s: float, launch: float, stop,
                 echo=print, poll_s: float = POLL_S, dump_wait_s: float = DUMP_WAIT_S,
                 flight: str | None = None, started=lambda: True, channel: str = "folder"):
        self.folder, self.np, self.stall_s, self.launch = folder, np, stall_s, launch
        self.flight = flight          # the Flight Recorder's folder (GPU runs of DDP over NCCL)
        self.stop, self.echo, self.poll_s, self.dump_wait_s = stop, echo, poll_s, dump_wait_s
        self.started, self.channel = started, channel
        self.error: dict | None = None
        self.stalled_after: float | None = None
        self.launcher_ended: str | None = None
        self.horovod: dict = {}
        self._in_hvd = False
        self._streamed: dict[int, dict] = {}        # rank -> its latest heartbeat line
        self._stream_stacks: dict[int, list[str]] = {}
        self._dump_seen: set[int] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lab-stall-watch", daemon=True)

    def start(self) -> StallWatch:
        if self.stall_s >= 0:
            self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        if self._thread.is_alive():
            self._thread.join()

    def line(self, text: str) -> str | None:
        """One line of the job's output: a rank's heartbeat or stack marker, or Horovod's
        stall report. Returns what of it is the job's own output for bench to echo and
        record: the line, or None for a marker. A launcher that forwards each rank's output
        as it reads it can put another rank's unfinished line before a marker
        ("[1,1]<stdout>:hello from[1,0]<stdout>:@lab-beat {...}", mpirun --tag-output, seen
        here): that text is returned, without the marker and its own rank's tag."""
        marker = heartbeat.parse_marker(text)
        if marker:
            kind, fields = marker
            before = _TAG_AT_END.sub("", text[:text.find(heartbeat.BEAT_MARK if kind == "beat"
                                                         else heartbeat.STACK_MARK)])
            if fields.get("launch") == self.launch:
                with self._lock:
                    if kind == "beat":
                        old = self._streamed.get(fields["rank"])
                        if not old or fields.get("seq", 0) >= old.get("seq", 0):
                            self._streamed[fields["rank"]] = fields
                    else:
                        self._stream_stacks[fields["rank"]] = list(fields.get("frames") or [])
            return before if before.strip() else None
        m = _HVD_START.search(text)
        if m:
            self._in_hvd = True
            self.horovod = {"after_s": int(m.group(1)), "missing": {}}
            return text
        if self._in_hvd:
            if "Missing ranks:" in text:
                return text
            m = _HVD_MISSING.search(text)
            if m:
                self.horovod["missing"][int(m.group(1))] = [t.strip() for t in m.group(2).split(",")][:3]
            else:
                self._in_hvd = False
        return text

    def beats(self) -> dict[int, dict | None]:
        """Each rank's heartbeat of this launch (None: none yet): the newer of its file in
        the run's folder and its latest line in the job's output."""
        out = {}
        with self._lock:
            streamed = dict(self._streamed)
        for r in range(self.np):
            b = heartbeat.read(os.path.join(self.folder, f"rank-{r}.json"))
            b = b if b and b.get("launch") == self.launch else None
            s = streamed.get(r)
            out[r] = s if s and (b is None or s.get("seq", 0) > b.get("seq", 0)) else b
        return out

    def bound(self, beats: dict[int, dict | None]) -> float:
        """The longest silence allowed now: the largest of the ranks' own bounds (a rank
        without a heartbeat yet is still starting: the import's bound; in an API's log,
        which carries only rank 0's pod's output, a rank never heard may print elsewhere,
        and counts only while no rank was heard)."""
        heard = [b for b in beats.values() if b]
        if self.channel == "logs" and heard:
            return max((b.get("bound_s") or 0) for b in heard)
        return max((b.get("bound_s") or 0) if b else heartbeat.bound_s(self.stall_s, "import", None)
                   for b in beats.values())

    def _run(self) -> None:
        seen: dict[int, int] = {}
        last = time.monotonic()
        finished_at: float | None = None
        while not self._closed.wait(self.poll_s):
            now = time.monotonic()
            if not self.started():      # queued (a batch job): the bound starts when the ranks do
                last = now
                continue
            beats = self.beats()
            for r, b in beats.items():
                if b and seen.get(r) != b["seq"]:
                    seen[r], last = b["seq"], now
            bound = self.bound(beats)
            if self.finished(beats):
                finished_at = finished_at or now
                if now - finished_at > bound:
                    self.launcher_ended = (f"the launcher had not exited {bound:g} s after every rank "
                                           f"ended; the stall watch ended it")
                    self.echo(f"!! {self.launcher_ended}")
                    self.stop()
                    return
                continue
            finished_at = None
            if now - last > bound:
                self.stalled_after = now - last
                self.error = self.diagnose(self.collect(beats), bound)
                self.echo(f"!! {self.error['reason']}")
                self.stop()
                self.reap(beats)
                return

    def finished(self, beats: dict[int, dict | None]) -> bool:
        """Every rank done or failed (a rank never heard, as in an API's log of rank 0's
        pod only, keeps the launcher's end from being judged)."""
        return all(b and b["phase"] in ("done", "failed") for b in beats.values())

    def collect(self, beats) -> dict[int, dict | None]:
        """Each rank's heartbeat with the top frames of its main thread: waits (at most
        dump_wait_s) for the stacks its watchdog writes (a file, or a marker line)."""
        deadline = time.monotonic() + self.dump_wait_s
        stacks: dict[int, list[str]] = {}
        # Now, before the wait: a peer may give up on a stopped rank meanwhile and exit.
        states = {r: process_state(b) for r, b in beats.items() if b}
        asked = self.ask_flight_recorder()
        while True:
            for r, b in beats.items():
                if b and r not in stacks:
                    try:
                        with open(os.path.join(self.folder, f"rank-{r}.stack")) as f:
                            frames = heartbeat.main_thread_frames(f.read(), b.get("main_thread"))
                    except OSError:
                        frames = []
                    with self._lock:
                        frames = frames or self._stream_stacks.get(r, [])
                    if frames:
                        stacks[r] = frames
            # a rank whose process cannot run (stopped, gone: process_state) writes none
            waiting = [r for r, b in beats.items()
                       if b and r not in stacks and b["phase"] not in ("done", "failed")
                       and not states.get(r)]
            waiting += [r for r in asked if not os.path.exists(os.path.join(self.flight, f"rank-{r}"))]
            if not waiting or time.monotonic() > deadline or self._closed.wait(0.2):
                break
        self._dump_seen = set(stacks)
        return {r: (dict(b, stack=stacks.get(r, []), process=states[r]) if b else None)
                for r, b in beats.items()}

    def reap(self, beats) -> None:
        """SIGKILL to the ranks of this launch still alive on this machine after the
        runner's stop: mpirun starts its local ranks outside the launcher's process group,
        and a rank asleep forever outlives the stop when mpirun is killed before it has
        passed the TERM on. A pid is ended only while its command line is this launch's
        worker (`--launched-at` is unique to it), never a reused one."""
        here = socket.gethostname()
        for b in beats.values():
            if not b or b.get("host") != here or not b.get("pid"):
                continue
            try:
                with open(f"/proc/{b['pid']}/cmdline", "rb") as f:
                    argv = f.read().decode(errors="replace").split("\0")
            except OSError:
                continue            # gone already
            if "lab.worker.train" in argv and str(self.launch) in argv:
                try:
                    os.kill(b["pid"], signal.SIGKILL)
                except OSError:
                    pass

    def ask_flight_recorder(self) -> list[int]:
        """Write to each rank's Flight Recorder pipe, which makes its ProcessGroupNCCL dump
        its trace to <flight>/rank-N (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp,
        struct DumpPipe: a FIFO named TORCH_NCCL_DEBUG_INFO_PIPE_FILE + rank + ".pipe",
        made when the buffer size is > 0; the dump goes to the dump file's prefix + rank:
        flight_recorder_names). The ranks asked. Verified by reading
        only: no GPU here."""
        asked = []
        for r in range(self.np) if self.flight else ():
            try:
                fd = os.open(os.path.join(self.flight, f"rank-{r}.pipe"), os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                continue            # no pipe (no NCCL group yet), or nobody reading it
            try:
                os.write(fd, b"dump\n")
                asked.append(r)
            except OSError:
                pass
            finally:
                os.close(fd)
        return asked

    def flight_dumps(self) -> list[str]:
        """The Flight Recorder dumps the ranks wrote, as paths inside the run's folder."""
        if not self.flight or not os.path.isdir(self.flight):
            return []
        run_dir = os.path.dirname(os.path.dirname(self.flight))
        return sorted(os.path.relpath(os.path.join(self.flight, f), run_dir)
                      for f in os.listdir(self.flight) if re.fullmatch(r"rank-\d+", f))

    def diagnose(self, beats: dict[int, dict | None], bound: float) -> dict:
        """The failed record's error (lab.host.watch.stall_diagnosis)."""
        return diagnose(beats, bound, self.np, silence_s=self.stalled_after or bound,
                        heard_only=self.channel == "logs", horovod=self.horovod,
                        flight_dumps=self.flight_dumps(), dumped=self._dump_seen)


def flight_recorder(cfg, backend: str, env: dict, results_inside: str, run_dir,
                    torch_version: str | None = None) -> tuple[dict, str | None]:
    """(the job's environment, the Flight Recorder's folder as bench sees it, or None):
    the recorder is switched on for GPU runs of DDP over NCCL only. `torch_version`: the
    ranks' torch (the stack probe's "torch"), which decides the variables' names."""
    if not (cfg.device == "cuda" and cfg.framework == "ddp" and backend == "nccl"):
        return env, None
    inside = os.path.join(results_inside, cfg.run_id)
    return ({**env, **flight_recorder_env(inside, cfg.attempt, torch_version)},
            os.path.join(str(run_dir), "flight", cfg.attempt))


# The first torch whose Flight Recorder reads TORCH_FR_BUFFER_SIZE and TORCH_FR_DUMP_TEMP_FILE
# (and warns "Environment variable TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated; use
# TORCH_FR_BUFFER_SIZE instead" for the old names) that this kit has seen do so: 2.11.0
# printed both warnings on a GPU host; torch 2.13.0's torch/csrc/distributed/c10d/
# FlightRecorder.hpp (shipped in its wheel) reads getCvarInt({"TORCH_FR_BUFFER_SIZE",
# "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000), and pytorch's FlightRecorder.cpp reads
# getCvarString({"TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}, ...) (both
# strings are in 2.13.0's libtorch_cpu.so). getCvar* (Utils.hpp): the first name wins, a
# later one is still read, with that warning. The new names came in upstream's
# "Make FR vendor neutral" change of May 2025, so a release or two before 2.11 may read them
# too: those get the old names, which every release so far still reads, at the cost of the
# warning. TORCH_NCCL_DUMP_ON_TIMEOUT and TORCH_NCCL_DEBUG_INFO_PIPE_FILE are not renamed
# (ProcessGroupNCCL.hpp/.cpp of 2.13.0).
FR_NAMES_FROM = (2, 11)
OLD_NAMES = {"buffer": "TORCH_NCCL_TRACE_BUFFER_SIZE", "dump_file": "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}
NEW_NAMES = {"buffer": "TORCH_FR_BUFFER_SIZE", "dump_file": "TORCH_FR_DUMP_TEMP_FILE"}
# Where a rank finds the dump file's prefix, whichever name bench used (lab.worker.heartbeat).
DUMP_FILE_VARS = (NEW_NAMES["dump_file"], OLD_NAMES["dump_file"])


def flight_recorder_names(torch_version: str | None) -> dict[str, str]:
    """The names of the buffer-size and dump-file variables that `torch_version` reads
    without a deprecation warning; the old names when the version is unknown or unreadable
    (every release still reads them)."""
    m = re.match(r"(\d+)\.(\d+)", torch_version or "")
    return NEW_NAMES if m and (int(m[1]), int(m[2])) >= FR_NAMES_FROM else OLD_NAMES


def flight_recorder_env(run_dir_inside: str, attempt: str, torch_version: str | None = None) -> dict[str, str]:
    """PyTorch's NCCL Flight Recorder for a GPU run of DDP over NCCL: a ring of the last
    2,000 collectives per rank (the buffer size), dumped when NCCL's watchdog times out
    (TORCH_NCCL_DUMP_ON_TIMEOUT) or when the stall watch writes to a rank's pipe
    (TORCH_NCCL_DEBUG_INFO_PIPE_FILE), into <run>/flight/<attempt>/rank-N beside the
    record (the dump file's prefix; PyTorch docs, "Flight Recorder for Debugging Stuck
    Jobs"). The buffer and dump-file variables are named as `torch_version` reads them
    (flight_recorder_names). The paths are as the ranks see the run's folder; the rank
    makes the folder (lab.worker.heartbeat). Verified by reading only: no GPU here."""
    stem = os.path.join(run_dir_inside, "flight", attempt, "rank-")
    names = flight_recorder_names(torch_version)
    return {names["buffer"]: "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            names["dump_file"]: stem, "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem}
