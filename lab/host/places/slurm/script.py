"""Slurm as a launcher: the batch script a run needs (`job_script`, pure, the same for the
simulated cluster and for a real one: `invoke sbatch`), what `scontrol` says of a job
(`job_fields`, `is_final`, `down_nodes`, also pure), and `SlurmRunner`, which submits the
script from node1 of the simulated cluster, streams the job's output file, follows the
job's state with `scontrol` until it is final, and cancels it when asked to stop.

How each framework starts inside the allocation (checked on this kit's CPU image, Slurm
22.05.8 and Debian's Open MPI 4.1.4; the documentation's Slurm page, docs/pages/slurm.md):
- DDP: one torch.distributed.run per node (`srun --ntasks-per-node=1 --cpus-per-task=P`:
  Slurm 22.05 to 23.02 do not pass sbatch's --cpus-per-task on to srun, RELEASE_NOTES),
  meeting at a c10d rendezvous on the allocation's first host, as PyTorch's examples run
  it under Slurm (pytorch/examples distributed/ddp-tutorial-series/slurm/sbatch_run.sh:
  --rdzv-backend c10d --rdzv-endpoint $head_node_ip:29500; the id here is the job's, and
  the port 29500 plus the job id modulo 500, so two jobs sharing a first node do not
  meet). c10d numbers the nodes by its own order (host names), not by --node-rank.
  torchrun starts the ranks and reports a dead one.
- Horovod over MPI: every rank a Slurm task, started by `srun --mpi=pmix` (Open MPI
  finds its peers through Slurm's PMIx; with srun's default, --mpi=none, MPI_Init fails
  with "OMPI was not built with SLURM's PMI support"). Slurm tracks and ends the ranks.
  A site whose Slurm has another PMI plugin (`srun --mpi=list`) edits that line.
- Horovod over Gloo (or NCCL, which rides on it): horovodrun, with -H from
  `scontrol show hostnames` (it does not read an allocation itself), so its ranks start
  over SSH beside Slurm's tasks: this needs SSH between the nodes, and on a real cluster
  a container run (pyxis) cannot do it.
A job that loses a node ends NODE_FAIL (the simulated cluster sets JobRequeue=0, and the
script asks --no-requeue); srun's own exit code after a node failure can be 0, so the
state is read from scontrol, never from the exit code alone.
--max-restarts K (`invoke sbatch`, where no bench is there to relaunch the job) retries
the failed job step inside the allocation up to K times (`retried`); bench's own Slurm
launcher relaunches a failed job as a new batch job instead (lab.host.places.slurm.runner)."""
from __future__ import annotations

import math
import os
import re
import shlex
from dataclasses import dataclass, field

from lab.common import results
from lab.common.options import BY_NAME
from lab.host.errors import BenchError
from lab.host.places import launch
from lab.host.places.base import RunnerError
from lab.host.places.launch import resolve_framework
from lab.host.places.scripts import gpus_per_node as gpus_for
from lab.host.places.scripts import script_config
from lab.host.settings import check_max_restarts

RDZV_PORT = 29500
# Slurm's job states that do not change any more (squeue(1), JOB STATE CODES).
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")
# Why a job waits that no wait will cure (squeue(1), JOB REASON CODES): the request does
# not fit the partition (PartitionConfig: e.g. more tasks per node than a node has CPUs).
# (Slurm's doc/html/job_reason_codes.shtml; QOSJobLimit, AssocMaxJobsLimit and
# PartitionNodeLimit are left out: they clear when other jobs end or nodes come back.)
NEVER_REASONS = ("PartitionConfig", "PartitionTimeLimit", "BadConstraints", "InvalidAccount",
                 "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed", "DependencyNeverSatisfied")
# What slurmstepd writes into the job's output when slurmctld ends it for a lost node:
# "*** JOB 5 ON node1 CANCELLED AT <time> DUE TO NODE FAILURE, SEE SLURMCTLD LOG ..."
NODE_FAILURE_LINE = "DUE TO NODE FAILURE"
CONTAINER_KINDS = ("pyxis", "apptainer", "venv")


class SlurmError(RunnerError):
    """A job Slurm refused or a script that cannot be written: one sentence."""


@dataclass
class SlurmJob:
    """What a batch script says: the run's ranks and where, and the cluster's options."""
    framework: str                    # horovod | ddp
    backend: str                      # gloo | mpi | nccl
    np: int
    nodes: int
    worker_args: list[str]
    job_name: str = "lab-bench"
    time_limit_s: float = 0           # 0: the partition's limit
    output: str = "slurm-%j.out"      # where Slurm writes the job's output (%j: the job id)
    env: dict[str, str] = field(default_factory=dict)
    python: str = "python"
    partition: str = ""
    gpus_per_node: int = 0            # --gres=gpu:N
    threads: int = 1                  # CPU threads per rank (--threads): each rank's CPUs
    container: str = ""               # "", pyxis:IMAGE, apptainer:FILE.sif or venv:DIR
    mounts: list[str] = field(default_factory=list)   # folders a container must see
    comment: str = ""
    retries: int = 0                  # --max-restarts: the job step retried this many times


class Raw(str):
    """A word of the script left unquoted: one the kit writes that holds a shell
    expansion (the node list, the job id). Never a user's value."""


def time_limit(seconds: float) -> str | None:
    """sbatch's --time for a limit in seconds: whole minutes, rounded up (Slurm's unit),
    as [H:]MM:00, or None for no limit."""
    if not seconds or seconds <= 0:
        return None
    minutes = max(1, math.ceil(seconds / 60))
    h, m = divmod(minutes, 60)
    return f"{h}:{m:02d}:00" if h else f"{m}:00"


def ranks_per_node(np: int, nodes: int) -> int:
    """lab.host.places.launch.ranks_per_node (the even-spread rule), as a SlurmError."""
    try:
        return launch.ranks_per_node(np, nodes)
    except launch.HostsError as e:
        raise SlurmError(str(e)) from None


def parse_container(spec: str) -> tuple[str, str]:
    """'pyxis:IMAGE', 'apptainer:FILE.sif' or 'venv:DIR' -> (kind, value); '' -> ('', '')."""
    if not spec:
        return "", ""
    kind, sep, value = spec.partition(":")
    if not sep or kind not in CONTAINER_KINDS or not value:
        raise SlurmError(f"--container takes pyxis:IMAGE, apptainer:FILE.sif or venv:DIR, not {spec!r}")
    return kind, value


def job_script(job: SlurmJob) -> str:
    """The batch script, written the way a user would write it by hand."""
    if job.framework not in ("horovod", "ddp"):
        raise SlurmError("a Slurm job needs a distributed framework: --framework horovod or ddp")
    per = ranks_per_node(job.np, job.nodes)
    kind, where = parse_container(job.container)
    gloo = job.framework == "horovod" and launch.framework_for_backend("horovod", job.backend) == "gloo"
    if kind == "pyxis" and gloo:
        raise SlurmError("Horovod over Gloo starts its ranks with horovodrun over SSH, which a "
                         "pyxis container cannot do: use --backend mpi, DDP, or apptainer:/venv:")
    ddp = job.framework == "ddp"
    # DDP: one task per node (torchrun starts the node's ranks, and gets their CPUs);
    # Horovod: one task (slot) per rank. Each rank gets its --threads CPUs.
    tasks, cpus = (1, per * job.threads) if ddp else (per, job.threads)
    lines = ["#!/bin/bash"]
    if job.comment:
        lines += [f"# {c}" if c else "#" for c in job.comment.splitlines()]
    opts = [f"--job-name={job.job_name}", f"--nodes={job.nodes}", f"--ntasks-per-node={tasks}",
            f"--cpus-per-task={cpus}"]
    if job.partition:
        opts.append(f"--partition={job.partition}")
    if job.gpus_per_node:
        opts.append(f"--gres=gpu:{job.gpus_per_node}")
    limit = time_limit(job.time_limit_s)
    if limit:
        opts.append(f"--time={limit}")
    # A job that loses a node fails (NODE_FAIL) instead of being queued again.
    opts += [f"--output={job.output}", "--no-requeue"]
    lines += [f"#SBATCH {o}" for o in opts]
    lines += ["set -euo pipefail", ""]
    for k, v in job.env.items():
        lines.append(f"export {k}={shlex.quote(str(v))}")
    if kind == "venv":
        lines.append(f"source {shlex.quote(where)}/bin/activate")
    lines += ['hosts=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
              'echo "lab: Slurm job $SLURM_JOB_ID on ${hosts[*]}"', ""]
    python = [job.python]
    srun_extra: list[str] = []
    if kind == "apptainer":
        binds = ",".join(job.mounts)
        python = ["apptainer", "exec", *(["--nv"] if job.gpus_per_node else []),
                  *(["--bind", binds] if binds else []), where, job.python]
    elif kind == "pyxis":
        srun_extra = [f"--container-image={where}"]
        if job.mounts:
            srun_extra.append("--container-mounts=" + ",".join(f"{m}:{m}" for m in job.mounts))
    worker = [*python, "-m", "lab.worker.train", *job.worker_args]
    if ddp:
        cmd = ["srun", "--ntasks-per-node=1", f"--cpus-per-task={cpus}", "--kill-on-bad-exit=1",
               *srun_extra, *python, "-m", "torch.distributed.run", f"--nnodes={job.nodes}",
               f"--nproc-per-node={per}", "--rdzv-backend=c10d", Raw('--rdzv-id="$SLURM_JOB_ID"'),
               Raw(f'--rdzv-endpoint="${{hosts[0]}}:$(({RDZV_PORT} + SLURM_JOB_ID % 500))"'),
               "-m", "lab.worker.train", *job.worker_args]
    elif gloo:
        lines.append(f'slots=$(printf "%s:{per}," "${{hosts[@]}}")')
        cmd = ["horovodrun", "-np", str(job.np), "-H", Raw('"${slots%,}"'), "--gloo", *worker]
    else:
        # srun is given the CPUs of a task itself: Slurm 22.05 to 23.02 do not pass sbatch's
        # --cpus-per-task on to srun (as for DDP above)
        threads = [f"--cpus-per-task={cpus}"] if cpus > 1 else []
        cmd = ["srun", "--mpi=pmix", *threads, "--kill-on-bad-exit=1", *srun_extra, *worker]
    if not job.retries:
        lines.append(_join(cmd))
        return "\n".join(lines) + "\n"
    return "\n".join(lines + retried(cmd, job.retries)) + "\n"


def retried(cmd: list[str], retries: int) -> list[str]:
    """The job step, retried inside the allocation up to `retries` times after it fails:
    retry n runs the ranks with --restart n (they resume from the job's newest checkpoint,
    and --fault does not fire again: lab.worker.checkpoint.resume) under the launch name
    of relaunch n (lab.common.restarts.attempt_of: its own failures/ and heartbeats/)."""
    at = cmd.index("--attempt") if "--attempt" in cmd else -1
    first = cmd[at + 1] if at >= 0 else "manual"
    if at >= 0:
        cmd = cmd[:at] + cmd[at + 2:]
    # each retry a rendezvous of its own (torchrun's c10d: an agent that finds the port
    # still held joins as a client, which must not be the ended step's rendezvous)
    cmd = [Raw('--rdzv-id="$SLURM_JOB_ID-$restart"') if str(w) == '--rdzv-id="$SLURM_JOB_ID"' else w
           for w in cmd]
    cmd = [*cmd, Raw('--attempt "$attempt"'), Raw('--restart "$restart"')]
    step = ["    " + line for line in _join(cmd).splitlines()]
    step[-1] += " || rc=$?"
    first = shlex.quote(first)
    return [f"attempt={first}", f"for restart in $(seq 0 {int(retries)}); do",
            '    if [ "$restart" -gt 0 ]; then',
            f'        attempt={first}-restart"$restart"',
            f'        echo "lab: the job step failed (exit code $rc): retrying it ($restart of at most '
            f'{int(retries)}) from the last checkpoint"',
            "    fi", "    rc=0", *step, '    if [ "$rc" -eq 0 ]; then exit 0; fi', "done", 'exit "$rc"']


def _join(argv: list[str]) -> str:
    """A command line, every word quoted but the kit's own expansions (Raw)."""
    words = [a if isinstance(a, Raw) else shlex.quote(a) for a in argv]
    return " \\\n    ".join(_groups(words))


def _groups(words: list[str]) -> list[str]:
    """The words of a long command in lines of about 88 characters."""
    out, cur = [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > 88:
            out.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    return out + ([cur] if cur else [])


def job_id_of(parsable: str) -> str:
    """`sbatch --parsable` prints "ID" or "ID;CLUSTER" (on a line of its own, among any
    warnings)."""
    for line in parsable.splitlines():
        m = re.match(r"^(\d+)(;\S+)?$", line.strip())
        if m:
            return m.group(1)
    last = (parsable.strip().splitlines() or ["nothing"])[-1].strip()
    raise SlurmError(f"sbatch did not print a job id: {last}")


def job_fields(scontrol: str) -> dict[str, str]:
    """`scontrol -o show job ID`: one line of Key=Value words -> a dict."""
    out = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z][\w:/]*)=(\S*)", scontrol.strip()):
        out.setdefault(m.group(1), m.group(2))
    return out


def is_final(state: str) -> bool:
    return state.split()[0] in FINAL_STATES if state else False


def down_nodes(sinfo: str, among: list[str], silent: bool = True) -> list[str]:
    """Nodes of `among` that `sinfo -h -N -o '%N %T'` shows down or failed; when none is
    and `silent`, those not responding (a trailing '*': a busy node can miss a ping too)."""
    down: list[str] = []
    silent_nodes: list[str] = []
    for line in sinfo.splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[0] not in among:
            continue
        state = parts[1].lower()
        if any(s in state for s in ("down", "fail")) and parts[0] not in down:
            down.append(parts[0])
        elif state.endswith("*") and parts[0] not in silent_nodes:
            silent_nodes.append(parts[0])
    return down or (silent_nodes if silent else [])


def never_runs(info: dict) -> bool:
    """A pending job whose reason says the request itself cannot be met."""
    return info.get("JobState") == "PENDING" and info.get("Reason") in NEVER_REASONS


def state_sentence(job_id: str, info: dict, failed: list[str]) -> str:
    """What Slurm says of a job that did not complete, in one sentence."""
    state = info.get("JobState", "?")
    reason = info.get("Reason", "")
    code = info.get("ExitCode", "")
    if state == "NODE_FAIL":
        who = ", ".join(failed) if failed else info.get("NodeList", "a node")
        return f"Slurm job {job_id} ended NODE_FAIL: node {who} stopped responding during the run"
    if state == "PENDING" and reason in NEVER_REASONS:
        return (f"Slurm cannot run job {job_id} as asked (pending, reason {reason}: "
                f"{info.get('NumNodes', '?')} node(s), {info.get('NumTasks', '?')} task(s), "
                f"{info.get('NumCPUs', '?')} CPU(s)) and it was cancelled: ask for fewer ranks "
                f"per node, or see `sinfo -N -l` for what the nodes have")
    if state == "TIMEOUT":
        return f"Slurm job {job_id} reached its time limit ({info.get('TimeLimit', '?')}) and was ended (TIMEOUT)"
    text = f"Slurm job {job_id} ended {state}"
    if code and code != "0:0":
        text += f" (exit code {code}, as exit:signal)"
    if reason and reason != "None":
        text += f", reason {reason}"
    return text


def script_for_request(s, partition: str = "", gpus_per_node: int | None = None,
                       container: str = "", time_limit_s: float = 0) -> tuple[str, list[str]]:
    """The batch script of one bench request (lab.host.settings.BenchSettings) for a real
    cluster: (the script, notes). Nothing is submitted and nothing here is probed (the
    cluster's stack is not this machine's); `time_limit_s` is #SBATCH --time (0: the
    partition's own limit, not bench's per-run timeout). The request is checked as a configuration
    only, and --framework auto means DDP. The records go to --results-dir/<run id> on
    the cluster's shared storage; `invoke report` reads them there."""
    import dataclasses

    nps = s.np if isinstance(s.np, list) else [s.np]
    if len(nps) != 1:
        raise BenchError("a batch script runs one process count: give --np one number")
    np = nps[0]
    # auto: the strategy's framework, or for ddp, DDP (whether Horovod is installed on
    # that cluster is not known here; resolve_framework decides from an empty stack)
    framework = resolve_framework(s.framework, {}, s.strategy)[0]
    notes = ["--framework auto is DDP in a script for another cluster (whether Horovod is "
             "installed there is not known here)"] if s.framework == "auto" else []
    # Absolute folders: a container (pyxis) starts in its image's working folder, not
    # where the job was submitted.
    read = [BY_NAME["results_dir"]] + ([BY_NAME["data_dir"]] if s.data == "mnist" else [])
    here = [f"--{o.flag} {getattr(s, o.name)}" for o in read if not os.path.isabs(getattr(s, o.name))]
    if here:
        notes.append(f"{' and '.join(here)} {'are folders' if len(here) > 1 else 'is a folder'} "
                     f"under {os.getcwd()} here, which the nodes must see at the same path: give "
                     f"folders on the cluster's shared storage")
    results_dir, data_dir = os.path.abspath(s.results_dir), os.path.abspath(s.data_dir)
    s = dataclasses.replace(s, results_dir=results_dir, data_dir=data_dir)
    cfg = script_config(s, framework, np)
    run_id = cfg.run_id
    gpus = gpus_for(s, np, gpus_per_node)
    job = SlurmJob(framework, s.backend, np, s.nodes, cfg.to_args(), job_name=f"lab-{run_id}",
                   threads=s.threads,
                   time_limit_s=time_limit_s, output=f"lab-{run_id}-%j.out",
                   env=launch.job_env(s), partition=partition, gpus_per_node=gpus, container=container,
                   mounts=sorted({results_dir, data_dir}),
                   comment=f"dl-lab-kit (invoke sbatch): {s.model}, {framework} over {s.backend}, "
                           f"{np} rank(s) on {s.nodes} node(s), {s.device}.\n"
                           f"Submit with: sbatch job.sbatch (the job's output: lab-{run_id}-<job id>.out "
                           f"where you submit it); the record goes to "
                           f"{results_dir}/{run_id}/{results.RESULTS_FILE}\n"
                           f"(the folder must exist on shared storage); then: "
                           f"invoke report {results_dir}/{run_id}",
                   retries=s.max_restarts)
    check_max_restarts(s)
    if s.max_restarts and not s.checkpoint_every:
        notes.append(f"--max-restarts {s.max_restarts} without --checkpoint-every: a retried step "
                     f"starts again from step 0")
    try:
        return job_script(job), notes
    except SlurmError as e:
        raise BenchError(str(e)) from None
