"""Names shared by bench and the ranks for --checkpoint-every and --max-restarts
(standard library only): where a job's checkpoints live, what each relaunch is called,
and the file in which the ranks of a relaunch say where they resumed.

A job's checkpoints are <run folder>/checkpoints/<the job's first launch name>/step-N.pt:
the same folder for every relaunch of that job, another for every other job of the run.
Relaunch n (1, 2, ...) is named <first launch name>-restart<n> (its own failures/ and
heartbeats/ folders)."""
from __future__ import annotations

import json
import os

CHECKPOINTS = "checkpoints"
KEEP = 2                     # checkpoints kept per job: the newest and the one before it
# "1" where the nodes of a launch each decide whether they resume (a PyTorchJob's pods:
# lab.host.places.k8s.jobs.resuming): its ranks take the largest decision of them all
# (lab.worker.checkpoint.agree_restart), so none resumes alone.
AGREE_VAR = "LAB_AGREE_RESTART"


def attempt_of(first: str, restart: int) -> str:
    """The launch name of relaunch `restart` of the job first launched as `first`."""
    return first if restart == 0 else f"{first}-restart{restart}"


def of_launch(restart: int, env=None) -> int:
    """Which relaunch of its job this rank's launch is: bench's (--restart), else torchrun's
    own (--max-restarts: its elastic agent restarts every rank of the job and gives them
    TORCHELASTIC_RESTART_COUNT, torch/distributed/elastic/agent/server/
    local_elastic_agent.py, `restart_count = spec.max_restarts - self._remaining_restarts`),
    so that a rank restarted by torchrun resumes from the job's checkpoint as well."""
    env = os.environ if env is None else env
    count = str(env.get("TORCHELASTIC_RESTART_COUNT", ""))
    return restart or (int(count) if count.isdigit() else 0)


def first_attempt(attempt: str, restart: int) -> str:
    """The job's first launch name, from relaunch `restart`'s name."""
    suffix = f"-restart{restart}"
    return attempt[:-len(suffix)] if restart and attempt.endswith(suffix) else attempt


def folder(run_dir: str | os.PathLike, attempt: str, restart: int = 0) -> str:
    """The job's checkpoint folder (relaunch `restart`, launched as `attempt`)."""
    return os.path.join(str(run_dir), CHECKPOINTS, first_attempt(attempt, restart) or "manual")


def resumed_path(job_folder: str, restart: int) -> str:
    """Where rank 0 of relaunch `restart` writes the step it resumed from (JSON)."""
    return os.path.join(job_folder, f"resumed-{restart}.json")


def write_resumed(job_folder: str, restart: int, *, from_step: int, checkpoint: str | None,
                  saved_at: float | None, resumed_at: float) -> str:
    """Relaunch `restart`'s word on where it resumed, written whole or not at all."""
    path = resumed_path(job_folder, restart)
    os.makedirs(job_folder, exist_ok=True)
    tmp = os.path.join(job_folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    said = {"restart": restart, "from_step": from_step, "checkpoint": checkpoint,
            "saved_at": saved_at, "resumed_at": resumed_at}
    with open(tmp, "w") as f:
        json.dump(said, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
