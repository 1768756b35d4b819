"""The one loop of a job made of several parts, one per host (a launcher started over
`docker exec` on each node of the compose cluster, or over ssh on each of your servers):
start them all, stream each one's lines with its host's prefix, poll, stop every part on
the first failure, a lost node or the time limit, and answer with the exit status of the
part that failed first (not the worst number: the peers the failure took down end later,
killed, with codes of their own). The runners give it their parts; the loop is the same."""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Callable

from lab.common import proc


class Part:
    """One started part of a job: `poll()` is its exit code once it ended (None before);
    `ended_at` the monotonic time it ended; `finish()` waits for its last output."""

    host = ""
    ended_at: float | None = None

    def poll(self) -> int | None:
        raise NotImplementedError

    def finish(self) -> None:
        """After it ended (or was stopped): its last lines read, nothing of it left."""


class ProcessPart(Part):
    """A local process (lab.common.proc): ssh to a server, or a launcher here. A thread
    waits for it, so `ended_at` is when it exited, not when a poll noticed: of two parts
    that fail within one poll, the one that failed first is named."""

    def __init__(self, host: str, process: proc.Process):
        self.host, self.process = host, process
        self._rc: int | None = None
        self._done = threading.Event()
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        rc = self.process.popen.wait()
        self.ended_at = time.monotonic()
        self._rc = rc
        self._done.set()

    def poll(self) -> int | None:
        return self._rc if self._done.is_set() else None

    def finish(self) -> None:
        self.process.wait(5)        # its readers joined, stragglers of its group ended


class StreamPart(Part):
    """A part whose output arrives as byte chunks (`open_stream()`, called on the part's
    own thread) and whose exit code is asked for once it has ended (a `docker exec`)."""

    def __init__(self, host: str, open_stream: Callable[[], object],
                 exit_code: Callable[[], int | None], out: Callable[[str], None]):
        self.host, self._exit_code = host, exit_code
        self._rc: int | None = None
        self._done = threading.Event()
        self.thread = threading.Thread(target=self._pump, args=(open_stream, out), daemon=True)
        self.thread.start()

    def _pump(self, open_stream, out) -> None:
        try:
            for text in proc.iter_lines(open_stream()):
                out(text)
        finally:
            try:
                rc = self._exit_code()
            except Exception:
                rc = None
            self._rc = 1 if rc is None else rc
            self.ended_at = time.monotonic()
            self._done.set()

    def poll(self) -> int | None:
        return self._rc if self._done.is_set() else None

    def finish(self) -> None:
        self.thread.join(timeout=10)


@dataclass
class Outcome:
    returncode: int | None            # None: stopped at the time limit
    tail: list[str]
    why: str                          # exited | <host>'s launcher failed | <node> stopped | did not finish ...
    first_failed: str = ""            # the host whose part failed first


class Job:
    """Parts started one after another by `start(host, out)` (out: that host's line
    sink); `run` waits for them. Lines go to `echo` with a "[host] " prefix when the job
    has several parts; the last ones are kept (`tail`) under a lock, since every part's
    output arrives on a thread of its own."""

    def __init__(self, hosts: list[str], echo, tail: int = proc.TAIL_LINES):
        self.hosts, self.echo = list(hosts), echo
        self.many = len(self.hosts) > 1
        self._lock = threading.Lock()
        self.tail: collections.deque[str] = collections.deque(maxlen=tail)
        self.parts: dict[str, Part] = {}

    def out(self, host: str) -> Callable[[str], None]:
        def line(text: str) -> None:
            text = f"[{host}] {text}" if self.many else text
            with self._lock:
                self.tail.append(text)
            self.echo(text)
        return line

    def run(self, start: Callable[[str, Callable[[str], None]], Part], timeout_s: float,
            stop_all: Callable[[], None], lost: Callable[[], list[str]] = lambda: [],
            poll_s: float = 0.3) -> Outcome:
        """Start every part, then poll until all have ended, one failed, `lost()` names a
        node that stopped, or the time limit (0: none) passes; then `stop_all()` ends
        whatever still runs. Ctrl-C stops them too, and is raised on."""
        deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
        why, first = "exited", None
        try:
            for host in self.hosts:
                self.parts[host] = start(host, self.out(host))
            while True:
                codes = {h: p.poll() for h, p in self.parts.items()}
                failed = [h for h, rc in codes.items() if rc not in (None, 0)]
                if failed:
                    first = min(failed, key=lambda h: (self.parts[h].ended_at or float("inf"),
                                                       self.hosts.index(h)))
                    why = f"{first}'s launcher failed" if self.many else "the launcher failed"
                    break
                if all(rc is not None for rc in codes.values()):
                    break
                gone = lost()
                if gone:
                    why = f"{', '.join(gone)} stopped"
                    break
                if deadline and time.monotonic() > deadline:
                    why = f"did not finish within {timeout_s:g} s and was stopped"
                    break
                time.sleep(poll_s)
        finally:
            if any(p.poll() is None for p in self.parts.values()) or why != "exited":
                stop_all()
            for part in list(self.parts.values()):
                part.finish()
        with self._lock:
            tail = list(self.tail)
        if why.startswith("did not finish"):
            return Outcome(None, tail, why)
        if first is not None:
            return Outcome(self.parts[first].poll(), tail, why, first)
        if why != "exited":
            return Outcome(1, tail, why)
        return Outcome(0, tail, why)
