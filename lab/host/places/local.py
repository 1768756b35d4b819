"""The ranks as processes of this machine, started by the framework's launcher."""
from __future__ import annotations

import os
import sys

from lab.common import kit, proc
from lab.host import launch
from lab.host.places.base import JobResult, Launch, Runner


class LocalRunner(Runner):
    """The ranks as processes of this machine, started by the framework's launcher."""

    kind = "local"
    records_where_note = False

    def __init__(self, results_dir: str = "results", data_dir: str | None = "data",
                 python: str = sys.executable):
        super().__init__(results_dir, data_dir)
        self.python = python
        self._running: proc.Process | None = None

    def describe(self) -> str:
        return "running as local processes"

    def commands(self, job: Launch):
        return {"localhost": launch.command(job.framework, job.backend, job.np, list(job.worker_args),
                                            python=self.python,
                                            horovodrun=kit.horovodrun(self.python))}

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

    def stop(self):
        running = self._running     # read once: run() clears it when the job ends
        if running is not None:
            running.stop()
