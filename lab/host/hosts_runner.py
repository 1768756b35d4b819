"""The user's own servers as a runner: `bench --hosts h1:4,h2:4` (or `--hostfile FILE`,
mpirun's and horovodrun's "host slots=N" lines), launched from the machine bench runs on
over the user's own SSH setup (keys, ~/.ssh/config). Horovod: horovodrun -H (it starts
the ranks over SSH, or mpirun does with --backend mpi, and stops them all when one
fails). DDP: one torch.distributed.run per host over ssh, meeting at a static rendezvous
on the first host (so that rank 0, which writes the record, is there); when one host's
launcher fails, the others are ended, on their hosts.

Before any rank starts, every host must answer over SSH and report the same stack as
the others (lab.worker.capabilities, run there with the same Python): a host that does
not answer, or has another kit, Python, torch, Horovod, DeepSpeed or MPI version, is one
sentence naming it. Every host needs the same Python at the same path (as horovodrun
assumes) and the results folder at the same path; rank 0 (on the first host) writes the
record, and a failed rank's file lands on its own host unless the folder is shared."""
from __future__ import annotations

import json
import os
import shlex
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from lab.common import kit, proc
from lab.common.forwarded_env import forwarded
from lab.host import launch
from lab.host.launch import Host, HostsError
from lab.host.runners import JobResult, Runner, RunnerError

SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
# What must be alike on every host (lab.worker.capabilities' keys).
COMPARED = {"kit": "the kit", "python": "Python", "torch": "torch", "torchvision": "torchvision",
            "horovod.version": "Horovod", "deepspeed": "DeepSpeed", "mpi_version": "MPI"}
# Variables the ranks need on every host (horovodrun and mpirun pass the environment
# on; the DDP launch over ssh gives these).
FORWARDED = ("PYTHONPATH", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "OMPI_MCA_mpi_yield_when_idle",
             "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_DEBUG", "LAB_IMAGE_ID",
             "LAB_IMAGE_LABELS")


# ---------------------------------------------------------------- pure

def parse_hostfile(text: str, name: str = "the hostfile") -> list[Host]:
    """mpirun's / horovodrun's hostfile: "host slots=N" per line ("host" alone: 1 slot),
    '#' comments and blank lines ignored."""
    hosts = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = 1
        for p in parts[1:]:
            key, _, value = p.partition("=")
            if key in ("slots", "max_slots", "max-slots"):
                if key == "slots":
                    if not value.isdigit() or int(value) < 1:
                        raise HostsError(f"line {n} of {name}: slots must be a whole number of at least 1, "
                                         f"not {value!r} (write: node1 slots=4)")
                    slots = int(value)
            else:
                raise HostsError(f"line {n} of {name}: {p!r} is not understood (write: node1 slots=4)")
        if any(h.name == parts[0] for h in hosts):
            raise HostsError(f"line {n} of {name}: host {parts[0]!r} is listed twice")
        hosts.append(Host(parts[0], slots))
    if not hosts:
        raise HostsError(f"{name} names no host (write one per line: node1 slots=4)")
    return hosts


def check_slots(hosts: list[Host], nps: list[int]) -> None:
    """Every process count must fill the hosts' slots exactly (each slot one rank)."""
    total = sum(h.slots for h in hosts)
    for np in nps:
        if np != total:
            raise HostsError(f"the hosts offer {total} slot(s) ({launch.format_hosts(hosts)}) and --np is "
                             f"{np}: give --np {total}, or change the slots")


def _get(d: dict, dotted: str):
    for k in dotted.split("."):
        d = d.get(k) if isinstance(d, dict) else None
    return d


def stack_mismatches(stacks: dict[str, dict]) -> list[str]:
    """One sentence per version that differs between the hosts (the first host is the
    reference), naming the host and both versions."""
    (first, ref), *rest = stacks.items()
    out = []
    for host, stack in rest:
        for key, label in COMPARED.items():
            a, b = _get(ref, key), _get(stack, key)
            if a != b:
                out.append(f"host {host} has {label} {b or 'missing'} and {first} has {a or 'missing'}")
    return out


def gpu_shortfalls(hosts: list[Host], stacks: dict[str, dict]) -> list[str]:
    """One sentence per host that would run more ranks (its slots: each slot one rank,
    check_slots) than torch sees GPUs there. Hosts may differ (h1:8,h2:4 on an 8-GPU and
    a 4-GPU server): each is checked against its own count, not the first host's."""
    out = []
    for h in hosts:
        gpus = int((stacks.get(h.name) or {}).get("gpus") or 0)
        if h.slots > gpus:
            out.append(f"host {h.name} runs {h.slots} rank(s), each needing a GPU of its own, and "
                       f"torch sees {gpus} GPU(s) there: give it {gpus} slot(s) ({h.name}:{gpus})"
                       if gpus else f"torch sees no GPU on host {h.name}: leave it out of --hosts "
                       f"or run with --device cpu")
    return out


def remote(host: str, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    """ssh to `host` running argv with `env` set (one shell-quoted command)."""
    assigns = [f"{k}={shlex.quote(str(v))}" for k, v in (env or {}).items()]
    words = ["cd", "/tmp", "&&", "exec", *(["env", *assigns] if assigns else []),
             *(shlex.quote(a) for a in argv)]
    return [*SSH, host, " ".join(words)]


def rendezvous_port(key: str) -> int:
    """29500 plus a number from 0 to 499 taken from the run (its id and attempt): two
    runs that share a first host do not meet at each other's rendezvous."""
    import zlib
    return 29500 + zlib.crc32(key.encode()) % 500


def check_hosts(hosts: list[Host]) -> None:
    """The first host's name is the others' rendezvous address: it must not be a name
    that means "this machine" everywhere."""
    local = [h.name for h in hosts if h.name in ("localhost", "127.0.0.1", "::1")]
    if local and len(hosts) > 1:
        raise HostsError(f"{local[0]} means a different machine on each host: name the hosts as "
                         f"they reach each other (their host names or addresses)")


def ddp_commands(hosts: list[Host], worker_args: list[str], python: str,
                 env: dict[str, str], port: int = 29500) -> dict[str, list[str]]:
    """host -> the ssh command that starts its torch.distributed.run: a static
    rendezvous at the first host, so that rank 0 (which writes the record) is there."""
    rdzv = f"{hosts[0].name}:{port}"
    return {h.name: remote(h.name, launch.ddp_command(h.slots, worker_args, nnodes=len(hosts),
                                                      node_rank=i, rdzv_endpoint=rdzv, python=python,
                                                      static=True),
                           env)
            for i, h in enumerate(hosts)}


# ---------------------------------------------------------------- edge

class HostsRunner(Runner):
    """The ranks on the user's hosts, launched from here."""

    kind = "hosts"

    def __init__(self, hosts: list[Host], results_dir: str, data_dir: str | None,
                 python: str = sys.executable, echo=print):
        results_dir = os.path.abspath(results_dir)
        super().__init__(results_dir, os.path.abspath(data_dir) if data_dir else None)
        self.hosts, self.python, self.echo = hosts, python, echo
        self.nodes = len(hosts)
        self._procs: dict[str, proc.Process] = {}
        self._pattern = ""
        self._framework, self._worker_args = "", []
        self._port = 29500
        self.stacks: dict[str, dict] = {}       # each host's stack, once probed

    def describe(self) -> str:
        return f"running on {launch.format_hosts(self.hosts)} over SSH"

    def where_text(self) -> str:
        return f"on {self.hosts[0].name}"

    def _env(self, extra: dict) -> dict:
        env = {k: os.environ[k] for k in FORWARDED if k in os.environ}
        env.update(forwarded(os.environ))          # NCCL_*, UCX_*, OMPI_MCA_*, ... (one list)
        env.update(extra)
        return env

    def output_on(self, host: str, argv: list[str], timeout_s: float = 120) -> tuple[int | None, str]:
        res = proc.run(remote(host, argv, self._env({})), timeout=timeout_s)
        return (None if res.timed_out else res.returncode), res.stdout

    def output(self, argv, timeout_s=300):
        return self.output_on(self.hosts[0].name, argv, timeout_s)

    def probe_stack(self, timeout_s: float = 120) -> dict:
        """Every host's stack, all at once: each must answer and match the first."""
        def one(h: Host):
            try:
                return h.name, self.output_on(h.name, [self.python, "-m", "lab.worker.capabilities"],
                                              timeout_s)
            except proc.NotFound:
                raise RunnerError("ssh is not installed here: install the OpenSSH client") from None
        with ThreadPoolExecutor(min(16, len(self.hosts))) as pool:
            answers = list(pool.map(one, self.hosts))
        stacks = {}
        for host, (rc, out) in answers:
            lines = [line for line in out.strip().splitlines() if line.startswith("{")]
            if rc == 255 or rc is None:
                raise RunnerError(f"host {host} does not answer over SSH "
                                  f"({(out.strip().splitlines() or ['no answer'])[-1]}): check "
                                  f"`ssh {host} true` works without a password")
            if rc != 0 or not lines:
                raise RunnerError(f"host {host} cannot run {self.python} -m lab.worker.capabilities "
                                  f"({(out.strip().splitlines() or ['no output'])[-1]}): install the "
                                  f"kit at the same path on every host")
            stacks[host] = json.loads(lines[-1])
        wrong = stack_mismatches(stacks)
        if wrong:
            raise RunnerError(f"{wrong[0]}: install the same versions on every host"
                              + (f" ({len(wrong) - 1} more difference(s))" if len(wrong) > 1 else ""))
        self.stacks = stacks
        # The request's own GPU check assumes alike hosts (ceil(np/hosts) ranks on each,
        # against the stack's "gpus"): given the most any host has, it refuses only what
        # no spread could run; commands() checks each host's slots against its own GPUs.
        return dict(stacks[self.hosts[0].name],
                    gpus=max(int(s.get("gpus") or 0) for s in stacks.values()))

    def prepare(self, run_dir: str) -> None:
        """Ranks on other hosts run as the same user: nothing to hand over."""

    def commands(self, framework, backend, np, worker_args):
        check_slots(self.hosts, [np])
        check_hosts(self.hosts)
        self._framework, self._worker_args = framework, list(worker_args)

        def arg(name):
            return worker_args[worker_args.index(name) + 1] if name in worker_args else ""
        # Each host's own GPUs, once its stack is known (probe_stack).
        short = gpu_shortfalls(self.hosts, self.stacks) if arg("--device") == "cuda" and self.stacks else []
        if short:
            raise HostsError(short[0] + (f" ({len(short) - 1} more host(s) alike)" if len(short) > 1 else ""))
        run, attempt = arg("--run-id"), arg("--attempt")
        self._port = rendezvous_port(f"{run}/{attempt}")
        # matches this run's ranks and launchers (to_args puts --run-id before --attempt),
        # never pkill's own command line
        self._pattern = f"lab[.]worker[.]train.*{run}.*{attempt}"
        if framework == "horovod":
            return {self.hosts[0].name: launch.horovod_command(
                np, self.hosts, launch.framework_for_backend(framework, backend), worker_args,
                python=self.python, horovodrun=kit.horovodrun(self.python))}
        if framework == "ddp":      # built again in run(), with the job's environment
            return ddp_commands(self.hosts, worker_args, self.python, {}, self._port)
        raise HostsError("--hosts needs a distributed framework: --framework horovod or ddp")

    def run(self, commands, env, timeout_s, echo, name=""):
        env = self._env(env)
        if self._framework == "ddp":
            commands = ddp_commands(self.hosts, self._worker_args, self.python, env, self._port)
        many = len(commands) > 1
        tail: list[str] = []
        lock = threading.Lock()

        def echo_from(host):
            def out(line):
                with lock:
                    tail.append(f"[{host}] {line}" if many else line)
                    del tail[:-proc.TAIL_LINES]
                echo(f"[{host}] {line}" if many else line)
            return out
        self._procs = {h: proc.start(cmd, env=dict(os.environ, **env), echo=echo_from(h), keep_output=False)
                       for h, cmd in commands.items()}
        deadline = time.monotonic() + timeout_s if timeout_s > 0 else None
        why = "exited"
        try:
            while any(p.poll() is None for p in self._procs.values()):
                time.sleep(0.3)
                if any(p.poll() not in (None, 0) for p in self._procs.values()):
                    why = "a host's launcher failed"
                    break
                if deadline and time.monotonic() > deadline:
                    why = f"did not finish within {timeout_s:g} s and was stopped"
                    break
        finally:
            if any(p.poll() is None for p in self._procs.values()) or why != "exited":
                self.stop()
        codes = {h: p.wait(5).returncode for h, p in self._procs.items()}
        self._procs = {}
        if why.startswith("did not finish"):
            return JobResult(None, tail, why)
        rc = max((c for c in codes.values() if c is not None), key=abs, default=1)
        return JobResult(rc if why == "exited" or rc else 1, tail, why)

    def stop(self) -> None:
        """TERM, then KILL, to every rank of this job on every host, and the launchers here."""
        if self._pattern:
            for sig in ("TERM", "KILL"):
                with ThreadPoolExecutor(min(16, len(self.hosts))) as pool:
                    list(pool.map(lambda h: proc.run([*SSH, h.name, f"pkill -{sig} -f "
                                                      f"{shlex.quote(self._pattern)}"], timeout=30),
                                  self.hosts))
                if sig == "TERM":
                    time.sleep(2)
        for p in self._procs.values():
            p.stop()
