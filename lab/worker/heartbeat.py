"""A rank's heartbeat: where it is (phase, step), written for bench's stall watch
(lab.host.watch.stall; the format is lab.common.heartbeat's), and its Python stacks written
when it stops advancing.

The training loop only sets fields (`beat`, nanoseconds); a daemon thread writes the
file at most every FLUSH_S seconds when something changed, so a step costs no file
write, and a rank stuck in a sleep or a collective (which release the GIL) still gets
its last position written.

The stacks come from faulthandler's watchdog: each write re-arms
`faulthandler.dump_traceback_later(bound)`, so a rank that has not advanced for its
bound dumps the tracebacks of all its threads into rank-N.stack. The watchdog is a C
thread that needs neither the GIL nor the main thread (Python docs, faulthandler:
"Dump the tracebacks of all threads, after a timeout of timeout seconds ... This
function is implemented using a watchdog thread"), so it reports a main thread blocked
in C (a collective, hvd.init) where a Python signal handler would never run; and it
needs no signal from the host, so it works alike for local ranks, containers, the
compose cluster's nodes and servers over SSH. py-spy would need ptrace rights on every
node (CAP_SYS_PTRACE in a container) and a binary the host can reach each rank with."""
from __future__ import annotations

import faulthandler
import os
import socket
import sys
import threading
import time
import traceback

from lab.common import heartbeat
from lab.common.kit import horovod_controller


class Heartbeat:
    def __init__(self, run_dir, attempt: str, rank: int, stall_s: float = 0.0, launch: float = 0.0):
        self.rank, self.stall_s = rank, stall_s
        self.path = heartbeat.beat_path(run_dir, attempt, rank)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        # bench's, GPU runs: the dump file's prefix under the name this torch reads
        # (lab.host.watch.stall.flight_recorder_names).
        flight = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
        if flight:
            os.makedirs(os.path.dirname(flight), exist_ok=True)
        self.state = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(),
                      "main_thread": threading.main_thread().ident, "seq": 0, "launch": launch,
                      "phase": "import", "step": None, "where": None, "checkpoint_bytes": None}
        self.slowest: float | None = None
        self.forward_s: float | None = None      # the first step's forward, timed
        # Waits for the device's queued work (train sets torch.cuda.synchronize on a GPU):
        # a GPU's forward returns once its kernels are launched, so timed without it the
        # first forward is launch time and the first step's bound falls to its floor.
        self.synchronize = _nothing_queued
        self._forward_at = 0.0
        self._before_compile = ("setup", None)     # the phase a compile interrupts
        self.eval_steps = 0.0
        self.channel = os.environ.get(heartbeat.CHANNEL_VAR, "folder")
        self._printed_at = 0.0
        self._printed = -1
        self._advanced_at = time.monotonic()
        self._bound = heartbeat.IMPORT_S
        self._stack_told = -1
        self._last_beat: dict | None = None
        self.detail: dict = {}
        self._written = -1
        self._stacks = open(heartbeat.stack_path(run_dir, attempt, rank), "w")
        self._stop = threading.Event()
        self._flush()
        self._thread = threading.Thread(target=self._run, name="lab-heartbeat", daemon=True)
        self._thread.start()

    def beat(self, phase: str, step: int | None = None, where: str | None = None,
             checkpoint_bytes: int | None = None, **detail) -> None:
        """The rank moved on (cheap: the thread writes it). `checkpoint_bytes`: in the
        checkpoint phase, the bytes of the state it saves or loads (its bound grows with
        them: lab.common.heartbeat.bound_s); no other phase keeps them."""
        s = self.state
        s["phase"], s["step"], s["where"] = phase, step, where
        s["checkpoint_bytes"] = checkpoint_bytes if phase == "checkpoint" else None
        s["seq"] += 1
        if detail:
            self.detail = detail

    def mark(self, where: str) -> None:
        """Where in its step the rank is (forward, backward, optimizer): a strategy's step
        calls it; the first step's forward is timed (its bound: lab.common.heartbeat),
        synchronised at both ends; later steps wait for nothing here."""
        s = self.state
        if self.forward_s is None:
            if where == "forward":
                self.synchronize()
                self._forward_at = time.perf_counter()
            elif s["where"] == "forward":
                self.synchronize()
                self.forward_s = time.perf_counter() - self._forward_at
        s["where"] = where
        s["seq"] += 1

    def compiling(self, started: bool) -> None:
        """--compile: the compiler started inside the step (the phase `compile`, with a bound
        of its own: lab.common.heartbeat.bound_s), or ended (the step's phase back)."""
        s = self.state
        if started:
            self._before_compile = (s["phase"], s["where"])
            s["phase"] = "compile"
        else:
            s["phase"], s["where"] = self._before_compile
        s["seq"] += 1

    def step_took(self, seconds: float) -> None:
        if self.slowest is None or seconds > self.slowest:
            self.slowest = seconds

    def _run(self) -> None:
        while not self._stop.wait(heartbeat.FLUSH_S):
            self._flush()
            if self.channel != "folder":
                self._tell_stack()

    def _flush(self) -> None:
        s = dict(self.state)
        if s["seq"] == self._written:
            self._print(None)
            return
        self._advanced_at = time.monotonic()
        bound = heartbeat.bound_s(self.stall_s, s["phase"], self.slowest, self.eval_steps,
                                  self.forward_s, s["checkpoint_bytes"])
        self._bound = bound
        s.update(bound_s=bound, slowest_step_s=self.slowest, forward_s=self.forward_s,
                 t=time.time(), **self.detail)
        self._print(s)
        try:
            faulthandler.cancel_dump_traceback_later()
            self._stacks.seek(0)
            self._stacks.truncate()
            heartbeat.write(self.path, s)
            # A little under the bound: the stacks are there when the host's watch,
            # which measures the same silence from its own later reading, fires.
            faulthandler.dump_traceback_later(max(1.0, bound - 2 * heartbeat.FLUSH_S),
                                              file=self._stacks)
        except OSError:
            pass        # a full or vanished results folder must not end the rank
        self._written = s["seq"]

    def _print(self, beat: dict | None) -> None:
        """The stream channel: the latest heartbeat as a marker line, at most every
        STREAM_S (and at once when the rank ends)."""
        if beat is not None:
            self._last_beat = beat
        beat = self._last_beat
        if (self.channel == "folder" or beat is None or beat["seq"] == self._printed
                or (time.monotonic() - self._printed_at < heartbeat.STREAM_S
                    and beat["phase"] not in ("done", "failed"))):
            return
        self._printed, self._printed_at = beat["seq"], time.monotonic()
        say(heartbeat.marker_line(heartbeat.BEAT_MARK, beat))

    def _tell_stack(self) -> None:
        """Once per stall: the main thread's frames, most recent first, as a marker line."""
        seq = self.state["seq"]
        if seq == self._stack_told or self.state["phase"] in ("done", "failed"):
            return
        if time.monotonic() - self._advanced_at < max(1.0, self._bound - 2 * heartbeat.FLUSH_S):
            return
        self._stack_told = seq
        say(heartbeat.marker_line(heartbeat.STACK_MARK, {
            "rank": self.rank, "launch": self.state["launch"], "seq": seq,
            "frames": main_frames(threading.main_thread().ident)}))

    def close(self, phase: str = "done") -> None:
        self.beat(phase)
        self._stop.set()
        self._thread.join(timeout=2)
        self._flush()
        faulthandler.cancel_dump_traceback_later()


def _nothing_queued() -> None:
    """A CPU's work is done when its call returns."""


def main_frames(ident: int | None, limit: int = 12) -> list[str]:
    """The frames of the thread `ident`, most recent first, as "file.py:LINE in name"
    (lab.common.heartbeat.main_thread_frames' form)."""
    frame = sys._current_frames().get(ident)
    if frame is None:
        return []
    stack = traceback.extract_stack(frame)[::-1][:limit]
    return [f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in stack]


def say(line: str) -> None:
    """One whole line on stdout in one write (a pipe keeps a write under PIPE_BUF whole
    beside the main thread's own output)."""
    try:
        os.write(1, (line + "\n").encode())
    except OSError:
        pass


def rendezvous_detail(framework: str, backend: str) -> dict:
    """What a rank's rendezvous waits for, from the variables its launcher set: the
    world it expects, the address and port it meets at, and the interface asked for."""
    env = os.environ
    if framework == "ddp":
        world, addr, port = env.get("WORLD_SIZE"), env.get("MASTER_ADDR"), env.get("MASTER_PORT")
        iface = env.get("GLOO_SOCKET_IFNAME") or env.get("NCCL_SOCKET_IFNAME") or env.get("TP_SOCKET_IFNAME")
    elif (framework == "horovod" and horovod_controller(backend) == "mpi") or "OMPI_COMM_WORLD_SIZE" in env:
        world = env.get("OMPI_COMM_WORLD_SIZE") or env.get("PMI_SIZE") or env.get("SLURM_NTASKS")
        addr, port = None, None
        iface = env.get("OMPI_MCA_btl_tcp_if_include") or env.get("OMPI_MCA_oob_tcp_if_include")
    else:
        world = env.get("HOROVOD_SIZE")
        addr, port = env.get("HOROVOD_GLOO_RENDEZVOUS_ADDR"), env.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
        iface = env.get("HOROVOD_GLOO_IFACE")
    return {"rendezvous": {"world": int(world) if world and world.isdigit() else None,
                           "address": addr, "port": int(port) if port and port.isdigit() else None,
                           "interface": iface or None}}
