"""`python -m lab.host.launchers.local --nproc-per-node N -m MODULE ARGS...`: the ranks of
a DDP job on this one machine, started as `torch.distributed.run --standalone` starts
them, without importing torch (torchrun's own `import torch` was a whole second
import's worth of every local DDP run's start-up). Standard library only.

What it does is what the kit used of torchrun on one node:
- each rank gets torch.distributed's variables (RANK, LOCAL_RANK, WORLD_SIZE,
  LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, ..., MASTER_ADDR=127.0.0.1 and a free
  MASTER_PORT); rank 0's process hosts the rendezvous store (env://, torch's default)
  where torchrun's agent hosted it;
- the first rank to end abnormally ends the job: the others get SIGTERM, then SIGKILL
  after GRACE_S, and the launcher exits 1, after printing torchrun's "Failures:" and
  "Root Cause (first observed failure):" blocks (lab.host.watch.launcher_output reads them, so a rank
  killed by a signal is named as under torchrun);
- SIGTERM or SIGINT to the launcher is passed on to the ranks.
Multi-node DDP (the cluster, your servers, Slurm, Kubernetes) keeps torch.distributed.run."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

GRACE_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int, run_id: str, base: dict) -> dict:
    return {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
            "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world), "ROLE_NAME": "default", "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0"}


def failure_block(module: str, root: tuple[int, int, int], others: list[tuple[int, int, int]]) -> str:
    """torchrun's summary of a failed job (torch/distributed/elastic/multiprocessing/
    errors): the other failures, then the root cause; (rank, exit code, pid) each, a
    negative exit code being the signal."""
    host = socket.gethostname()
    stamp = time.strftime("%Y-%m-%d_%H:%M:%S")

    def entry(i, failure):
        rank, code, pid = failure
        sig = ""
        if code < 0:
            try:
                sig = f"  ({signal.Signals(-code).name})"
            except ValueError:
                pass
        return [f"[{i}]:", f"  time      : {stamp}", f"  host      : {host}",
                f"  rank      : {rank} (local_rank: {rank})", f"  exitcode  : {code} (pid: {pid}){sig}",
                "  error_file: <N/A>",
                f"  traceback : {'Signal %d received by PID %d' % (-code, pid) if code < 0 else '-'}"]
    lines = ["=" * 60, f"{module} FAILED", "-" * 60, "Failures:"]
    if others:
        for i, f in enumerate(others, 1):
            lines += entry(i, f)
    else:
        lines.append("  <NO_OTHER_FAILURES>")
    lines += ["-" * 60, "Root Cause (first observed failure):", *entry(0, root), "=" * 60]
    return "\n".join(lines)


def run(nproc: int, command: list[str], label: str) -> int:
    port = free_port()
    run_id = f"local-{os.getpid()}"
    procs = {}
    for rank in range(nproc):
        p = subprocess.Popen(command, env=rank_env(rank, nproc, port, run_id, dict(os.environ)))
        procs[p.pid] = (rank, p)

    def forward(signum, frame):
        for _, p in procs.values():
            if p.poll() is None:
                p.send_signal(signum)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)

    failures: list[tuple[int, int, int]] = []
    running = dict(procs)
    deadline = None
    while running:
        if deadline is not None and time.monotonic() > deadline:
            for _, p in running.values():
                p.kill()
            deadline = float("inf")
        try:
            pid, status = os.waitpid(-1, os.WNOHANG if deadline is not None else 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == 0:
            time.sleep(0.05)
            continue
        if pid not in running:
            continue
        rank, p = running.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        p.returncode = code
        if code != 0:
            failures.append((rank, code, pid))
            if deadline is None:           # the first to fail ends the job
                for _, q in running.values():
                    q.terminate()
                deadline = time.monotonic() + GRACE_S
    if not failures:
        return 0
    root, others = failures[0], failures[1:]
    print(failure_block(label, root, others), file=sys.stderr, flush=True)
    return 1


def main(argv=None) -> int:
    """--nproc-per-node N (or --nproc-per-node=N), then -m MODULE ARGS... or a command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m lab.host.launchers.local --nproc-per-node N (-m MODULE | COMMAND) ARGS..."
    nproc = None
    if argv and argv[0].startswith("--nproc-per-node="):
        nproc, argv = argv[0].split("=", 1)[1], argv[1:]
    elif len(argv) >= 2 and argv[0] == "--nproc-per-node":
        nproc, argv = argv[1], argv[2:]
    if nproc is None or not nproc.isdigit() or int(nproc) < 1 or not argv:
        print(usage, file=sys.stderr)
        return 2
    if argv[0] == "-m" and len(argv) >= 2:
        command, label = [sys.executable, "-m", *argv[1:]], argv[1]
    else:
        command, label = argv, argv[0]
    return run(int(nproc), command, label)


if __name__ == "__main__":
    sys.exit(main())
