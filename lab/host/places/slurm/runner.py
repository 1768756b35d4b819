"""The simulated cluster's Slurm as a runner (`--launcher slurm`, `invoke up --scheduler
slurm`): bench's launch as a batch job submitted from node1, its output file followed and
its state polled until it is final; the nodes and their `docker exec` are
lab.host.places.compose.runner's.

--max-restarts here is bench's relaunch (lab.host.run.restart), each relaunch a batch job of
its own (<run>/slurm/<attempt>-restart<n>/job.sbatch) resuming from the checkpoints in
the run's folder, which every node mounts. Not Slurm's requeue: `sbatch --requeue` makes
a job eligible to be requeued "by a system administrator, after node failure, or upon
preemption" (SchedMD/slurm doc/man/man1/sbatch.1, --requeue: lines 2036-2041 at tag
slurm-22-05-8-1), not when its ranks fail, and a requeued job starts its script again
under the same job id (so too a requeue by the job's owner, `scontrol requeue`, or a
site's RequeueExit), so one job's output file, state and exit code would hold every
launch; nor a job step retried inside the script (what `invoke sbatch` writes, where no
bench is there to relaunch): bench would see one job's final state, with each failed
step only in its output. A batch job per
launch keeps each launch's state, exit code, failure naming and stall watch what they
are for a first launch, and the record's `restarts` lab.host.run.restart's, as on every
other place; the price is a second wait in the queue on a busy cluster."""
from __future__ import annotations

import collections
import os
import time

from lab.common import proc
from lab.common.kit import horovod_controller
from lab.host.places.base import JobResult
from lab.host.places.compose.cluster import ClusterError, exec_out, node_names
from lab.host.places.compose.runner import ClusterRunner, dead_nodes
from lab.host.places.image import hand_over
from lab.host.places.slurm import script as slurm


class SlurmClusterRunner(ClusterRunner):
    """The job goes to the cluster's Slurm (`invoke up --scheduler slurm`): bench writes
    <run>/slurm/<attempt>/job.sbatch (lab.host.places.slurm.script.job_script), submits it from node1
    with `sbatch --parsable` as the user lab, echoes the job's output file as it grows,
    and asks `scontrol` for the job's state every second until it is final. Stopping it
    (Ctrl-C, --timeout-s) is `scancel`."""

    up_flags = " --scheduler slurm"

    sweep_shares = False        # each combination its own batch jobs: bench's choice
    # Slurm allocates the CPUs= that docker/cluster/slurm.sh wrote from `slurmd -C` when the
    # node started, and a slurmd restarted on a share would register fewer than that
    # (slurm.conf(5), NodeName CPUs): Slurm's nodes keep the cores they started with
    owns_cores = False

    launcher = "slurm"
    title = "Slurm on the simulated cluster (--launcher slurm)"
    # --checkpoint-every, --max-restarts: bench's relaunch, a batch job per launch (above)
    honours = ClusterRunner.honours | {"launcher", "partition"}
    POLL_S = 1.0
    CONTROLLER_SILENCE_S = 60.0     # scontrol failing this long: the job's state is unknown

    @classmethod
    def from_request(cls, s, options, echo=print) -> "SlurmClusterRunner":
        return cls(s.nodes, frozen=s.frozen, partition=s.partition, echo=echo)

    def __init__(self, n: int, frozen: bool = False, partition: str = "", echo=print):
        super().__init__(n, frozen=frozen, echo=echo)
        self.partition = partition
        rc, out = self._on_node1(["sinfo", "-h", "-N", "-o", "%N %t"])
        if rc == 127:
            raise ClusterError(f"the cluster's image ({self.tag}) has no Slurm: rebuild it with "
                               f"`invoke build`, then `invoke up --nodes {n} --scheduler slurm`")
        if rc != 0:
            raise ClusterError(f"Slurm does not answer on node1 ({_last(out)}): bring the cluster up "
                               f"with `invoke up --nodes {n} --scheduler slurm`")
        known = {line.split()[0] for line in out.splitlines() if line.split()}
        missing = [h for h in node_names(n) if h not in known]
        if missing:
            raise ClusterError(f"Slurm on this cluster has no node {', '.join(missing)} (it knows "
                               f"{', '.join(sorted(known)) or 'none'}): bring it up with "
                               f"`invoke up --nodes {n} --scheduler slurm`")
        self.run_dir: str | None = None
        self._job = None
        self._launch = None
        self._job_id: str | None = None
        self._nodes_of: tuple[str, list[str]] = ("", [])
        self.last_job: dict | None = None     # the job submitted last: its id and script
        self.state = ""                         # its JobState as last polled

    def ranks_started(self) -> bool:
        """A batch job's ranks have started once Slurm runs it (RUNNING, or past it)."""
        return self.state not in ("", "PENDING", "CONFIGURING", "REQUEUED")

    def srun_tasks_are_ranks(self, job) -> bool:
        """Horovod over MPI under Slurm runs every rank as an srun task."""
        return job.framework == "horovod" and horovod_controller(job.backend) == "mpi"

    def cancelled_job(self) -> dict | None:
        """The job submitted last, under the scheduler's name and how it was cancelled."""
        return {"name": "slurm", "cancel": "scancel", **self.last_job} if self.last_job else None

    def describe(self) -> str:
        return (f"submitting to Slurm on the cluster's {self.n} nodes ({self.tag}); "
                f"results in {self.results_dir}")

    def prepare(self, path: str) -> None:
        super().prepare(path)
        self.run_dir = path

    def commands(self, job):
        """node1 -> the sbatch of this launch's script (<run>/slurm/<attempt>/job.sbatch,
        written by run() just before it runs this very command)."""
        import dataclasses
        self._launch = job
        inside = self._paths(job.attempt or "job")[1]
        self._job = slurm.SlurmJob(
            job.framework, job.backend, job.np, self.n, list(job.worker_args), partition=self.partition,
            job_name=f"lab-{job.attempt or 'job'}"[:64], time_limit_s=job.timeout_s,
            output=f"{inside}/slurm-%j.out", env=self.env(job.environment),
            threads=job.config.threads if job.config else 1,
            comment=f"dl-lab-kit: {job.framework} over {job.backend}, {job.np} rank(s) on {self.n} "
                    f"node(s).\nSubmit with: sbatch job.sbatch")
        slurm.job_script(dataclasses.replace(self._job))   # refuses what Slurm cannot run, first
        return {"node1": ["sbatch", "--parsable", f"{inside}/job.sbatch"]}

    def _paths(self, attempt: str) -> tuple[str, str]:
        """The attempt's Slurm folder: (on this host, as the nodes see it)."""
        rel = os.path.relpath(os.path.join(self.run_dir, "slurm", attempt), self.results_dir)
        return os.path.join(self.results_dir, rel), f"{self.results_in}/{rel}"

    def run(self, commands, env, timeout_s, echo, name=""):
        """Write the script commands() named, then run that command on node1."""

        self.last_job, self.state = None, ""
        here, inside = self._paths(self._launch.attempt or "job")
        os.makedirs(here, exist_ok=True)
        with open(os.path.join(here, "job.sbatch"), "w") as f:
            f.write(slurm.job_script(self._job))
        hand_over(os.path.dirname(here), self.results_dir, everyone=True)
        script = os.path.relpath(os.path.join(here, "job.sbatch"), self.run_dir)
        self.started = {"node1": list(commands["node1"])}
        rc, out = self._on_node1(commands["node1"], timeout=60)
        if rc != 0:
            why = f"sbatch refused the job: {_last(out)}"
            return JobResult(1, [why], why, {"name": "slurm", "job_id": None, "script": script})
        self._job_id = job_id = slurm.job_id_of(out)
        self.last_job = {"job_id": job_id, "script": script}
        echo(f"submitted Slurm job {job_id} ({inside}/job.sbatch)")
        log = os.path.join(here, f"slurm-{job_id}.out")
        tail: collections.deque[str] = collections.deque(maxlen=proc.TAIL_LINES)
        reader = _FileLines(log)
        deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
        info: dict = {}
        ours = None
        seen: list[str] = []            # the states the job went through, as polled
        node_failed_at = silent_since = None
        t0 = time.monotonic()
        try:
            while True:
                time.sleep(self.POLL_S)
                for line in reader.lines():
                    tail.append(line)
                    echo(line)
                    if slurm.NODE_FAILURE_LINE in line and node_failed_at is None:
                        node_failed_at = time.monotonic()
                asked = time.monotonic()
                rc, out = self._on_node1(["scontrol", "-o", "show", "job", job_id], timeout=30)
                if rc == 0 or "Invalid job id" in out:
                    silent_since = None
                elif silent_since is None:
                    # silent since it was asked: a call to a controller that is gone itself
                    # takes its MessageTimeout and retries before it fails
                    silent_since = asked
                if silent_since is not None and time.monotonic() - silent_since > self.CONTROLLER_SILENCE_S:
                    # Without an answer the job's state is unknown, whatever --timeout-s is
                    # (0: none): end here rather than poll forever.
                    ours = (f"Slurm's controller did not answer for {self.CONTROLLER_SILENCE_S:g} s "
                            f"({_last(out)}): the job's state is unknown; check `scontrol ping` "
                            f"on node1 and `squeue -j {job_id}`")
                    break
                if rc == 0:
                    info = slurm.job_fields(out)
                    self.state = info.get("JobState", "")
                    now = f"{info.get('JobState')}/{info.get('Reason')}"
                    if not seen or seen[-1].split(" ", 1)[1] != now:
                        seen.append(f"{time.monotonic() - t0:.0f}s {now}")
                elif "Invalid job id" in out:   # purged (MinJobAge): keep the last state seen
                    break
                if slurm.is_final(info.get("JobState", "")):
                    break
                if node_failed_at is None and (info.get("Reason") == "NodeDown" or self._job_node_down(info)):
                    node_failed_at = time.monotonic()
                # Slurm has ended the job for a lost node, but srun may go on trying to
                # reach it (seen here: a minute of getaddrinfo retries before the state
                # turned NODE_FAIL): cancel it, and take NODE_FAIL as its state if
                # scontrol does not say so within 10 s.
                if node_failed_at is not None:
                    self._cancel()
                    if time.monotonic() - node_failed_at > 10:
                        info = {**info, "JobState": "NODE_FAIL", "Reason": "NodeDown"}
                        seen.append(f"{time.monotonic() - t0:.0f}s NODE_FAIL/NodeDown (taken "
                                    f"from the job's output)")
                        break
                if slurm.never_runs(info):
                    self._cancel()
                    return JobResult(1, list(tail), slurm.state_sentence(job_id, info, []), {
                        "name": "slurm", "job_id": job_id, "state": "PENDING",
                        "reason": info.get("Reason"), "exit_code": None, "nodes": [],
                        "failed_nodes": [], "script": script})
                if deadline and time.monotonic() > deadline and ours is None:
                    ours = f"did not finish within {timeout_s:g} s and was cancelled (scancel)"
                    self._cancel()
                    deadline = time.monotonic() + 60     # for the cancel to land
                elif deadline and ours and time.monotonic() > deadline:
                    break
        finally:
            if not slurm.is_final(info.get("JobState", "")):
                self._cancel()
            time.sleep(self.POLL_S)             # the last lines slurmstepd writes
            for line in reader.lines(final=True):
                tail.append(line)
                echo(line)
            self._job_id = None
        state = info.get("JobState", "UNKNOWN")
        nodes = self._hostnames(info.get("NodeList", ""))
        failed = self._failed_nodes(info.get("NodeList", "")) if state == "NODE_FAIL" else []
        facts = {"name": "slurm", "job_id": job_id, "state": state,
                 "exit_code": info.get("ExitCode"), "reason": info.get("Reason"),
                 "nodes": nodes, "failed_nodes": failed, "script": script, "states": seen}
        if ours or state == "TIMEOUT":
            return JobResult(None, list(tail), ours or slurm.state_sentence(job_id, info, failed), facts)
        code = info.get("ExitCode", "1:0").split(":")[0]
        rc = 0 if state == "COMPLETED" and info.get("ExitCode") == "0:0" else (
            int(code) if code.isdigit() and int(code) else 1)
        return JobResult(rc, list(tail), "exited" if rc == 0 else
                         slurm.state_sentence(job_id, info, failed), facts)

    def _job_node_down(self, info: dict) -> bool:
        """Whether sinfo shows one of the job's nodes down (Slurm noticed, SlurmdTimeout)
        while the job is not final yet: when the node died before its tasks started,
        srun retries it for minutes and the job can stay RUNNING, then COMPLETING."""
        nodes = info.get("NodeList", "")
        if not nodes or nodes == "(null)":
            return False
        if self._nodes_of[0] != nodes:
            self._nodes_of = (nodes, self._hostnames(nodes))
        rc, out = self._on_node1(["sinfo", "-h", "-N", "-o", "%N %T"])
        return rc == 0 and bool(slurm.down_nodes(out, self._nodes_of[1], silent=False))

    FAILED_TRIES = 5        # sinfo asked again this many times, POLL_S * 2 apart

    def _failed_nodes(self, nodelist: str) -> list[str]:
        """The nodes of a NODE_FAIL job that failed: those sinfo shows down (else not
        responding), asked again while node1's answers come back empty under load (CI,
        2026-11-28: a NODE_FAIL record named "node[1-2]" and no node); then those of the
        job's nodes whose container has stopped (a killed node)."""
        for attempt in range(self.FAILED_TRIES):
            nodes = self._hostnames(nodelist)
            rc, sinfo = self._on_node1(["sinfo", "-h", "-N", "-o", "%N %T"])
            failed = slurm.down_nodes(sinfo, nodes) if rc == 0 else []
            if failed:
                return failed
            if attempt < self.FAILED_TRIES - 1:
                time.sleep(self.POLL_S * 2)
        return [name for name in self._hostnames(nodelist) if not self._running(name)]

    def _running(self, name: str) -> bool:
        node = self.found.get(name)
        if node is None:
            return True         # not one of ours: no evidence it stopped
        try:
            node.reload()
        except Exception:       # gone from the engine: it stopped
            return False
        return node.status == "running"

    def _hostnames(self, nodelist: str) -> list[str]:
        if not nodelist or nodelist == "(null)":
            return []
        rc, out = self._on_node1(["scontrol", "show", "hostnames", nodelist])
        return out.split() if rc == 0 else [nodelist]

    def _on_node1(self, cmd: list[str], timeout: float = 30) -> tuple[int, str]:
        """A Slurm command on node1 (the controller); a node1 that has stopped is one
        sentence (ClusterError), not the engine's error."""
        import docker
        try:
            return exec_out(self.found["node1"], cmd, timeout=timeout)
        except docker.errors.APIError as e:
            raise ClusterError(f"node1, where Slurm's controller runs, cannot be reached "
                               f"({getattr(e, 'explanation', None) or e}): see `docker compose ps`, "
                               f"and bring the cluster up again with `invoke up --scheduler slurm`") from None

    def _cancel(self) -> None:
        if self._job_id:
            try:
                self._on_node1(["scancel", self._job_id])
            except ClusterError:
                pass

    def stop(self) -> None:
        self._cancel()
        super().stop()          # ranks horovodrun started over SSH are not Slurm's tasks

    def dead(self) -> dict[str, str]:
        # Slurm says which node failed (JobResult.scheduler), but not when it is node1,
        # its own controller.
        return {h: state for h, state in dead_nodes(self.found).items() if h == "node1"}


def _last(out: str) -> str:
    return (out.strip().splitlines() or ["no output"])[-1].strip()


class _FileLines:
    """The complete lines a growing file gains between calls."""

    def __init__(self, path: str):
        self.path, self.pos, self.rest = path, 0, b""

    def lines(self, final: bool = False) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return []
        self.pos += len(data)
        data = self.rest + data
        parts = data.split(b"\n")
        self.rest = b"" if final else parts.pop()
        return [p.decode(errors="replace").rstrip("\r") for p in parts if p or not final]
