"""Where a job's ranks run, behind one interface: local processes (`LocalRunner`), a
container of the lab image (`lab.host.places.image.ImageRunner`) or the nodes of the
simulated cluster (`lab.host.places.compose.runner.ClusterRunner`). Each runner prepares a run
folder, turns a launch into one command per host, runs those commands streaming their
output, stops what it started, probes the stack the ranks will see, and says which
nodes died. `lab.host.places.choose_runner` picks one the same way for bench and doctor
(the concrete runners import this module; it imports none of them)."""
from __future__ import annotations

import json
from dataclasses import dataclass

from lab.common import proc
from lab.common.config import RunConfig
from lab.host.errors import RunnerError  # noqa: F401 (the places raise it from here)
from lab.host.places import hold

WHERE = ("local", "image", "auto")


@dataclass(frozen=True)
class Launch:
    """One launch of a job, built once by bench from the run's configuration: what every
    runner's commands() turns into one command per host (and, where a runner must carry
    them inside the command, its environment and time limit)."""
    framework: str
    backend: str
    np: int
    worker_args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    timeout_s: float = 0
    run_id: str = ""
    attempt: str = ""
    device: str = "cpu"
    config: RunConfig | None = None      # the ranks' configuration (worker_args are its argv)

    @property
    def key(self) -> str:
        """"<run id>/<attempt>": names this launch (rendezvous, process patterns)."""
        return f"{self.run_id}/{self.attempt}"

    @property
    def environment(self) -> dict[str, str]:
        return dict(self.env)


@dataclass
class JobResult:
    returncode: int | None      # None: stopped at its time limit
    tail: list[str]             # the last lines it printed
    why: str                    # "exited", or how it was ended
    scheduler: dict | None = None   # a scheduler's word on the job (Slurm: id, final state)


# The features that span runs. Each asks the place through this interface, never by its
# name; a place that cannot offer one says why in one line (Runner.unsupported), and the
# user is told that line (tests/test_places.py covers every feature x place).
FEATURES = ("stall watch", "progress", "oversubscription", "ceiling placement",
            "failure naming", "resume", "forwarded variables")


class Runner:
    """The interface. `results_in`/`data_in` are the folders as the ranks see them."""

    kind = "runner"
    # How a rank's heartbeat reaches this machine (lab.common.heartbeat.CHANNELS): "folder"
    # (the run's folder, which the ranks write into), "stream" (the launcher's output),
    # "logs" (an API's logs, streamed by run()).
    heartbeat_channel = "folder"
    # Where the files the ranks write (rank 0's record, a failed rank's file) reach this
    # machine: "folder" (the run's folder), "logs" (run() appends what the ranks print).
    rank_files = "folder"
    machine_name = "this machine"   # what an oversubscription line names ("" for places of their own)
    in_container = False            # the ranks' stack is not this machine's Python (doctor checks it there)
    records_where_note = True       # a line saying why the ranks run here goes into the record
    falls_back_to_local = False     # `where: auto`: local processes may run what this place's stack refuses
    # A sweep makes one runner of this place (for_sweep, with the most nodes asked for)
    # and runs its combinations on fewer nodes on that runner's first nodes (on_nodes).
    sweep_shares = False
    # --np spread evenly over the nodes (lab.host.places.launch.ranks_per_node): a count that does
    # not divide is refused before any job; False: the place's own slots (--hosts)
    spreads_evenly = True
    unsupported: dict[str, str] = {}    # feature -> the one line that says why it does not work here
    # The options of reach "place" (lab.common.options) this place honours, each visible in
    # what it launches (its command, environment or record); any other a request asks for
    # is refused before anything runs, in one sentence naming it and `title`
    # (lab.host.places.refusal; tests/test_places.py walks every option x every place).
    honours: frozenset[str] = frozenset()
    # --max-restarts honoured by the place's own scheduler, which retries the failed job's
    # processes (Kubernetes' operators): bench launches it once (lab.host.run.bench.run_job)
    retries_in_place = False
    title = "this place"            # the place, as a refusal names it
    # What a run here holds while its ranks run (lab.host.places.hold): "this-machine" where
    # they share this machine's cores (local processes, the image, the simulated cluster's
    # containers, --hosts run from here); "" where they run on machines of their own
    holds = hold.MACHINE
    python = "python"
    tag = ""
    nodes = 1
    started: dict[str, list[str]] | None = None   # what run() last started, host -> argv

    def __init__(self, results_dir: str, data_dir: str | None):
        self.results_dir, self.data_dir = results_dir, data_dir
        self.results_in, self.data_in = results_dir, data_dir

    def describe(self) -> str:
        raise NotImplementedError

    def prepare(self, run_dir: str) -> None:
        """Make the run's folder writable for the ranks."""

    def hand_back(self, run_dir: str) -> None:
        """After the runs: what the ranks made in the run's folder belongs to the user who
        ran bench again (where the ranks ran as another user)."""

    def commands(self, job: Launch) -> dict[str, list[str]]:
        """Host -> the command that starts its part of the job: exactly what run() starts."""
        raise NotImplementedError

    def run(self, commands: dict[str, list[str]], env: dict, timeout_s: float, echo,
            name: str = "") -> JobResult:
        raise NotImplementedError

    @classmethod
    def cannot(cls, feature: str) -> str | None:
        """The one line saying why `feature` (one of FEATURES) does not work in this place;
        None where it works."""
        if feature not in FEATURES:
            raise ValueError(f"no feature {feature!r}: one of {', '.join(FEATURES)}")
        return cls.unsupported.get(feature)

    @classmethod
    def for_request(cls, s, config: dict, sweep: dict | None = None) -> tuple:
        """(the request as it runs in this place, the place's options: from invoke.yaml's
        section of it, `config`, or from the request), before any job: a feature asked for
        that does not work here, or a list of the sweep (`sweep`: lab.host.request.checks's lists)
        the place cannot cross, refused in its one line."""
        if s.ceiling and cls.cannot("ceiling placement"):
            raise RunnerError(cls.cannot("ceiling placement"))
        return s, None

    @classmethod
    def from_request(cls, s, options, echo=print) -> "Runner":
        """The runner of request `s` (bench's settings) in this place, with the options
        its for_request made."""
        raise NotImplementedError(f"{cls.kind}: the engine chooses it (choose_runner)")

    @classmethod
    def for_sweep(cls, nodes: int, s, echo=print) -> "Runner":
        """The one runner a sweep shares (sweep_shares), on `nodes` nodes for request `s`."""
        raise NotImplementedError(f"{cls.kind} is not shared by a sweep")

    def on_nodes(self, n: int) -> "Runner":
        """This runner on its first `n` nodes (sweep_shares)."""
        raise NotImplementedError(f"{self.kind} is not shared by a sweep")

    def ranks_started(self) -> bool:
        """Whether the last job's ranks have been started (a batch job: it is RUNNING)."""
        return self.started is not None

    def results_folder(self) -> str | None:
        """The one results folder this place's ranks can write to, None when any will do."""
        return None

    def srun_tasks_are_ranks(self, job: Launch) -> bool:
        """Whether the launcher's tasks are the ranks themselves (failure naming: a task's
        number is a rank's)."""
        return False

    def cancelled_job(self) -> dict | None:
        """A scheduler's job this runner cancelled when stopped, if any: the scheduler's
        `name` (the record's error holds the job under it), how it was cancelled (`cancel`),
        the job's id and script."""
        return None

    def module_commands(self, module: str, args: list[str], key: str) -> dict[str, list[str]]:
        """Host -> the command that runs `python -m module args` as one rank on each of
        this place's nodes under torch.distributed.run (doctor's collectives across
        them); `key` names the rendezvous."""
        raise RunnerError(f"doctor's collectives across nodes run on the simulated cluster, not on {self.kind}")

    @classmethod
    def check_link(cls, link: str) -> None:
        """A --link spec this place can shape, checked before anything runs: one
        sentence (RunnerError) otherwise."""
        if link:
            raise RunnerError(f"--link shapes the links between the simulated cluster's nodes "
                              f"(--nodes 2 or more, launcher direct or slurm), not on {cls.kind}: "
                              f"leave it out")

    @classmethod
    def link_reference(cls, link: str) -> dict | None:
        """The rate --link gives each node, as a bandwidth reference {"name", "gbs"}."""
        return None

    def shape_links(self, link: str, echo) -> None:
        """Shape the links between the place's nodes (--link)."""
        if link:
            raise RunnerError("--link shapes the links between the simulated cluster's nodes: add "
                              "--nodes 2 or more")

    def unshape_links(self) -> None:
        """Undo shape_links."""

    def own_cores(self, echo) -> dict[str, str] | None:
        """Give each of the place's nodes cores of its own for a run (host -> its cpuset),
        or None where its nodes are not the simulated cluster's (nothing to do)."""
        return None

    def share_cores(self) -> None:
        """Undo own_cores."""

    def placement(self, np: int) -> dict[str, int]:
        """Where `np` ranks run: host -> how many ("" is this machine, or the image on it)."""
        return {"": np}

    def machines(self, np: int, stack: dict) -> list[tuple[str, int, int]]:
        """(machine, ranks on it, its cores) for `np` ranks: what oversubscription is judged
        by. One machine here (the compose cluster's runner: per node, where its nodes have
        cores of their own)."""
        return [(self.machine_name, np, int(stack.get("cores") or 1))]

    def output_on(self, host: str, argv: list[str], timeout_s: float = 300) -> tuple[int | None, str]:
        """`output` on one host of placement() (runners of one place have only "")."""
        return self.output(argv, timeout_s)

    def output(self, argv: list[str], timeout_s: float = 300) -> tuple[int | None, str]:
        """A short command (a probe) where the ranks run: (exit code, output)."""
        raise NotImplementedError

    def stop(self) -> None:
        """End whatever this runner started and may still be running."""

    def dead(self) -> dict[str, str]:
        """Hosts that stopped during the last job, with their state."""
        return {}

    def probe_stack(self, timeout_s: float = 120) -> dict:
        """What the ranks' Python can run (lab.worker.capabilities), or RunnerError."""
        try:
            rc, out = self.output([self.python, "-m", "lab.worker.capabilities"], timeout_s)
        except RunnerError as e:
            raise RunnerError(f"{e}; run with --local to use local processes") from None
        except proc.NotFound:
            raise RunnerError(f"{self.python} cannot be run: install the kit with "
                              f"docker/setup-venv.sh") from None
        if rc is None:
            raise RunnerError(f"importing torch {self.where_text()} took over {timeout_s:g} s: "
                              f"check the installation with `invoke doctor`")
        for line in reversed(out.strip().splitlines()):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    break
        last = (out.strip().splitlines() or ["no output"])[-1]
        raise RunnerError(f"could not inspect the Python {self.where_text()}: {last}")

    def where_text(self) -> str:
        return f"at {self.python}"
