"""The one way the kit starts a process: in its own process group, its output read as
lines (a last line without a newline kept), echoed with a prefix while it runs, a time
limit, and a stop that sends TERM to the whole group, waits a grace period, then KILLs
it (the pattern of Horovod's safe_shell_exec). `run` returns a `Completed`; with
`check=True` it raises a typed error instead of returning a failure (the shape of
invoke's Context.run / Result / UnexpectedExit). Standard library only: the probes
that run inside the lab image use it too."""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

GRACE_S = 5.0      # between TERM and KILL
TAIL_LINES = 40


class ProcError(Exception):
    """A process that could not start, failed, or outlived its limit."""

    def __init__(self, message: str, result: "Completed | None" = None):
        super().__init__(message)
        self.result = result


class NotFound(ProcError):
    """The program is not there (or not executable)."""


class Failed(ProcError):
    """The program exited with a status other than 0."""


class TimedOut(ProcError):
    """The program outlived its limit and was stopped."""


@dataclass
class Completed:
    argv: list[str]
    returncode: int | None            # None: stopped before it exited (time limit)
    stdout: str = ""                  # the whole output (stdout and stderr merged unless asked)
    stderr: str = ""                  # only with merge=False
    tail: list[str] = field(default_factory=list)   # the last lines, merged
    timed_out: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def last_line(self, default: str = "no output") -> str:
        for line in reversed(self.tail):
            if line.strip():
                return line.strip()
        return default

    def describe(self) -> str:
        """'`cmd` exited with 3: <last line>' or '... did not finish within N s'."""
        cmd = " ".join(self.argv)
        if self.timed_out:
            return f"`{cmd}` did not finish within {self.seconds:.0f} s and was stopped"
        return f"`{cmd}` exited with {self.returncode}: {self.last_line()}"


def iter_lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Bytes as they arrive (a pipe, a container's log stream) -> text lines, without
    their newline; a last line without a newline is kept."""
    buf = b""
    for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode(errors="replace")
    if buf:
        yield buf.rstrip(b"\r").decode(errors="replace")


def _chunks(pipe) -> Iterator[bytes]:
    while True:
        data = pipe.read1(65536) if hasattr(pipe, "read1") else pipe.read(65536)
        if not data:
            return
        yield data


class Process:
    """A started process group. `wait` ends it at its limit; `stop` ends it at once."""

    def __init__(self, argv: list[str], *, env: dict | None = None, cwd: str | None = None,
                 echo: Callable[[str], None] | None = None, prefix: str = "",
                 merge: bool = True, keep_output: bool = True, tail: int = TAIL_LINES):
        self.argv = [str(a) for a in argv]
        self.echo, self.prefix, self.merge, self.keep = echo, prefix, merge, keep_output
        self.tail: collections.deque[str] = collections.deque(maxlen=tail)
        self._out: list[str] = []
        self._err: list[str] = []
        self._lock = threading.Lock()
        self.started = time.monotonic()
        try:
            self.popen = subprocess.Popen(
                self.argv, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
        except (FileNotFoundError, PermissionError, NotADirectoryError) as e:
            raise NotFound(f"{self.argv[0]} cannot be run: {e.strerror or e}") from None
        self._readers = [threading.Thread(target=self._pump, args=(self.popen.stdout, self._out),
                                          daemon=True)]
        if not merge:
            self._readers.append(threading.Thread(target=self._pump,
                                                  args=(self.popen.stderr, self._err), daemon=True))
        for t in self._readers:
            t.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _pump(self, pipe, store: list[str]) -> None:
        for line in iter_lines(_chunks(pipe)):
            with self._lock:
                self.tail.append(line)
                if self.keep:
                    store.append(line)
            if self.echo is not None:
                self.echo(self.prefix + line)

    def poll(self) -> int | None:
        return self.popen.poll()

    def _signal_group(self, sig) -> bool:
        try:
            os.killpg(self.popen.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def stop(self, grace: float = GRACE_S) -> None:
        """TERM to the whole group, `grace` seconds to exit, then KILL."""
        if self.popen.poll() is None and self._signal_group(signal.SIGTERM):
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self._signal_group(signal.SIGKILL)
        self.popen.wait()

    def wait(self, timeout: float | None = None, grace: float = GRACE_S) -> Completed:
        """Wait until it exits or `timeout` seconds (from now; None or <= 0: no limit)
        pass; then stop what is left of its group and return what it printed. Ctrl-C
        stops the group and is raised again."""
        timed_out = False
        try:
            self.popen.wait(timeout=timeout if timeout and timeout > 0 else None)
        except subprocess.TimeoutExpired:
            timed_out = True
            self.stop(grace)
        except BaseException:
            self.stop(grace)
            raise
        # The leader is gone; stragglers it left in the group are ended too (they
        # would otherwise hold the output pipe open).
        self._signal_group(signal.SIGKILL)
        for t in self._readers:
            t.join(timeout=5)
        with self._lock:
            return Completed(self.argv, None if timed_out else self.popen.returncode,
                             "\n".join(self._out), "\n".join(self._err), list(self.tail),
                             timed_out, time.monotonic() - self.started)


def start(argv: list[str], **kwargs) -> Process:
    """Start a process (see Process) without waiting for it."""
    return Process(argv, **kwargs)


def run(argv: list[str], *, timeout: float | None = None, check: bool = False,
        grace: float = GRACE_S, **kwargs) -> Completed:
    """Run to the end (or to `timeout`). check=True: Failed / TimedOut instead of a
    failed Completed. NotFound when the program cannot be started."""
    res = start(argv, **kwargs).wait(timeout, grace)
    if check and res.timed_out:
        raise TimedOut(res.describe(), res)
    if check and res.returncode != 0:
        raise Failed(res.describe(), res)
    return res
