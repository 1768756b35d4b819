"""Sweeps: the cross product of a request's lists (framework, back end, compression,
nodes), each with all its process counts, into one results directory; what cannot run
here skipped with the reason recorded; --resume runs only what has no ok record.
Also the plan of `invoke benchmark`, and `run_request`, what `invoke bench` calls."""
from __future__ import annotations

import dataclasses
import itertools
import os
import shutil

from lab.common import results, stats
from lab.host.bench import Outcome, Progress, probe_stack, run
from lab.host.request import (
    SWEEP_FIELDS,
    BenchError,
    BenchSettings,
    base_config,
    check_settings,
    framework_of,
    is_sweep,
)
from lab.host.runners import LocalRunner


def run_request(s: BenchSettings, lists: dict, resume: bool = False, echo=print) -> Outcome:
    """One run, or a sweep over the lists; the sweep's records read back as one outcome."""
    check_settings(s)
    if not is_sweep(lists) and not resume:
        return run(s, echo=echo)
    if not s.run_id and not resume:   # fixed here, so the table can be read back
        s = dataclasses.replace(s, run_id=results.new_run_id())
    outcomes = run_sweep(s, lists, resume=resume, echo=echo)
    rfile = results.run_dir(s.results_dir, s.run_id) / results.RESULTS_FILE
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


def sweep_plan(base: BenchSettings, lists: dict) -> list[BenchSettings]:
    """The cross product of the lists (framework, backend, compression, nodes), each
    with all of base.np."""
    keys = [k for k in SWEEP_FIELDS if k in lists]
    plans = []
    for values in itertools.product(*(lists[k] for k in keys)):
        plans.append(dataclasses.replace(base, **dict(zip(keys, values))))
    return plans


def done_key(framework, backend, compression, nodes, np, link="", repeat=0, strategy="ddp") -> tuple:
    return (strategy or "ddp", framework, backend, compression, int(nodes), int(np), link or "",
            int(repeat))


def finished(rfile) -> set:
    """Runs that already have an ok record in a results file (for --resume): each
    combination, process count and repeat index."""
    out = set()
    for r in results.read_records(rfile)[0]:
        if r.get("status") == "ok":
            c = r["config"]
            out.add(done_key(c["framework"], c["backend"], c["compression"], r["world"]["nodes"],
                             r["world"]["np"], c.get("link", ""), c.get("repeat", 0),
                             c.get("strategy", "ddp")))
    return out


def run_sweep(base: BenchSettings, lists: dict, resume: bool = False, echo=print) -> list[Outcome]:
    """Every combination into one results directory, --repeat times, interleaved: every
    combination once, then every one again. A combination that cannot run here is
    skipped with the reason printed and recorded (once); with resume, runs that already
    have an ok record in that directory (combination, process count, repeat) are not run
    again."""
    if resume and not base.run_id:
        raise BenchError("--resume continues a sweep: give its --run-id (the results folder's name)")
    run_id = base.run_id or results.new_run_id()
    base = dataclasses.replace(base, run_id=run_id)
    rfile = results.run_dir(base.results_dir, run_id) / results.RESULTS_FILE
    have = finished(rfile) if resume else set()

    def label(s):
        how = f"strategy {s.strategy}, " if s.strategy != "ddp" else ""
        return f"{how}{s.framework} over {s.backend}, compression {s.compression}, {s.nodes} node(s)"

    todo = []
    for rep, (i, s) in stats.interleaved(list(enumerate(sweep_plan(base, lists))), base.repeat):
        nps = [n for n in s.np if done_key(s.framework, s.backend, s.compression,
                                                     s.nodes, n, s.link, rep, s.strategy) not in have]
        if nps:
            todo.append((rep, i, dataclasses.replace(s, np=nps)))
        else:
            echo(f"-- {label(s)}" + (f", repeat {rep + 1}" if base.repeat > 1 else "")
                 + ": already recorded, not run again (--resume)")
    progress = Progress(sum(len(s.np) for _, _, s in todo), echo)
    outcomes, skipped = [], set()
    stacks: dict = {}
    local = LocalRunner(base.results_dir, base.data_dir)
    for rep, i, s in todo:
        if i in skipped:
            continue
        try:
            stack = runner = None
            if s.nodes == 1 and s.where == "local" and not (s.hosts or s.hostfile):
                # Local processes: the same stack for every combination, probed once.
                runner = local
                if "local" not in stacks:
                    stacks["local"] = probe_stack(local)
                stack = stacks["local"]
            outcomes.append(run(s, echo=echo, stack=stack, runner=runner, repeats=[rep],
                                progress=progress))
            continue
        except BenchError as e:
            reason = str(e)
        skipped.add(i)
        progress.total -= sum(len(t[2].np) for t in todo if t[1] == i and t[0] >= rep)
        echo(f"-- skipped {label(s)}: {reason}")
        os.makedirs(rfile.parent, exist_ok=True)
        for n in s.np:
            framework = s.framework if s.framework != "auto" else (framework_of(s.strategy) or "ddp")
            cfg = dataclasses.replace(base_config(s, framework),
                                      run_id=run_id, expected_np=n, link=s.link)
            results.append_record(rfile, results.make_record(
                "skipped", run_id=run_id, config=cfg.as_record(), np=n, nodes=s.nodes,
                started_at=results.now_iso(), error={"reason": reason}))
    return outcomes
