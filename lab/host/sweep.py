"""Sweeps: a plan's combinations (lab.host.plan) run one after another into one results
directory; what cannot run here skipped with the reason recorded. Also what `invoke
benchmark` runs, and `run_request`, what `invoke bench` calls with its plan."""
from __future__ import annotations

import dataclasses
import itertools
import os
import shutil

from lab.common import results
from lab.host.bench import Outcome, Progress, probe_stack, run_jobs
from lab.host.places.local import LocalRunner
from lab.host.plan import Plan, label
from lab.host.request import BenchError, BenchSettings, base_config, framework_of


def run_request(plan: Plan, echo=print) -> Outcome:
    """The plan's jobs: one combination's through bench, several as a sweep; the records
    of the run read back as one outcome."""
    if not plan.sweep and not plan.already:
        return run_jobs(plan, plan.jobs, echo)
    outcomes = run_sweep(plan, echo=echo)
    rfile = results.run_dir(plan.settings.results_dir, plan.settings.run_id) / results.RESULTS_FILE
    if not rfile.exists():
        raise BenchError("the sweep recorded nothing; see the reasons above")
    return Outcome(str(rfile.parent), results.read_records(rfile)[0],
                   sum(o.failed for o in outcomes), [])


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
    directory. A combination that cannot run here is skipped with the reason printed and
    recorded (once)."""
    for line in plan.already:
        echo(line)
    base = plan.settings
    rfile = results.run_dir(base.results_dir, base.run_id) / results.RESULTS_FILE
    refused = dict(plan.refused)
    progress = Progress(len(plan.jobs), echo)
    outcomes, skipped = [], set()
    stacks: dict = {}
    local = LocalRunner(base.results_dir, base.data_dir)
    groups = [list(g) for _, g in itertools.groupby(plan.jobs, key=lambda j: (j.repeat, j.combination))]
    for jobs in groups:
        i, s = jobs[0].combination, jobs[0].settings
        if i in skipped:
            continue
        reason = refused.get(i)
        if reason is None:
            try:
                stack = runner = None
                if s.nodes == 1 and s.where == "local" and not plan.hosts:
                    # Local processes: the same stack for every combination, probed once.
                    runner = local
                    if "local" not in stacks:
                        stacks["local"] = probe_stack(local)
                    stack = stacks["local"]
                outcomes.append(run_jobs(plan, jobs, echo, stack, runner, progress))
                continue
            except BenchError as e:
                reason = str(e)
        skipped.add(i)
        left = [j for j in plan.jobs if j.combination == i and j.repeat >= jobs[0].repeat]
        progress.total -= len(left)
        echo(f"-- skipped {label(s)}: {reason}")
        os.makedirs(rfile.parent, exist_ok=True)
        for n in dict.fromkeys(j.np for j in left):      # --resume: not those recorded ok
            framework = s.framework if s.framework != "auto" else (framework_of(s.strategy) or "ddp")
            cfg = dataclasses.replace(base_config(s, framework),
                                      run_id=base.run_id, expected_np=n, link=s.link)
            results.append_record(rfile, results.make_record(
                "skipped", run_id=base.run_id, config=cfg.as_record(), np=n, nodes=s.nodes,
                started_at=results.now_iso(), error={"reason": reason}))
    return outcomes
