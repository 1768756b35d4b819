"""A rank's heartbeat: where it is (phase, step), written for bench's stall watch
(lab.host.stall; the format is lab.common.heartbeat's), and its Python stacks written
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
import threading
import time

from lab.common import heartbeat


class Heartbeat:
    def __init__(self, run_dir, attempt: str, rank: int, stall_s: float = 0.0, launch: float = 0.0):
        self.rank, self.stall_s = rank, stall_s
        self.path = heartbeat.beat_path(run_dir, attempt, rank)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        flight = os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")   # bench's, GPU runs: lab.host.stall
        if flight:
            os.makedirs(os.path.dirname(flight), exist_ok=True)
        self.state = {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(),
                      "main_thread": threading.main_thread().ident, "seq": 0, "launch": launch,
                      "phase": "import", "step": None, "where": None}
        self.slowest: float | None = None
        self.eval_steps = 0.0
        self.detail: dict = {}
        self._written = -1
        self._stacks = open(heartbeat.stack_path(run_dir, attempt, rank), "w")
        self._stop = threading.Event()
        self._flush()
        self._thread = threading.Thread(target=self._run, name="lab-heartbeat", daemon=True)
        self._thread.start()

    def beat(self, phase: str, step: int | None = None, where: str | None = None, **detail) -> None:
        """The rank moved on (cheap: the thread writes it)."""
        s = self.state
        s["phase"], s["step"], s["where"] = phase, step, where
        s["seq"] += 1
        if detail:
            self.detail = detail

    def step_took(self, seconds: float) -> None:
        if self.slowest is None or seconds > self.slowest:
            self.slowest = seconds

    def _run(self) -> None:
        while not self._stop.wait(heartbeat.FLUSH_S):
            self._flush()

    def _flush(self) -> None:
        s = dict(self.state)
        if s["seq"] == self._written:
            return
        bound = heartbeat.bound_s(self.stall_s, s["phase"], self.slowest, self.eval_steps)
        s.update(bound_s=bound, slowest_step_s=self.slowest, t=time.time(), **self.detail)
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

    def close(self, phase: str = "done") -> None:
        self.beat(phase)
        self._stop.set()
        self._thread.join(timeout=2)
        self._flush()
        faulthandler.cancel_dump_traceback_later()


def rendezvous_detail(framework: str, backend: str) -> dict:
    """What a rank's rendezvous waits for, from the variables its launcher set: the
    world it expects, the address and port it meets at, and the interface asked for."""
    env = os.environ
    if framework == "ddp":
        world, addr, port = env.get("WORLD_SIZE"), env.get("MASTER_ADDR"), env.get("MASTER_PORT")
        iface = env.get("GLOO_SOCKET_IFNAME") or env.get("NCCL_SOCKET_IFNAME") or env.get("TP_SOCKET_IFNAME")
    elif (framework == "horovod" and backend == "mpi") or "OMPI_COMM_WORLD_SIZE" in env:
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
