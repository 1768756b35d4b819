"""`invoke bench`: one request's runs — each process count launched by its framework's
launcher through a runner (local processes, the lab image, the cluster), its output
streamed, a dying rank ending the job, the failure recorded with the rank that caused
it, the compute ceiling measured around it when asked — and the table printed. Sweeps
(lab.host.run.sweep) call `run` once per combination. Commands come from lab.host.places.launch,
the figures from the records the ranks write."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import time
from dataclasses import dataclass

from lab.common import display, heartbeat, results
from lab.common.config import ConfigError, RunConfig
from lab.common.fetch import DataUnavailable, ensure_mnist, mnist_train_size
from lab.host.errors import BenchError
from lab.host.places import choose_runner, for_request, hold, place_of, refusal, runner_for
from lab.host.places.base import JobResult, Launch, Runner, RunnerError
from lab.host.places.launch import HostsError, job_env
from lab.host.request.checks import check_request, refused_counts
from lab.host.request.plan import finished, plan_of, recorded
from lab.host.run import ceiling, records, restart
from lab.host.run.startup import CLOCK
from lab.host.settings import BenchSettings, base_config
from lab.host.watch.failures import attribute_failure
from lab.host.watch.launcher_output import StreamWatches
from lab.host.watch.stall import StallWatch, flight_recorder


@dataclass
class Outcome:
    run_dir: str
    records: list[dict]
    failed: int
    notes: list[str]


def probe_stack(runner: Runner | None = None) -> dict:
    """What the ranks' Python can run, where they will run (default: local processes)."""
    try:
        return (runner or choose_runner(where="local")[0]).probe_stack()
    except RunnerError as e:
        raise BenchError(str(e)) from None


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be."""


@contextlib.contextmanager
def terminate_as_interrupt():
    """SIGTERM (`kill`, a CI job's timeout, Slurm ending an outer job) handled as Ctrl-C
    while bench runs: whatever is running is stopped the same way (a container removed,
    a process group ended, a Slurm job cancelled) and recorded as interrupted."""
    def raise_interrupt(signum, frame):
        raise Terminated
    try:
        before = signal.signal(signal.SIGTERM, raise_interrupt)
    except ValueError:          # not the main thread: leave it as it is
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def run(s: BenchSettings, echo=print, stack: dict | None = None, runner: Runner | None = None,
        progress: display.Progress | None = None) -> Outcome:
    """One combination (`s`, with all its process counts and repeats): its place's view of
    it (lab.host.places.for_request, unless a `runner` is given: the caller's), its plan
    (lab.host.request.plan.plan_of, the checks that need nothing but the request), then its jobs."""
    options = None
    if runner is None:
        try:
            s, options = for_request(s, echo=echo)
        except RunnerError as e:
            raise BenchError(str(e)) from None
    plan = dataclasses.replace(plan_of(s), place_options=options)
    return run_jobs(plan, plan.jobs, echo, stack, runner, progress)


def run_jobs(plan, jobs, echo=print, stack: dict | None = None,
             runner: Runner | None = None, progress: display.Progress | None = None,
             skipped: set | None = None) -> Outcome:
    """Jobs of one combination of a plan (lab.host.request.plan.Job: the combination's settings,
    a process count, a repeat) into the plan's results directory, in the plan's order:
    the runner chosen and the stack probed once, the request checked against that stack.
    The counts that stack cannot run (request.checks.refused_counts: more GPU ranks than GPUs)
    are skipped and recorded (records.skip_refused), the rest run; `skipped`: the sweep's
    (combination, np) set of what it skipped, which this adds to."""
    s = jobs[0].settings
    if runner is None:      # else the sweep chose it and marked "runner", "probe" (sweep.Places)
        try:
            runner, where_note = runner_for(s, plan.place_options, echo)
        except RunnerError as e:
            raise BenchError(str(e)) from None
        if where_note:
            echo(where_note)
        CLOCK.mark("runner")
    else:
        where_note = None
    fixed = runner.results_folder()
    if fixed:
        # The ranks write to one folder (the cluster's nodes: the one compose.yaml mounts):
        # one results folder for the whole request (skipped records and --resume read the
        # one given), or a refusal.
        if os.path.realpath(s.results_dir) != os.path.realpath(fixed):
            raise BenchError(f"the ranks here write their records to {fixed} (the folder they "
                             f"mount): give --results-dir {fixed}, or leave --results-dir out "
                             f"when running from the checkout")
        given = s.data_dir not in (None, "", RunConfig.data_dir)
        if given and runner.data_dir and os.path.realpath(s.data_dir) != os.path.realpath(runner.data_dir):
            raise BenchError(f"the ranks here read their data from {runner.data_dir} (the folder "
                             f"they mount): give --data-dir {runner.data_dir}, or leave it out")
        s = dataclasses.replace(s, data_dir=runner.data_dir or s.data_dir)
    if stack is None:
        stack = probe_stack(runner)
        CLOCK.mark("probe")
    try:
        framework, notes = check_request(s, stack)
    except BenchError as e:
        # `where: auto` means wherever the request can run: when the image's stack
        # refuses it (CI's CPU image has no torchvision, say) and this machine's accepts
        # it, the ranks run here, and the output says why.
        if not (runner.falls_back_to_local and s.where == "auto" and not s.image
                and not s.frozen):
            raise
        local, _ = runner_for(dataclasses.replace(s, where="local"))
        local_stack = probe_stack(local)
        try:
            framework, notes = check_request(s, local_stack)
        except BenchError:
            raise e from None
        where_note = (f"running as local processes: the image {runner.tag} cannot run this "
                      f"({e}), this machine can")
        runner, stack = local, local_stack
        echo(where_note)
    for n in notes:
        echo(n)
    if where_note and runner.records_where_note:
        notes.insert(0, where_note)
    progress = progress or display.Progress(len(jobs), echo)
    jobs = records.skip_refused(plan, jobs, refused_counts(s, stack, framework), progress, echo, skipped)
    nps = list(dict.fromkeys(j.np for j in jobs))
    check_steps(s, framework, nps)
    run_id = s.run_id           # fixed by the plan
    rdir = results.run_dir(s.results_dir, run_id)
    rfile = rdir / results.RESULTS_FILE
    os.makedirs(rdir, exist_ok=True)
    CLOCK.mark("checks")
    with holding(runner, run_id, s.no_wait, echo) as waited:
        waited_for(waited or 0.0, progress)
        if plan.resume:
            jobs = not_recorded_meanwhile(jobs, rfile, progress, echo)
        failed = _run_held(s, jobs, runner, stack, framework, rdir, rfile, progress, echo)
    written = [r for r in results.read_records(rfile)[0] if r.get("run_id") == run_id]
    return Outcome(str(rdir), written, failed, notes)


def holding(runner: Runner, run_id: str, no_wait: bool, echo):
    """The hold on what the runner's ranks share (lab.host.places.hold), or nothing."""
    if not runner.holds:
        return contextlib.nullcontext()
    return hold.hold(runner.holds, run_id, place=runner.kind, wait=not no_wait, echo=echo,
                     clear=runner.stop)


def waited_for(seconds: float, progress: display.Progress | None) -> None:
    """Time spent waiting for another run's hold: not this run's start-up, nor its progress."""
    CLOCK.skip(seconds)
    if progress is not None:
        progress.t0 += seconds


def not_recorded_meanwhile(jobs: list, rfile, progress, echo) -> list:
    """--resume: the jobs less those an ok record now names (a killed run's processes may
    have finished one between the plan and the hold): a run is never recorded twice."""
    have = finished(rfile)
    left = [j for j in jobs if not recorded(have, j.settings, j.np, j.repeat)]
    if len(left) < len(jobs):
        echo(f"-- {len(jobs) - len(left)} run(s) recorded meanwhile by the run that was "
             f"stopped: not run again (--resume)")
        progress.total -= len(jobs) - len(left)
    return left


def _run_held(s, jobs, runner, stack, framework, rdir, rfile, progress, echo) -> int:
    """The jobs, on the runner, while the hold is held: 1 for each that failed."""
    run_id = s.run_id
    runner.prepare(str(rdir))
    shaped, cpusets = bool(s.link), None
    failed = 0
    try:        # inside: nodes given cores or shaped before one that fails are given back
        try:
            cpusets = runner.own_cores(echo)
            if shaped:
                runner.shape_links(s.link, echo)
        except RunnerError as e:
            raise BenchError(str(e)) from None
        # The plan's order: every process count once, then every one again (a drift of
        # the machine's speed falls on all of them alike).
        for job in jobs:
            np, rep = job.np, job.repeat
            cfg = dataclasses.replace(base_config(s, framework), run_id=run_id, expected_np=np,
                                      attempt=job.attempt(framework), link=s.link, repeat=rep)
            if s.strategy == "dataparallel":   # one process over np GPUs
                cfg = dataclasses.replace(cfg, expected_np=1, devices=np)
            progress.start((f"{s.strategy}, " if s.strategy != "ddp" else "")
                           + f"{framework} over {s.backend}, {s.compression}, np {np}"
                           + (f", {s.precision}" if s.precision != "fp32" else "")
                           + (f", repeat {rep + 1} of at most {s.repeat_max}" if s.repeat_max else
                              f", repeat {rep + 1} of {s.repeat}" if s.repeat > 1 else ""))
            load, line = records.oversubscription(runner.machines(cfg.expected_np, stack), s.threads)
            load.update(place=runner.kind, **({"node_cores": cpusets} if cpusets else {}))
            if line:
                echo(line)
            failed += run_job(s, cfg, np, runner, rfile, echo, load, stack.get("torch"))
    finally:
        runner.share_cores()        # never raises
        if shaped:
            runner.unshape_links()
        try:
            runner.hand_back(str(rdir))
        except RunnerError as e:
            echo(f"note: {e}")
    return failed


def check_steps(s: BenchSettings, framework: str, nps: list[int]) -> None:
    """Before any rank starts: MNIST fetched once (here, not by every rank) and its files
    checked, and every process count left with at least one timed step."""
    cfg = base_config(s, framework)
    try:
        size = mnist_train_size(ensure_mnist(s.data_dir)) if s.data == "mnist" else cfg.train_size()
        for np in nps:
            cfg.check_timing(size, np)
    except (ConfigError, DataUnavailable) as e:
        raise BenchError(str(e)) from None


def run_job(s: BenchSettings, cfg: RunConfig, np: int, runner: Runner, rfile, echo,
            load: dict | None = None, torch_version: str | None = None) -> int:
    """One job: its launch (run_one), relaunched after a failure up to --max-restarts
    times, each from the job's last checkpoint (lab.host.run.restart); 0 when the job
    ended with its record, 1 when it failed (recorded)."""
    # where: auto: the engine picked the runner (local processes or the image); what the
    # request asks of where it runs is asked again of the one picked (a place the request
    # names was asked before anything ran: places.for_request)
    line = refusal(s, type(runner)) if place_of(s) is None else None
    if line:
        raise BenchError(line)
    if not s.max_restarts or type(runner).retries_in_place:
        return run_one(s, cfg, np, runner, rfile, echo, load, torch_version=torch_version)
    job = restart.Relaunches(s, cfg, rfile, echo)
    for launch in job.launches():
        try:
            failed = run_one(s, launch, np, runner, rfile, echo, load, torch_version=torch_version)
        except BaseException:
            job.interrupted()
            raise
        if job.ended(failed):
            return failed
    return 1        # not reached: the last launch ends the job


def run_one(s: BenchSettings, cfg: RunConfig, np: int, runner: Runner, rfile, echo,
            load: dict | None = None, torch_version: str | None = None) -> int:
    """One launch of `np` ranks; 0 when it wrote its record, 1 when it failed (recorded).
    `torch_version`: the ranks' torch (the stack probe), for the Flight Recorder's names."""
    ceiling_before = ceiling.measure(s, np, runner) if s.ceiling else None
    # The launch time goes to the ranks, which measure their start-up against it.
    cfg = dataclasses.replace(cfg, launched_at=round(time.time(), 3))
    inside = dataclasses.replace(cfg, results_dir=runner.results_in,
                                 data_dir=runner.data_in or cfg.data_dir)
    # A resumed run's launch has the name of the one that failed before: that launch's
    # rank failures are not this one's.
    shutil.rmtree(rfile.parent / "failures" / cfg.attempt, ignore_errors=True)
    # The ranks' heartbeats reach the stall watch over the place's channel.
    env = {**job_env(s), heartbeat.CHANNEL_VAR: runner.heartbeat_channel}
    env, flight = flight_recorder(cfg, s.backend, env, inside.results_dir, rfile.parent, torch_version)
    try:
        commands = runner.commands(Launch(cfg.framework, s.backend, cfg.expected_np,
                                          tuple(inside.to_args()), tuple(env.items()),
                                          s.timeout_s, cfg.run_id, cfg.attempt, cfg.device, inside))
    except (RunnerError, HostsError) as e:
        raise BenchError(str(e)) from None
    echo(f"== {cfg.framework} over {s.backend}, {np} process(es): "
         f"{' '.join(next(iter(commands.values())))}")
    before = len(results.read_records(rfile)[0])
    started = results.now_iso()
    t0 = time.monotonic()
    # Under Slurm, Horovod over MPI runs every rank as an srun task.
    launch = Launch(cfg.framework, s.backend, cfg.expected_np, (), run_id=cfg.run_id,
                    attempt=cfg.attempt)
    watch = StreamWatches(echo, srun_tasks_are_ranks=runner.srun_tasks_are_ranks(launch))
    # The stall watch (lab.host.watch.stall) reads the ranks' heartbeats beside the runner and
    # ends a job in which no rank advances with the runner's own stop(); its bound starts
    # when the ranks do, and the heartbeats' marker lines are its alone.
    stall = StallWatch(heartbeat.folder(rfile.parent, cfg.attempt), cfg.expected_np, s.stall_s,
                       cfg.launched_at, runner.stop, echo, flight=flight,
                       started=runner.ranks_started, channel=runner.heartbeat_channel).start()

    def line(text: str) -> None:
        own = stall.line(text)
        if own is not None:
            watch.line(own)
    try:
        try:
            res = runner.run(commands, env, s.timeout_s, line,
                             name=f"lab-bench-{cfg.run_id}-{cfg.attempt}")
        finally:
            stall.close()
            watch.close()
    except KeyboardInterrupt as e:
        runner.stop()
        error = {"reason": "stopped by SIGTERM" if isinstance(e, Terminated) else "interrupted by the user"}
        job = runner.cancelled_job()     # a scheduler's job: which one was cancelled, under its name
        if job:
            name = job.get("name", "scheduler")
            error[name] = {**{k: v for k, v in job.items() if k != "name"},
                           "state": f"CANCELLED ({job.get('cancel', 'cancelled')} by bench)"}
        records.record_failure(rfile, cfg, np, s.nodes, started, error)
        if load:
            records.add_world(rfile, before, load)
        raise
    except RunnerError as e:
        res = JobResult(1, [str(e)], str(e))
    host = CLOCK.phases(cfg.launched_at)
    CLOCK.restart()         # the next launch of a sweep: its host phases start here
    wrote = len(results.read_records(rfile)[0]) > before
    if wrote and host:
        records.add_startup(rfile, before, host)
    if wrote and load:
        records.add_world(rfile, before, load)
    if wrote and res.scheduler and res.scheduler.get("job_id"):
        records.add_scheduler_state(rfile, before, res.scheduler)
    if wrote and stall.launcher_ended:
        records.add_world(rfile, before, {"launcher_ended": stall.launcher_ended})
    if (res.returncode == 0 or stall.launcher_ended) and wrote:
        if s.ceiling:
            records.add_ceiling(rfile, before, cfg, ceiling.around(s, np, ceiling_before, runner))
        return 0
    if stall.error:
        echo(f"!! run stalled and was stopped after {time.monotonic() - t0:.1f} s "
             f"(no rank advanced for {stall.stalled_after:.0f} s)")
        records.record_failure(rfile, cfg, np, s.nodes, started,
                        {**stall.error, "log_tail": "\n".join(list(watch.tail)[-20:])})
        if load:
            records.add_world(rfile, before, load)
        return 1
    info, reason = attribute_failure(res, rfile.parent / "failures" / cfg.attempt,
                                     runner.dead(), watch.first, stall.beats())
    echo(f"!! run failed after {time.monotonic() - t0:.1f} s: {reason}")
    error = {**{k: info.get(k) for k in ("rank", "host", "exit_code", "signal") if k in info},
             "reason": reason, "log_tail": "\n".join(list(watch.tail)[-20:])}
    if res.scheduler:
        error[res.scheduler.get("name", "scheduler")] = {k: v for k, v in res.scheduler.items() if k != "name"}
    records.record_failure(rfile, cfg, np, s.nodes, started, error)
    if load:
        records.add_world(rfile, before, load)
    return 1


