"""The ranks as processes of this machine, started by the framework's launcher."""
from __future__ import annotations

import os
import sys

from lab.common import kit, proc
from lab.host.places import launch, stack_cache
from lab.host.places.base import JobResult, Launch, Runner


class LocalRunner(Runner):
    """The ranks as processes of this machine, started by the framework's launcher."""

    kind = "local"
    title = "local processes"
    honours = frozenset({"local", "results_dir", "data_dir", "checkpoint_every", "max_restarts"})
    records_where_note = False

    @classmethod
    def from_request(cls, s, options, echo=print) -> "LocalRunner":
        return cls(s.results_dir, s.data_dir)

    def __init__(self, results_dir: str = "results", data_dir: str | None = "data",
                 python: str = sys.executable):
        super().__init__(results_dir, data_dir)
        self.python = python
        self._running: proc.Process | None = None
        self._stack: dict | None = None      # what probe_stack found

    def describe(self) -> str:
        return "running as local processes"

    def commands(self, job: Launch):
        if job.framework == "ddp":      # one machine: no torchrun (it imports torch first)
            return {"localhost": launch.local_ddp_command(job.np, list(job.worker_args), self.python)}
        cmd = launch.command(job.framework, job.backend, job.np, list(job.worker_args),
                             python=self.python, horovodrun=kit.horovodrun(self.python))
        return {"localhost": launch.lean_horovodrun(cmd, self._stack, self.python)}

    def run(self, commands, env, timeout_s, echo, name=""):
        (cmd,) = commands.values()
        self._running = proc.start(cmd, env=dict(os.environ, **env), echo=echo, keep_output=False)
        self.started = {next(iter(commands)): list(self._running.argv)}
        try:
            res = self._running.wait(timeout_s)
        finally:
            self._running = None
        if res.timed_out:
            return JobResult(None, res.tail, f"did not finish within {timeout_s:g} s and was stopped")
        return JobResult(res.returncode, res.tail, "exited")

    def output(self, argv, timeout_s=300):
        res = proc.run(argv, timeout=timeout_s)
        return res.returncode, res.stdout

    def probe_stack(self, timeout_s: float = 120) -> dict:
        """The probe's answer, from the cache of this Python's last one while nothing it
        depends on changed (lab.host.places.stack_cache): seconds of imports saved per run."""
        self._stack = stack_cache.cached(stack_cache.local_key(self.python),
                                         lambda: super(LocalRunner, self).probe_stack(timeout_s))
        return self._stack

    def stop(self):
        running = self._running     # read once: run() clears it when the job ends
        if running is not None:
            running.stop()
