"""Sweeps: a plan's combinations (lab.host.request.plan) run one after another into one results
directory; what cannot run here skipped with the reason recorded. Also what `invoke
benchmark` runs, and `run_request`, what `invoke bench` calls with its plan."""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import shutil

from lab.common import display, results
from lab.host.errors import BenchError, RunnerError
from lab.host.places import hold, place, place_of, runner_for
from lab.host.request.plan import Plan
from lab.host.run import repeat_auto
from lab.host.run.bench import Outcome, probe_stack, run_jobs
from lab.host.run.records import skip
from lab.host.run.startup import CLOCK
from lab.host.settings import BenchSettings


def run_request(plan: Plan, echo=print) -> Outcome:
    """The plan's jobs: one combination's through bench, several as a sweep; the records
    of the run read back as one outcome."""
    if not plan.sweep and not plan.already and not plan.settings.repeat_max:
        return run_jobs(plan, plan.jobs, echo)
    s = plan.settings
    with request_hold(plan, echo) as waited:    # the whole sweep, not each combination
        CLOCK.skip(waited or 0.0)
        outcomes = run_sweep(plan, echo=echo)
        if s.repeat_max:
            outcomes += repeat_until_apart(plan, echo)
    rfile = results.run_dir(plan.settings.results_dir, plan.settings.run_id) / results.RESULTS_FILE
    if not rfile.exists():
        raise BenchError("the sweep recorded nothing; see the reasons above")
    return Outcome(str(rfile.parent), results.read_records(rfile)[0],
                   sum(o.failed for o in outcomes), [])


def request_hold(plan: Plan, echo=print):
    """A sweep holds this machine from its first run to its last (lab.host.places.hold),
    where any of its places' ranks share it (`where: auto`: local processes or the image,
    both here): another bench waits for the whole sweep, and its runs' own holds are
    this one held again."""
    names = {place_of(c) or "local" for c in plan.combinations}
    if not any(place(n).holds for n in names):
        return contextlib.nullcontext()
    s = plan.settings
    return hold.hold(hold.MACHINE, s.run_id, place=place(place_of(s) or "local").kind,
                     wait=not s.no_wait, echo=echo)


def repeat_until_apart(plan: Plan, echo=print) -> list[Outcome]:
    """--repeat auto: further rounds after the plan's own, while lab.host.run.repeat_auto
    names configurations not yet told apart. A round in which no run finishes ends it
    (its records say why)."""
    rfile = results.run_dir(plan.settings.results_dir, plan.settings.run_id) / results.RESULTS_FILE
    outcomes = []
    while True:
        records = results.read_records(rfile)[0] if rfile.exists() else []
        jobs, line = repeat_auto.round_jobs(plan, records)
        echo(line)
        if not jobs:
            return outcomes
        before = repeat_auto.finished_runs(plan, records)
        outcomes += run_sweep(dataclasses.replace(plan, jobs=tuple(jobs), already=()), echo=echo)
        after = results.read_records(rfile)[0] if rfile.exists() else []
        if repeat_auto.finished_runs(plan, after) == before:
            echo("--repeat auto: stopped: no run of the last round finished (their records say why)")
            return outcomes


def benchmark_plans(stack: dict, results_dir: str = "results") -> tuple[list[BenchSettings], list[str]]:
    """What `invoke benchmark` runs: MNIST and ResNet-50 at np 1 and 2 over each framework
    and back end this machine has, each beside its compute ceiling."""
    mnist = dict(np=[1, 2], model="mnist", data="synthetic", batch_size=64, max_steps=300,
                 warmup_steps=20, ceiling=True, results_dir=results_dir, timeout_s=3600)
    # ResNet-50 at 224x224 takes seconds a step on one CPU thread: a few steps suffice.
    resnet = dict(np=[1, 2], model="resnet50", data="synthetic", batch_size=8, max_steps=4,
                  warmup_steps=1, ceiling=True, results_dir=results_dir, timeout_s=3600)
    combos = [("ddp", "gloo")]
    notes = []
    hvd = stack.get("horovod") or {}
    for backend in ("gloo", "mpi"):
        if hvd.get(backend) and (backend != "mpi" or shutil.which("mpirun")):
            combos.append(("horovod", backend))
        else:
            notes.append(f"skipped Horovod over {backend}: not available here")
    plans = [BenchSettings(framework=f, backend=b, **mnist) for f, b in combos]
    plans.append(BenchSettings(framework="ddp", backend="gloo", **resnet))
    return plans, notes


def run_sweep(plan: Plan, echo=print) -> list[Outcome]:
    """The plan's jobs, a combination's jobs of one repeat at a time, into one results
    directory. A run that cannot run here is skipped with the reason printed and recorded
    (once): a whole combination (its runner refuses it), or one process count of it (the
    plan's refusals: np 1 over 2 nodes, while np 2 over 2 nodes runs)."""
    for line in plan.already:
        echo(line)
    refused = dict(plan.refused)
    progress = display.Progress(len(plan.jobs), echo)
    outcomes, skipped = [], set()
    places = Places(plan, echo)
    groups = [list(g) for _, g in itertools.groupby(plan.jobs, key=lambda j: (j.repeat, j.combination))]
    for jobs in groups:
        i, s = jobs[0].combination, jobs[0].settings
        todo = [j for j in jobs if (i, j.np) not in skipped]
        by_reason: dict[str, set] = {}
        for j in todo:
            if (i, j.np) in refused:
                by_reason.setdefault(refused[(i, j.np)], set()).add(j.np)
        for reason, nps in by_reason.items():
            skip(plan, [j for j in plan.jobs if j.combination == i and j.np in nps
                        and j.repeat >= jobs[0].repeat], reason, skipped, progress, echo)
        todo = [j for j in todo if (i, j.np) not in skipped]
        if not todo:
            continue
        try:
            runner, stack = places.runner(s)
            outcomes.append(run_jobs(plan, todo, echo, stack, runner, progress, skipped))
        except BenchError as e:
            nps = {j.np for j in todo}
            skip(plan, [j for j in plan.jobs if j.combination == i and j.np in nps
                        and j.repeat >= jobs[0].repeat], str(e), skipped, progress, echo)
    return outcomes


class Places:
    """Where a sweep's combinations run, each runner made once per sweep with its stack
    probed once (the first launch's start-up phases "runner" and "probe" are marked
    here, where they happen): local processes; a place that a sweep shares (Runner.sweep_shares: the
    compose cluster) when the sweep has combinations on it: made once with the most
    nodes asked for, its combinations on fewer nodes run on its first nodes, and so do
    the sweep's 1-node combinations that `where: auto` would run in the image (the same
    image and network as the rest, not a container of their own). Any other place (the
    image, --hosts, Slurm, Kubernetes) is bench's choice, per combination (None:
    lab.host.places.runner_for, in bench)."""

    def __init__(self, plan: Plan, echo=print):
        self.plan, self.echo = plan, echo
        shared = [(c.nodes, place_of(c)) for c in plan.combinations
                  if place_of(c) and place(place_of(c)).sweep_shares]
        self.shared_nodes, self.shared = max(shared) if shared else (0, None)
        self.made: dict = {}        # place (and nodes) -> (runner, stack)

    def on_shared(self, s) -> bool:
        if not self.shared:
            return False
        name = place_of(s)
        # 1-node combinations the engine places (None) or that ask for the image auto
        # picks (a place that falls back to local processes) without naming a tag.
        return name == self.shared or (s.nodes == 1 and not s.image
                                       and (name is None or place(name).falls_back_to_local))

    def runner(self, s) -> tuple:
        """(runner, stack) for a combination, or (None, None) for bench to choose."""
        if place_of(s) == "local":
            key = "local"
            if key not in self.made:
                local, _ = runner_for(s)
                CLOCK.mark("runner")
                self.made[key] = (local, probe_stack(local))
                CLOCK.mark("probe")
            return self.made[key]
        if not self.on_shared(s):
            return None, None
        if self.shared not in self.made:
            try:
                whole = place(self.shared).for_sweep(self.shared_nodes, s, echo=self.echo)
            except RunnerError as e:
                raise BenchError(str(e)) from None
            CLOCK.mark("runner")
            self.made[self.shared] = (whole, probe_stack(whole))
            CLOCK.mark("probe")
        whole, stack = self.made[self.shared]
        if (self.shared, s.nodes) not in self.made:
            runner = whole.on_nodes(s.nodes)
            self.echo(runner.describe())
            self.made[(self.shared, s.nodes)] = (runner, stack)
        return self.made[(self.shared, s.nodes)]
