"""`invoke lab`: the classic distributed-training lab end to end on this machine. It
looks at what the machine has (GPUs, mpirun, Horovod, a Docker engine and the lab image), prints
the plan (lab.host.suites.course_plan) with an estimate, then runs each part as bench runs it
(the same plan and sweep code as `invoke bench`), brings the simulated cluster up for the
cross-server part and down after it (when it brought it up), and ends with the report of
all the parts in Markdown and HTML. A part that fails is said and the next one runs;
`--resume` runs only what has no record yet."""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field

from lab.common import display, docker_api, results
from lab.host.errors import BenchError
from lab.host.places.base import RunnerError
from lab.host.places.compose import cluster
from lab.host.request.plan import make_plan
from lab.host.run.bench import probe_stack
from lab.host.run.sweep import run_request
from lab.host.suites import course_plan, doctor
from lab.host.suites.course_plan import Part, Plan
from lab.host.suites.gpus import count_gpus
from lab.report import model_inputs
from lab.report.lab_report import ReportError, write_files


class CourseError(Exception):
    """The lab cannot start: one sentence that says what to do."""


@dataclass
class Machine:
    gpus: int
    backends: tuple[str, ...]
    cluster: str                # why the simulated cluster cannot run ("": it can)
    image_missing: bool         # the CPU image is to be built first
    notes: list[str] = field(default_factory=list)
    horovod: str = ""           # why Horovod cannot run here ("": it can)


def look(device: str = "auto") -> Machine:
    """What this machine offers the lab. `device`: auto (GPUs when NVML sees some), cpu
    or cuda."""
    if device not in ("auto", "cpu", "cuda"):
        raise CourseError(f"--device is one of auto, cpu or cuda, not {device!r}")
    gpus = 0
    if device != "cpu":
        gpus = count_gpus().visible
        if device == "cuda" and not gpus:
            raise CourseError("--device cuda: no GPU is visible here (NVML and nvidia-smi found "
                              "none): leave --device out for the CPU lab")
    backends = ["gloo"]
    notes = []
    if shutil.which("mpirun"):
        # oneCCL: Horovod's, under its MPI controller (lab.common.ccl); a Horovod built
        # without it has its runs skipped by bench, each with the reason.
        backends += ["mpi", "ccl"]
    else:
        notes.append("no mpirun on the PATH: the MPI and oneCCL back ends are left out "
                     "(docker/setup-venv.sh installs Open MPI)")
    if gpus:
        backends.append("nccl")
    cluster_problem, missing = "", False
    try:
        cli = docker_api.client(timeout=10)
        missing = docker_api.find_image(cli, [f"{docker_api.IMAGE_REPO}:cpu"]) is None
    except Exception as e:      # no engine, or no permission to its socket: said once
        cluster_problem = f"no Docker engine here ({e}); the cross-server part needs one"
    if not cluster_problem:
        try:
            cluster.compose_program()
        except cluster.ClusterError as e:
            cluster_problem = f"{e}; the cross-server parts need it"
    return Machine(gpus, tuple(backends), cluster_problem, missing, notes, horovod_here())


def horovod_here() -> str:
    """Why Horovod cannot run as this machine's local ranks ("": it can), from the stack
    probe bench makes of them (lab.worker.capabilities, cached: lab.host.places.stack_cache): not
    installed, or installed but horovod.torch does not import (torch changed after it
    was built), where bench would skip every Horovod run."""
    try:
        stack = probe_stack()
    except BenchError as e:
        return f"Horovod could not be looked for here ({e})"
    if stack.get("horovod"):
        return ""
    if stack.get("horovod_error"):
        return (f"Horovod does not import here ({stack['horovod_error'].splitlines()[0][:160]}; "
                f"rebuild it with docker/install-horovod.sh)")
    return "Horovod is not installed here (docker/install-horovod.sh builds it)"


def make(results_dir: str, quick: bool, machine: Machine) -> Plan:
    try:
        results.check_folder(results_dir, make=False)
    except results.FolderError as e:
        raise CourseError(str(e)) from None
    p = course_plan.plan(results_dir, quick=quick, gpus=machine.gpus, backends=machine.backends,
                         cluster=machine.cluster, horovod=machine.horovod)
    p.notes += machine.notes
    if machine.image_missing and not machine.cluster:
        p.notes.append("the CPU image the cluster runs is not built: `invoke build --flavor cpu` "
                       "runs first (about 5 min with a warm cache)")
    return p


def check_folders(plan: Plan, resume: bool) -> None:
    """Refuse to mix a new lab into an earlier one's folders."""
    if resume:
        return
    there = [p.run_id for p in plan.parts
             if os.path.exists(os.path.join(plan.results_dir, p.run_id))]
    if there:
        raise CourseError(f"{plan.results_dir} already holds an earlier lab ({', '.join(there)}): "
                          f"`invoke lab --resume` continues it, or give another --results-dir")


def run(plan: Plan, *, resume: bool = False, defaults: dict | None = None, build=None,
        echo=print) -> dict:
    """Run the plan: {part name: "ok" | "N failed" | "skipped: why" | "error: ..."} and the
    report's files under "report"."""

    check_folders(plan, resume)
    if any(p.place == "cluster" and not p.skipped for p in plan.parts):
        check_cluster_folder(plan)
    try:
        results.check_folder(plan.results_dir)
    except results.FolderError as e:
        raise CourseError(str(e)) from None
    outcome: dict = {}
    started_cluster = False
    t0 = time.monotonic()
    todo = [p for p in plan.parts if not p.skipped]
    if plan.sweeps:
        echo(f"== {plan.sweeps.title} (about {display.duration(plan.sweeps.estimate_s, rough=True)})")
        echo(f"   {plan.sweeps.command()}")
        try:
            outcome[plan.sweeps.name] = sweeps(plan.sweeps, resume, echo)
        except (BenchError, RunnerError) as e:
            outcome[plan.sweeps.name] = f"error: {e}"
            echo(f"!! {plan.sweeps.title}: {e}")
    try:
        for i, part in enumerate(plan.parts, 1):
            if part.skipped:
                outcome[part.name] = f"skipped: {part.skipped}"
                echo(f"== lab part {i}/{len(plan.parts)}: {part.heading}: skipped: {part.skipped}")
                continue
            left = sum(p.estimate_s for p in todo[todo.index(part):])
            echo(f"== lab part {i}/{len(plan.parts)}: {part.heading} (about {display.duration(part.estimate_s, rough=True)}; "
                 f"{display.duration(time.monotonic() - t0, rough=True)} so far, about {display.duration(left, rough=True)} to go)")
            echo(f"   {part.command()}")
            t_part = time.monotonic()
            try:
                if part.place == "cluster" and not started_cluster:
                    started_cluster = bring_up(build, echo, plan.results_dir)
                bench = make_plan(dict(part.flags), dict(defaults or {}), resume=True, echo=echo)
                result = run_request(bench, echo=echo)
                outcome[part.name] = part_outcome(result)
            except (BenchError, CourseError) as e:
                outcome[part.name] = f"error: {e}"
                echo(f"!! {part.heading}: {e}")
            echo(f"== {part.heading}: {outcome[part.name]}, took {display.duration(time.monotonic() - t_part, rough=True)} "
                 f"(estimated {display.duration(part.estimate_s, rough=True)})")
    finally:
        if started_cluster:
            take_down(echo)
    echo(f"== the report ({display.duration(time.monotonic() - t0, rough=True)} so far)")
    outcome["report"] = report(plan)
    for f in outcome["report"]:
        echo(f"wrote {f}")
    echo(f"== the lab took {display.duration(time.monotonic() - t0)} "
         f"(estimated {display.duration(plan.estimate_s, rough=True)})")
    return outcome


def sweeps(part: Part, resume: bool, echo=print) -> str:
    """The doctor part: doctor's checks of this host and its stack, its collective sweeps
    saved where the report's cost model finds them (lab.report.model_inputs.SWEEP_FILE in
    the lab's results folder); with --resume, not again where they are saved."""
    folder = part.flags["results_dir"]
    if resume and os.path.exists(os.path.join(folder, model_inputs.SWEEP_FILE)):
        return "ok (saved before)"
    checks, _, _ = doctor.run(int(part.flags["np"]), where="local", echo=lambda line: None)
    saved = model_inputs.save_sweeps(model_inputs.sweep_entries(checks), folder)
    echo(f"   the collectives' sweeps saved to {saved}" if saved else
         "   no collectives' sweep passed: the report's cost model predicts no row")
    return "ok" if saved else "no sweep passed (doctor's checks say why: invoke doctor --local)"


def part_outcome(result) -> str:
    """"ok", "N run(s) failed", or that nothing ran (every run skipped: the lines above
    and the records say why), which is no part done."""
    if result.failed:
        return f"{result.failed} run(s) failed"
    if result.records and not any(r.get("status") == "ok" for r in result.records):
        return (f"nothing ran: all {len(result.records)} run(s) were skipped (the lines above "
                f"and the records say why)")
    return "ok"


def running_cluster_results(cli) -> str | None:
    """The folder a running two-node cluster of this checkout mounts at /results, or None
    when it is not running. A cluster partly up is refused (CourseError): the lab would
    bring the rest up beside what runs there, and take all of it down after."""
    found = cluster.nodes(cli)
    names = cluster.node_names(2)
    running = [h for h in names if h in found and found[h].status == "running"]
    if len(running) == 1:
        stopped = next(h for h in names if h not in running)
        raise CourseError(f"the cluster is partly up ({running[0]} runs, {stopped} does not): take it down "
                          f"with `invoke down` (the lab brings it up with its own folder), or "
                          f"bring it all up with `invoke up`, then run the lab again")
    if len(running) < 2:
        return None
    mounts = {m["Destination"]: m["Source"] for m in found["node1"].attrs.get("Mounts", [])}
    return mounts.get("/results", "")


def check_cluster_folder(plan: Plan) -> None:
    """The cluster's ranks write into the folder its nodes mount: a cluster already up
    with another one would skip every cross-server run, so it is refused before any part
    runs (a cluster the lab brings up mounts the lab's folder)."""
    try:
        there = running_cluster_results(cluster.engine())
    except CourseError:
        raise
    except Exception:       # no engine, or an engine error: the part says so when it comes
        return
    want = os.path.realpath(plan.results_dir)
    if there is not None and os.path.realpath(there or "/") != want:
        instead = f", or run the lab with --results-dir {there}" if there else ""
        raise CourseError(f"the running cluster's nodes write into {there or 'no /results folder'}, "
                          f"not the lab's {want}: take it down with `invoke down` (the lab brings "
                          f"it up with its own folder){instead}")


def bring_up(build, echo, results_dir: str) -> bool:
    """The two-node cluster mounting the lab's results folder, the image built first when
    missing: whether this started it (and so takes it down)."""
    try:
        cli = cluster.engine()
        if all(h in cluster.nodes(cli) and cluster.nodes(cli)[h].status == "running"
               for h in cluster.node_names(2)):
            return False
        if docker_api.find_image(cli, [f"{docker_api.IMAGE_REPO}:cpu"]) is None:
            if build is None:
                raise CourseError("the CPU image is not built: run `invoke build --flavor cpu`")
            echo("building the CPU image the cluster runs (invoke build --flavor cpu)")
            build()
        cluster.up(2, echo=echo, results_dir=results_dir)
    except cluster.ClusterError as e:
        raise CourseError(str(e)) from None
    return True


def take_down(echo) -> None:
    try:
        cluster.down(echo=echo)
        echo("cluster removed")
    except cluster.ClusterError as e:
        echo(f"!! could not remove the cluster ({e}): `invoke down` removes it")


def report(plan: Plan) -> list[str]:
    """report.md and report.html of every part that has records, in the lab's report folder."""
    sources = [os.path.join(plan.results_dir, p.run_id) for p in plan.parts
               if os.path.exists(os.path.join(plan.results_dir, p.run_id))]
    if not sources:
        return []
    os.makedirs(plan.report_dir, exist_ok=True)
    try:
        return [str(f) for f in write_files(plan.report_dir, "html", sources=sources)]
    except ReportError as e:
        raise CourseError(str(e)) from None


__all__ = ["CourseError", "Machine", "Part", "Plan", "look", "make", "run"]
