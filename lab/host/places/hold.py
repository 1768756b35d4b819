"""One run at a time on what it measures. A run's steps are its ranks' share of this
machine's cores (local processes, the lab image, the simulated cluster's nodes, which are
containers here): two runs at once each record a step the other slowed, and neither could
tell. So a run holds this machine while its ranks run (bench's jobs, doctor's collectives
across the nodes); a second waits, saying which run holds it and how long it has waited,
or, asked not to wait, refuses in one sentence. A place whose ranks run on machines of
their own (Kubernetes) holds nothing here (Runner.holds).

The hold is an flock(2) on a file in HOLD_DIR: the kernel frees it when its holder's
process ends, however it ends, so a holder that died frees it. Beside the lock the file
holds the holder's facts (run id, process, since when, a token): the token is in the
environment of every process the run launches (job_env), and a holder that died in
the middle of a run (SIGKILL: no `finally` ran) leaves "ended": false, so the next
holder stops the processes it left running (its ranks, its launcher) before its own
start, and no record of theirs lands beside the next run's."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lab.common.display import duration
from lab.host.errors import BenchError

HOLD_DIR_VAR = "LAB_HOLD_DIR"     # where the hold files are (tests: a folder of their own)
TOKEN_VAR = "LAB_HOLD_TOKEN"      # in every launched process's environment
MACHINE = "this-machine"          # what a run sharing this machine's cores holds (Runner.holds)
CLUSTER_PLACE = "cluster"         # Runner.kind of the simulated cluster (direct and Slurm)
WAIT_NOTE_EVERY_S = 15.0          # a waiting run says so this often
STOP_GRACE_S = 5.0                # a left process: SIGTERM, then SIGKILL after this


def hold_dir() -> Path:
    return Path(os.environ.get(HOLD_DIR_VAR) or Path.home() / ".cache" / "dl-lab-kit" / "holds")


@dataclass
class Holder:
    run_id: str
    pid: int
    since: float              # time.time() when it took the hold
    token: str
    what: str = ""            # what it runs: "bench", "doctor"
    place: str = ""           # where its ranks run (Runner.kind: "local", "cluster", ...)
    ended: bool = False       # it gave the hold back itself

    def describe(self, now: float | None = None) -> str:
        ago = duration((now or time.time()) - self.since, rough=True)
        started = time.strftime("%H:%M:%S", time.localtime(self.since))
        return (f"{self.what or 'a run'} {self.run_id} (process {self.pid}, since {started}, "
                f"{ago} ago)")


def read_holder(path: Path) -> Holder | None:
    try:
        return Holder(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _write(fd: int, holder: Holder) -> None:
    data = json.dumps(asdict(holder)).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def left_processes(token: str) -> list[int]:
    """The processes of this machine whose environment carries a holder's token (its
    launchers and ranks, in containers too: /proc shows them), this process's kin aside."""
    mark = f"{TOKEN_VAR}={token}".encode()
    own = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if mark in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def stop_processes(pids: list[int], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL to what is left after `grace_s`; each waited for (at most
    `grace_s`) until gone, so that what the caller starts next never meets them: a kill
    is delivered, not done, when os.kill returns."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [p for p in pids if _alive(p)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        end = time.monotonic() + grace_s
        while time.monotonic() < end and any(_alive(p) for p in pids):
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not running
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


_held: dict[str, list] = {}   # name -> [fd, depth]: a process may hold again what it holds


@contextlib.contextmanager
def hold(name: str, run_id: str, *, what: str = "bench", place: str = "", wait: bool = True,
         echo=print, title: str = "this machine", poll_s: float = 0.5, clear=None,
         hint: str = "; --no-wait refuses instead"):
    """Hold `name` (a file name) while the block runs. Another holder: wait (a line every
    WAIT_NOTE_EVERY_S naming it and the time waited) or, with wait=False, BenchError. A
    block is given the seconds it waited. A
    last holder that did not end (killed mid-run): its processes left running are
    stopped first (and `clear()`, the place's own cleanup, called when that holder ran on
    the same `place`: the cluster's nodes, where its ranks on other nodes carry no token)."""
    if name in _held:
        _held[name][1] += 1
        try:
            yield 0.0
        finally:
            _held[name][1] -= 1
        return
    folder = hold_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.hold"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise BenchError(f"the hold folder {folder} cannot be used ({e.strerror or e}): set "
                         f"{HOLD_DIR_VAR} to a folder this user can write") from None
    try:
        started = time.monotonic()
        said = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                other = read_holder(path)
                who = other.describe() if other else "another run"
                # a look that takes the lock for an instant (holder_now), or a holder
                # writing its facts: not a run yet, so a refusal waits a moment for it
                settling = other is None or other.ended
                if not wait and settling and time.monotonic() - started < 2.0:
                    time.sleep(0.05)
                    continue
                if not wait:
                    raise BenchError(f"{who} is running on {title}, and two runs at once would each "
                                     f"measure the other's load: wait for it (leave out --no-wait), "
                                     f"or stop it") from None
                waited = time.monotonic() - started
                if said is None or waited - said >= WAIT_NOTE_EVERY_S:
                    echo(f"waiting for {title}: {who} is running there (waited "
                         f"{duration(waited, rough=True)}{hint})")
                    said = waited
                time.sleep(poll_s)
        last = read_holder(path)
        if last and not last.ended:
            left = [p for p in left_processes(last.token) if _alive(p)]
            if left:
                echo(f"stopping {len(left)} process(es) that {last.describe()} left running "
                     f"when it was killed")
                stop_processes(left)
            if clear is not None and last.place == place:
                clear()         # the place's own: what a killed run left on the same place
        me = Holder(run_id=run_id, pid=os.getpid(), since=time.time(),
                    token=f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}", what=what,
                    place=place)
        _write(fd, me)
        before = os.environ.get(TOKEN_VAR)
        os.environ[TOKEN_VAR] = me.token
        _held[name] = [fd, 0]
        try:
            yield time.monotonic() - started
        finally:
            del _held[name]
            if before is None:
                os.environ.pop(TOKEN_VAR, None)
            else:
                os.environ[TOKEN_VAR] = before
            me.ended = True
            with contextlib.suppress(OSError):
                _write(fd, me)
    finally:
        os.close(fd)        # closing frees the lock


def holder_now(name: str) -> Holder | None:
    """Who holds `name` now (None: nobody; the file kept by the last holder says nothing)."""
    path = hold_dir() / f"{name}.hold"
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return read_holder(path) or Holder("?", 0, time.time(), "")
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
