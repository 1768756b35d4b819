"""The plan of one request: the task's flags over invoke.yaml's defaults, parsed and
checked once, on the host, into an immutable list of jobs (a combination's settings,
one process count, one repeat), in the order they run. `invoke bench` (lab.host.run.sweep,
lab.host.run.bench), `invoke sbatch` and `invoke k8s` read it; nothing after it parses a
flag again. What needs the ranks' stack (--framework auto, whether a back end is built)
is decided where the stack is probed (lab.host.request.checks.check_request)."""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from lab.common import options, results, stats
from lab.common.config import FRAMEWORKS
from lab.host.errors import BenchError, RunnerError
from lab.host.places import for_request, place, place_of
from lab.host.places.launch import HostsError, ranks_per_node
from lab.host.request.checks import SWEEP_FIELDS, check_settings, settings_from_flags
from lab.host.settings import BenchSettings, attempt_name


@dataclass(frozen=True)
class Job:
    """One launch: `np` ranks of one combination (its settings), in repeat `repeat`."""

    settings: BenchSettings
    combination: int        # the combination's index in the sweep's cross product
    np: int
    repeat: int

    def attempt(self, framework: str) -> str:
        """The launch's name (its failures/, heartbeats/ and slurm/ folders)."""
        return attempt_name(self.settings, framework, self.np, self.settings.np.index(self.np),
                            self.repeat)


@dataclass(frozen=True)
class Plan:
    combinations: tuple[BenchSettings, ...]
    jobs: tuple[Job, ...]                   # what runs, in order
    already: tuple[str, ...] = ()           # --resume: combinations left out, as said
    # a sweep's runs that cannot run, and why: (combination, np) -> reason
    refused: tuple[tuple[tuple[int, int], str], ...] = ()
    # what the request's place made of it (Runner.for_request): --hosts' servers parsed
    # once, --launcher k8s's options (lab.host.places.k8s.runner.Settings); None: nothing
    place_options: object = None
    resume: bool = False                    # --resume: a run recorded ok meanwhile is not run again

    @property
    def settings(self) -> BenchSettings:
        """The request's own settings: its first combination's."""
        return self.combinations[0]

    @property
    def sweep(self) -> bool:
        return len(self.combinations) > 1

    def single(self, what: str) -> BenchSettings:
        """The one job a script for another cluster holds (invoke sbatch, invoke k8s)."""
        if self.sweep:
            varied = [f"--{options.BY_NAME[k].flag}" for k in SWEEP_FIELDS
                      if len({getattr(c, k) for c in self.combinations}) > 1]
            raise BenchError(f"{what} runs one combination: give {' and '.join(varied)} one value")
        if len(self.settings.np) != 1:
            raise BenchError(f"{what} runs one process count: give --np one number")
        if self.settings.repeat_max:
            raise BenchError(f"{what} runs one job: --repeat auto is `invoke bench`'s, give --repeat a number")
        return self.settings


def make_plan(flags: dict, defaults: dict, resume: bool = False, sections=None,
              echo=None) -> Plan:
    """The task's flags (None where not given) over invoke.yaml's `bench` section; the
    request's place reads its own section of `sections` (invoke's Config: --launcher k8s
    its `k8s:` options, lab.host.places.k8s.runner.for_bench)."""
    settings, lists = settings_from_flags(flags, defaults)
    try:
        placed, options = for_request(settings, sections, echo, lists)
    except RunnerError as e:
        raise BenchError(str(e)) from None
    if placed.nodes != settings.nodes:      # the place's own count (--hosts: its servers)
        lists = {**lists, "nodes": [placed.nodes]}
    return dataclasses.replace(plan_of(placed, lists, resume), place_options=options)


def plan_of(s: BenchSettings, lists: dict | None = None, resume: bool = False) -> Plan:
    """Every check that needs nothing but the request, then the jobs: the cross product of
    the lists (each combination with all of --np), --repeat times, interleaved (every
    combination once, then every one again), less what --resume finds recorded."""
    check_settings(s)
    if resume and not s.run_id:
        raise BenchError("--resume continues a sweep: give its --run-id (the results folder's name)")
    s = dataclasses.replace(s, run_id=s.run_id or results.new_run_id())
    combos = tuple(combinations(s, lists or {}))
    if s.link and len((lists or {}).get("nodes", [])) > 1:
        # One node has no link to shape: in a sweep over --nodes its runs are the
        # cluster's 1-node baseline (speedup and prediction of the shaped runs). The
        # spec is checked first, as the request's (it holds for every combination).
        check_link(dataclasses.replace(s, nodes=max(lists["nodes"])))
        combos = tuple(dataclasses.replace(c, link="") if c.nodes == 1 else c for c in combos)
    refused = {}
    for i, c in enumerate(combos):
        try:
            check_link(c)
            uneven = uneven_counts(c)
            if uneven and len(combos) == 1:
                raise BenchError(next(iter(uneven.values())))
            refused.update({(i, np): why for np, why in uneven.items()})
        except BenchError as e:
            if len(combos) == 1:
                raise
            refused.update({(i, np): str(e) for np in c.np})
    have = finished(results.run_dir(s.results_dir, s.run_id) / results.RESULTS_FILE) if resume else set()
    jobs, already = [], []
    for rep, (i, c) in stats.interleaved(list(enumerate(combos)), s.repeat):
        todo = [Job(c, i, np, rep) for np in c.np if not recorded(have, c, np, rep)]
        if not todo:
            ran = recorded(have, c, c.np[0], rep)       # auto: the framework its records hold
            already.append(f"-- {label(dataclasses.replace(c, framework=ran))}"
                           + (f", repeat {rep + 1}" if s.repeat > 1 else "")
                           + ": already recorded, not run again (--resume)")
        jobs += todo
    return Plan(combos, tuple(jobs), tuple(already), tuple(sorted(refused.items())), resume=resume)


def combinations(base: BenchSettings, lists: dict) -> list[BenchSettings]:
    """The cross product of the lists (strategy, framework, back end, compression, precision, nodes),
    each with all of base.np."""
    keys = [k for k in SWEEP_FIELDS if k in lists]
    return [dataclasses.replace(base, **dict(zip(keys, values)))
            for values in itertools.product(*(lists[k] for k in keys))]


def label(s: BenchSettings) -> str:
    how = f"strategy {s.strategy}, " if s.strategy != "ddp" else ""
    arithmetic = f", precision {s.precision}" if s.precision != options.BY_NAME["precision"].value else ""
    compiled = ", compiled" if s.compile else ""
    return (f"{how}{s.framework} over {s.backend}, compression {s.compression}{arithmetic}{compiled}, "
            f"{s.nodes} node(s)")


def recorded(have: set, s: BenchSettings, np: int, repeat: int) -> str | None:
    """The framework of this run's ok record, where --resume finds one (None: not
    recorded). A record holds the framework that ran; `--framework auto` is resolved
    against the ranks' stack only when it runs (check_request), so an auto combination
    counts as recorded by a record of any framework with its other fields (one stack, one
    run folder: the one auto chose)."""
    frameworks = FRAMEWORKS if s.framework == "auto" else (s.framework,)
    return next((f for f in frameworks
                 if done_key(dataclasses.replace(s, framework=f), np, repeat) in have), None)


def done_key(s: BenchSettings, np: int, repeat: int) -> tuple:
    """A planned run's key (lab.common.options.run_key): its settings' key options."""
    return options.run_key(dataclasses.asdict(s), s.nodes, np, repeat)


def record_key(r: dict) -> tuple:
    """A record's run as done_key names it: its configuration's key options, the nodes and
    process count that ran, its repeat index."""
    c = r["config"]
    return options.run_key(c, r["world"]["nodes"], r["world"]["np"], c.get("repeat", 0))


def run_keys(plan: Plan) -> dict[tuple, tuple[int, int]]:
    """A run's key without its repeat -> (combination, np), for every framework an auto
    combination may have resolved to."""
    out = {}
    for i, c in enumerate(plan.combinations):
        for f in FRAMEWORKS if c.framework == "auto" else (c.framework,):
            for np in c.np:
                out[done_key(dataclasses.replace(c, framework=f), np, 0)[:-1]] = (i, np)
    return out


def finished(rfile) -> set:
    """Runs that already have an ok record in a results file (for --resume): each
    combination, process count and repeat index."""
    return {record_key(r) for r in results.read_records(rfile)[0] if r.get("status") == "ok"}


def uneven_counts(c: BenchSettings) -> dict[int, str]:
    """The process counts of a combination that do not spread evenly over its nodes, each
    with its reason, where its place spreads them evenly (Runner.spreads_evenly): a sweep
    skips those runs alone (np 1 on 2 nodes), and runs the rest (np 2 on 2 nodes)."""
    name = place_of(c)
    if c.nodes < 2 or (name and not place(name).spreads_evenly):
        return {}
    out = {}
    for np in c.np:
        try:
            ranks_per_node(np, c.nodes)     # the even-spread rule
        except HostsError as e:
            out[np] = str(e)
    return out


def check_link(s: BenchSettings) -> None:
    if s.link:
        if s.nodes < 2:
            raise BenchError("--link shapes the links between the cluster's nodes: add --nodes 2 or more")
        try:
            place(place_of(s) or "local").check_link(s.link)
        except RunnerError as e:
            raise BenchError(str(e)) from None


