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
record, and a failed rank's file lands on its own host unless the folder is shared. The
first host must be this machine (check_first_host), since bench reads the record here."""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from lab.common import kit, proc
from lab.common.forwarded_env import forwarded
from lab.host.places import jobs, launch
from lab.host.places.base import JobResult, Runner, RunnerError
from lab.host.places.launch import Host, HostsError, rendezvous_port  # noqa: F401 (tests import it here)
from lab.host.places.this_machine import is_this_machine

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


def host_list(s) -> list[Host]:
    """--hosts or --hostfile (of request `s`) as a host list (lab.host.places.launch.Host)."""
    if s.hosts:
        return launch.parse_hosts(s.hosts)
    try:
        with open(s.hostfile) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not text"
        raise HostsError(f"--hostfile {s.hostfile} cannot be read ({why}): give a "
                         f"file of lines such as `node1 slots=4`") from None
    return parse_hostfile(text, s.hostfile)


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


def check_hosts(hosts: list[Host]) -> None:
    """The first host's name is the others' rendezvous address: it must not be a name
    that means "this machine" everywhere."""
    local = [h.name for h in hosts if h.name in ("localhost", "127.0.0.1", "::1")]
    if local and len(hosts) > 1:
        raise HostsError(f"{local[0]} means a different machine on each host: name the hosts as "
                         f"they reach each other (their host names or addresses)")


def check_first_host(hosts: list[Host]) -> None:
    """Rank 0 runs on the first host and writes the record into its results folder, which
    bench reads here: the first host must be this machine (a shared results folder is not
    checked for, so it is no exception)."""
    first = hosts[0].name
    if not is_this_machine(first):
        raise HostsError(f"rank 0 runs on the first host, {first}, and writes the record there, "
                         f"and this machine is not {first}: run bench on {first}, or list this "
                         f"machine first")


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
    title = "your servers over SSH (--hosts)"
    # Their own Python, never an image; the folders at the same paths on every server.
    honours = frozenset({"hosts", "hostfile", "results_dir", "data_dir"})
    # The ranks' results folder is each server's own unless the user shares it: their
    # heartbeats come back over the launchers' output (lab.common.heartbeat).
    heartbeat_channel = "stream"
    spreads_evenly = False          # each server's slots (check_slots)

    def __init__(self, hosts: list[Host], results_dir: str, data_dir: str | None,
                 python: str = sys.executable, echo=print):
        results_dir = os.path.abspath(results_dir)
        super().__init__(results_dir, os.path.abspath(data_dir) if data_dir else None)
        self.hosts, self.python, self.echo = hosts, python, echo
        self.nodes = len(hosts)
        self._job: jobs.Job | None = None
        self.cores: dict[str, int | None] = {}
        self._pattern = ""
        self._port = 29500
        self.stacks: dict[str, dict] = {}       # each host's stack, once probed

    @classmethod
    def for_request(cls, s, config: dict, sweep: dict | None = None) -> tuple:
        """--hosts or --hostfile parsed once (the request's servers are this place's
        options), the slots checked against --np and the names (check_hosts: not this
        machine's own names; check_first_host: the first is this machine); the request's
        nodes are its servers. --nodes, --link, --launcher: lab.host.places.refusal."""
        s, _ = super().for_request(s, config, sweep)
        if s.hosts and s.hostfile:
            raise RunnerError("give the hosts once: --hosts or --hostfile")
        try:
            hosts = host_list(s)
            check_slots(hosts, list(s.np))
            check_hosts(hosts)
            check_first_host(hosts)
        except HostsError as e:
            raise RunnerError(str(e)) from None
        return dataclasses.replace(s, nodes=len(hosts)), tuple(hosts)

    @classmethod
    def from_request(cls, s, options, echo=print) -> "HostsRunner":
        return cls(list(options), s.results_dir, s.data_dir, echo=echo)

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

    def machines(self, np: int, stack: dict) -> list[tuple[str, int, int]]:
        """Each server, its slots, and the cores it reported (lab.worker.capabilities)."""
        return [(h.name, h.slots, int(self.cores.get(h.name) or 1)) for h in self.hosts]

    def placement(self, np: int) -> dict[str, int]:
        check_slots(self.hosts, [np])     # --np fills the slots exactly
        return {h.name: h.slots for h in self.hosts}

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
        self.cores = {h: st.get("cores") for h, st in stacks.items()}
        # The request's own GPU check assumes alike hosts (ceil(np/hosts) ranks on each,
        # against the stack's "gpus"): given the most any host has, it refuses only what
        # no spread could run; commands() checks each host's slots against its own GPUs.
        return dict(stacks[self.hosts[0].name],
                    gpus=max(int(s.get("gpus") or 0) for s in stacks.values()))

    def prepare(self, run_dir: str) -> None:
        """Ranks on other hosts run as the same user: nothing to hand over."""

    def commands(self, job):
        """What run() starts, host -> argv: horovodrun on the first host, or one ssh per
        host carrying the job's environment into torch.distributed.run."""
        check_slots(self.hosts, [job.np])
        check_hosts(self.hosts)
        # Each host's own GPUs, once its stack is known (probe_stack).
        short = gpu_shortfalls(self.hosts, self.stacks) if job.device == "cuda" and self.stacks else []
        if short:
            raise HostsError(short[0] + (f" ({len(short) - 1} more host(s) alike)" if len(short) > 1 else ""))
        self._port = rendezvous_port(job.key)
        # matches this run's ranks and launchers (to_args puts --run-id before --attempt),
        # never pkill's own command line
        self._pattern = f"lab[.]worker[.]train.*{job.run_id}.*{job.attempt}"
        args = list(job.worker_args)
        if job.framework == "horovod":
            return {self.hosts[0].name: launch.horovod_command(
                job.np, self.hosts, launch.framework_for_backend(job.framework, job.backend), args,
                python=self.python, horovodrun=kit.horovodrun(self.python))}
        if job.framework == "ddp":
            return ddp_commands(self.hosts, args, self.python, self._env(job.environment), self._port)
        raise HostsError("--hosts needs a distributed framework: --framework horovod or ddp")

    def run(self, commands, env, timeout_s, echo, name=""):
        """The commands as given (commands() built them), in the one job loop."""
        env = dict(os.environ, **self._env(env))
        self._job = jobs.Job(list(commands), echo)
        self.started = {}

        def start(host, out):
            part = jobs.ProcessPart(host, proc.start(commands[host], env=env, echo=out, keep_output=False))
            self.started[host] = list(part.process.argv)
            return part
        o = self._job.run(start, timeout_s, self.stop)
        self._job = None
        return JobResult(o.returncode, o.tail, o.why)

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
        job = self._job          # the stall watch may call this while run() ends
        for part in (list(job.parts.values()) if job else []):
            part.process.stop()
