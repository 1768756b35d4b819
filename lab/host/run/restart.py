"""--max-restarts K: a job that fails is launched again, whole, up to K times, each
relaunch resuming from the job's last checkpoint (--checkpoint-every; without it, from
step 0), and the record says so.

Why the whole job, from here: a relaunch is a fresh launcher (the kit's own for local
DDP, which sets TORCHELASTIC_MAX_RESTARTS=0, or horovodrun), a fresh rendezvous and fresh
ranks, exactly as the first launch was, so every place's failure naming, stall watch and
records work on it unchanged. Not Horovod Elastic: it blacklists a failed rank's host
and goes on with the ranks left, or stops when every host is blacklisted
(horovod/runner/elastic/registration.py, Horovod 0.28.1), so the job would not end at its
np, and it covers Gloo only. Nor a second hvd.init() within one plain horovodrun: its Gloo
rendezvous server clears every group's list of finished ranks on a DELETE
(horovod/runner/http/http_server.py, RendezvousHandler.do_DELETE); a new horovodrun has a
new server.

What a relaunch is: its own launch name (lab.common.restarts.attempt_of: its failures/
and heartbeats/ folders), RunConfig.restart set (the ranks resume, and --fault does not
fire again: lab.worker.checkpoint). The failed launch's record is not kept as a failed
run: it goes into the record of the launch that ended the job, as one entry of
`restarts` per relaunch (the failure as bench named it, the step resumed from, the time
lost). A job that still fails after K relaunches is recorded failed, with its restarts."""
from __future__ import annotations

import dataclasses
import json
import shutil
import time

from lab.common import restarts, results

ERROR_KEYS = ("rank", "host", "exit_code", "signal", "reason")


class Relaunches:
    """One job's launches under --max-restarts, as bench's job loop makes them
    (lab.host.run.bench.run_job): `launches()` gives each launch's configuration in turn,
    `ended(failed)` after each says whether the job is over (its one record kept, with
    its restarts), `interrupted()` keeps what ran when a launch raises."""

    def __init__(self, s, cfg, rfile, echo):
        self.s, self.cfg, self.rfile, self.echo = s, cfg, rfile, echo
        self.folder = restarts.folder(rfile.parent, cfg.attempt)
        shutil.rmtree(self.folder, ignore_errors=True)     # a first launch never resumes another's
        if not s.checkpoint_every:
            echo(f"note: --max-restarts {s.max_restarts} without --checkpoint-every: a relaunch "
                 f"starts again from step 0")
        self.failures: list[dict] = []
        self.first = len(results.read_records(rfile)[0])   # this job's launches write from here on
        self.n, self.before, self.launched = 0, self.first, 0.0

    def launches(self):
        for n in range(self.s.max_restarts + 1):
            self.n = n
            self.before = len(results.read_records(self.rfile)[0])
            self.launched = time.time()
            yield dataclasses.replace(self.cfg, restart=n, attempt=restarts.attempt_of(self.cfg.attempt, n))

    def interrupted(self) -> None:
        """A launch interrupted (recorded by bench) or refused: what ran is kept."""
        _keep_last(self.rfile, self.first, _resumed(self.folder, self.n, self.failures))

    def ended(self, failed: int) -> bool:
        """After launch n: True when the job is over (ok, out of relaunches, or the launch
        wrote no record), its records folded into one; else the failure kept for the
        next launch's record, and the relaunch said."""
        ended = time.time()
        self.failures = _resumed(self.folder, self.n, self.failures)
        new = results.read_records(self.rfile)[0][self.before:]
        if not failed or self.n == self.s.max_restarts or not new:
            _keep_last(self.rfile, self.first, self.failures)
            return True
        error = new[-1].get("error") or {}
        self.failures.append({"attempt": restarts.attempt_of(self.cfg.attempt, self.n),
                              "started_at": new[-1].get("started_at"),
                              "error": {k: error.get(k) for k in ERROR_KEYS if k in error},
                              "launched_at": self.launched, "ended_at": ended})
        self.echo(f"!! relaunching the job ({self.n + 1} of at most {self.s.max_restarts}) after: "
                  f"{error.get('reason', 'a failure')}")
        return False


def _keep_last(rfile, first: int, failures: list[dict]) -> None:
    """The job's one record: its last launch's (an earlier failed launch's when a relaunch
    wrote none), with the restarts; the earlier launches' records taken out only now, so
    that a relaunch that ends in an exception loses nothing already recorded."""
    if not failures:
        return
    count = len(results.read_records(rfile)[0]) - first
    seen = [0]

    def update(r):
        seen[0] += 1
        return {**r, "restarts": failures} if seen[0] == count else results.DROP
    results.update_records(rfile, first, update)


def _resumed(folder: str, n: int, failures: list[dict]) -> list[dict]:
    """The failures so far, the last one completed with where relaunch `n` resumed (its
    rank 0's file) and the time that fault cost: the work since the checkpoint it
    resumed from (all of the failed launch's without one) and the relaunch up to the
    resumed first step."""
    if n == 0 or not failures:
        return failures
    try:
        with open(restarts.resumed_path(folder, n)) as f:
            said = json.load(f)
    except (OSError, ValueError):
        said = {}
    last = dict(failures[-1])
    if "ended_at" not in last:          # completed already
        return failures
    ended = last.pop("ended_at")
    launched = last.pop("launched_at")
    # the work lost: since the failed launch's own last checkpoint (one an earlier launch
    # wrote counts from this launch's start: the time before it was counted by that fault)
    redone = ended - max(said.get("saved_at") or launched, launched)
    relaunch = said["resumed_at"] - ended if said.get("resumed_at") else None
    last.update(resumed_from_step=said.get("from_step"), checkpoint=said.get("checkpoint"),
                redone_s=round(redone, 3), relaunch_s=None if relaunch is None else round(relaunch, 3),
                lost_s=None if relaunch is None else round(redone + relaunch, 3))
    return [*failures[:-1], last]

