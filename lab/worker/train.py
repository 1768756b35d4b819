"""`python -m lab.worker.train`: one rank of a data-parallel training run.

Started by a launcher (horovodrun, torch.distributed.run) or alone with
`--framework none`. Rank 0 appends one record to <results-dir>/<run-id>/results.jsonl;
a rank that fails writes <results-dir>/<run-id>/failures/rank-<N>.json and exits
non-zero at once, so the launcher ends the job.
"""
from __future__ import annotations

import collections
import json
import os
import signal
import sys
import time
import traceback

# When this rank's Python began running the worker (wall clock, so that it compares with
# the launch time bench passes in --launched-at; the ranks of one job share a clock).
PROCESS_T0 = time.time()

from lab.common import progress, restarts, results  # noqa: E402
from lab.common.config import SLOW_FAULT_S, SLOW_SAVE_S, ConfigError, parse_args  # noqa: E402
from lab.worker import compiled, lean  # noqa: E402 - light: torch is imported where it is timed

# Wall-clock marks of this rank's start-up (lab.worker.train.startup_phases).
MARKS: dict[str, float] = {"process": PROCESS_T0}
STARTUP_PHASES = ("launcher", "imports", "rendezvous", "data", "setup", "warmup")
EDGE_STEPS = 3      # figures.step_losses: the launch's first and last this many steps


def scheduler_job() -> dict:
    """The Slurm job this rank runs in, from the variables slurmd gives a job's tasks
    (and horovodrun passes on to the ranks it starts): {"scheduler": {...}} or {}."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return {}
    return {"scheduler": {"name": "slurm", "job_id": job,
                          "nodelist": os.environ.get("SLURM_JOB_NODELIST")}}


def startup_phases(marks: dict[str, float], launched_at: float) -> dict[str, float | None]:
    """Where a rank's start-up went, in seconds: launcher (from bench starting the
    launcher until the rank's Python runs the worker: the launcher, the container, the
    interpreter), imports (torch), rendezvous (the framework's import and its process
    group or hvd.init), data (the data set loaded and put on the device), setup (model,
    optimizer, the first broadcast, the first batch), warmup (the --warmup-steps steps),
    and total (launch to the first timed step). The host's phases before the launch are
    bench's (lab.host.run.startup)."""
    def span(a, b):
        return marks[b] - marks[a] if a in marks and b in marks else None
    out = {"launcher": marks["process"] - launched_at if launched_at else None,
           "imports": span("process", "torch"), "rendezvous": span("torch", "group"),
           "data": span("group", "data"), "setup": span("data", "first_step"),
           "warmup": span("first_step", "first_timed")}
    out["total"] = (marks["first_timed"] - launched_at
                    if launched_at and "first_timed" in marks else None)
    return {k: (None if v is None else round(v, 3)) for k, v in out.items()}


class InjectedFault(RuntimeError):
    """Raised by --fault RANK:STEP, to test that a dying rank ends the job."""


class NoHeartbeat:
    """Where no heartbeat can be kept (an unwritable results folder): beats go nowhere."""
    slowest = None
    eval_steps = 0.0

    def beat(self, *a, **k):
        pass

    def step_took(self, seconds):
        pass

    def mark(self, where):
        pass

    def compiling(self, started):
        pass

    def close(self, phase="done"):
        pass


def stop_calling_collectives():
    """--fault R:S:hang: this rank stops taking part, as one stuck outside the step's
    collectives would (its peers wait in theirs); bench's stall watch ends the job."""
    while True:
        time.sleep(3600)


def in_checkpoint(hb, step, where, slow=False):
    """What a checkpoint's save or load tells once it knows its bytes: the heartbeat's
    checkpoint phase with them (its bound: lab.common.heartbeat.bound_s); with --fault
    R:S:slow-save, that rank's save then sleeps SLOW_SAVE_S, as one on slow storage."""
    def sized(nbytes: int) -> None:
        hb.beat("checkpoint", step, where, checkpoint_bytes=nbytes)
        if slow:
            time.sleep(SLOW_SAVE_S)
    return sized


def load_batch(xs, ys, j, b, stall=False):
    """The batch of step j; with --fault R:S:hang-data, a data loader that never returns."""
    while stall:
        time.sleep(3600)
    return xs[j * b:(j + 1) * b], ys[j * b:(j + 1) * b]


def _accuracy_text(cfg, accuracy: float) -> str:
    """As the report shows it: n/a on synthetic data (random labels teach nothing)."""
    return "n/a (synthetic data)" if cfg.data == "synthetic" else f"{accuracy:.2%}"


def _sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(cfg, d, log=print, hb=None) -> dict | None:
    """Train and measure; return the record on rank 0 (None elsewhere). `hb`: the
    rank's heartbeat (lab.worker.heartbeat)."""
    hb = hb or NoHeartbeat()
    import torch

    from lab.common import horovod_tuning, metrics
    from lab.worker import checkpoint as ckpt
    from lab.worker import data, dist, manifest, models, precision, step_parts, strategies
    from lab.worker.strategies import memory

    started = results.now_iso()
    torch.set_num_threads(cfg.threads)
    if cfg.expected_np and d.size != cfg.expected_np:
        raise ConfigError(f"the launcher started {cfg.expected_np} processes but this one sees "
                          f"a world of {d.size}: start Horovod jobs with horovodrun and DDP "
                          f"jobs with torch.distributed.run")
    if cfg.device == "cuda":
        device = dist.select_gpu(d.local_rank, d.local_size)
    else:
        device = torch.device("cpu")
    precision.set_math(cfg.precision, device)

    torch.manual_seed(cfg.seed)
    ds = data.load(cfg)
    train_split, test_split = ds.train.to(device), ds.test.to(device)
    MARKS["data"] = time.time()
    strategy = strategies.create(cfg, d, device)
    strategy.sample_shape = (ds.channels, ds.size, ds.size)
    model, loss_fn = models.build(cfg.model, ds.channels, ds.size, ds.classes)
    if strategy.channels_last:
        model = model.to(memory_format=torch.channels_last)
    strategy.build(model, loss_fn)
    if cfg.compile:
        strategy.compile()
        compiled.watch(hb.compiling)
    marks = step_parts.StepParts(device)
    if device.type == "cuda":   # the first forward timed to its end (lab.worker.heartbeat)
        hb.synchronize = lambda: _sync(device)
    strategy.mark = step_parts.joined(hb.mark, marks.mark)
    if strategy.hook_gradients:
        marks.watch(strategy.eval_module().parameters())
    del model
    # The step's collective alone, on this run's payload (data parallelism only).
    probe = strategy.time_collective()
    # --fault fires on a job's first launch only: a relaunch (--max-restarts) runs clean.
    fault_rank, fault_step, fault_mode = (-1, -1, "") if ckpt.agree_restart(cfg, d) else cfg.fault_plan()
    # Data-parallel strategies split the data over the ranks; a pipeline's stages all
    # see the same batches (strategy.data_world is 1).
    steps = cfg.steps_per_epoch(len(train_split), strategy.data_world)

    step_times: list[float] = []
    # --compile: the steps in which the compiler ran (never timed) and its seconds
    compile_steps: list[dict] = []
    compiler_s = compiled.seconds() if cfg.compile else 0.0
    # this launch's first and last EDGE_STEPS losses (detached tensors: no sync inside a step)
    first_losses, last_losses = [], collections.deque(maxlen=EDGE_STEPS)
    if cfg.restart:     # a relaunch reads its checkpoint in a phase of its own
        hb.beat("checkpoint", None, "load")
    pos = ckpt.resume(cfg, d, strategy, log, in_checkpoint(hb, None, "load"))
    hb.beat("setup")    # step 0, or the relaunch's checkpoint loaded
    epochs, global_step = pos.epochs, pos.global_step
    total_steps = steps * cfg.epochs
    # Each launch warms up (a relaunch's first steps are a fresh process's); a relaunch
    # leaves at least one step to time.
    first_step = global_step
    warm_until = (first_step + min(cfg.warmup_steps, max(0, total_steps - first_step - 1))
                  if first_step else cfg.warmup_steps)
    said_at, said_step = time.perf_counter(), global_step   # the last progress line (rank 0)
    # --fault R:S:slow-save: the first checkpoint saved at or after step S, once
    slow_save_at = fault_step if fault_mode == "slow-save" and d.rank == fault_rank else None
    b = cfg.batch_size
    loop_start = time.perf_counter()    # the launch's training loop (checkpoints' share of it)
    for epoch in range(pos.epoch, cfg.epochs):
        idx = data.shard_indices(len(train_split), strategy.data_rank, strategy.data_world,
                                 epoch, cfg.seed)
        batches = min(steps, len(idx) // b)   # fewer than steps: synthetic data, cycled
        xs, ys = train_split.take(idx[:batches * b].to(device))
        strategy.train_mode(True)
        loss_sum = pos.epoch_loss(epoch, device)
        loss = loss_sum if pos.first_step(epoch) and pos.loss_sum is not None else None
        _sync(device)
        epoch_start = time.perf_counter()
        for s in range(pos.first_step(epoch), steps):
            phase = "warm-up" if global_step < warm_until else "step"
            hb.beat(phase, global_step, "before")
            faulty = global_step == fault_step and d.rank == fault_rank
            if faulty and fault_mode == "kill":   # as the out-of-memory killer would: no last word
                os.kill(os.getpid(), signal.SIGKILL)
            if faulty and fault_mode == "hang":
                stop_calling_collectives()
            if faulty and fault_mode == "raise":
                raise InjectedFault(f"fault injected at step {global_step} (--fault {cfg.fault})")
            j = s % batches
            marks.mark("data")
            x, y = load_batch(xs, ys, j, b, stall=faulty and fault_mode == "hang-data")
            if global_step == first_step:
                MARKS["first_step"] = time.time()
            if global_step == warm_until:
                MARKS["first_timed"] = time.time()
            hb.beat(phase, global_step, "in")
            marks.mark("step")
            t0 = time.perf_counter()
            if fault_mode == "slow" and d.rank == fault_rank and global_step >= fault_step:
                time.sleep(SLOW_FAULT_S)    # inside the step: counted in its "other" part
            loss = strategy.step(x, y)
            if loss is not None:
                loss_sum += loss
                if len(first_losses) < EDGE_STEPS:
                    first_losses.append(loss)
                last_losses.append(loss)
            _sync(device)
            marks.mark("end")
            took = time.perf_counter() - t0
            timed = global_step >= warm_until
            if cfg.compile and compiled.seconds() > compiler_s:    # this step compiled
                compiler_s, timed = compiled.seconds(), False
                compile_steps.append({"step": global_step, "step_s": round(took, 4)})
            marks.end(timed, lambda: strategy.eval_module().parameters(), took)
            hb.step_took(took)
            if timed:
                step_times.append(took)
            global_step += 1
            if ckpt.due(cfg, global_step, total_steps):
                slow = slow_save_at is not None and global_step >= slow_save_at
                slow_save_at = None if slow else slow_save_at
                hb.beat("checkpoint", global_step, "save")
                ckpt.save(cfg, d, strategy, global_step, epoch, s + 1,   # None: no loss here
                          loss_sum if loss is not None else None, epochs,
                          in_checkpoint(hb, global_step, "save", slow))
                hb.beat(phase, global_step, "before")
            now = time.perf_counter()
            if d.rank == 0 and now - said_at >= progress.EVERY_S:
                rate = strategy.images_per_step() * (global_step - said_step) / (now - said_at)
                log(progress.line(global_step, total_steps, rate), flush=True)
                said_at, said_step = now, global_step
        epoch_time = time.perf_counter() - epoch_start

        hb.eval_steps = len(test_split) / b
        hb.beat("evaluation", global_step)
        correct, total = strategy.evaluate(test_split, cfg.test_batch_size)
        # Shards are disjoint by construction (data.shard_indices; tests/test_data.py).
        # A pipeline's loss is its last stage's: only ranks that computed one count.
        parts = d.allgather_object({"loss": float(loss_sum) / steps if loss is not None else None,
                                    "correct": correct, "total": total, "samples": steps * b})
        losses = [p["loss"] for p in parts if p["loss"] is not None]
        shard_sizes = [p["samples"] for p in parts][:strategy.data_world]
        ep = {"epoch": epoch + 1,
              "train_loss": sum(losses) / len(losses),
              "test_accuracy": sum(p["correct"] for p in parts) / max(1, sum(p["total"] for p in parts)),
              "epoch_time_s": epoch_time,
              "shard_sizes": shard_sizes}
        epochs.append(ep)
        if d.rank == 0:
            ran = steps - pos.first_step(epoch)      # a relaunch resumes inside an epoch
            rate = f", {strategy.images_per_step() * ran / epoch_time:,.0f} images/s" if ran and epoch_time > 0 else ""
            log(f"epoch {ep['epoch']}/{cfg.epochs}: loss {ep['train_loss']:.4f}, "
                f"test accuracy {_accuracy_text(cfg, ep['test_accuracy'])}, {epoch_time:.2f} s"
                f"{rate}", flush=True)

    loop_s = time.perf_counter() - loop_start
    hb.beat("finish", global_step)
    summary = d.allgather_object({"host": dist.hostname(), "timed_s": sum(step_times),
                                  "timed_steps": len(step_times),
                                  "peak_memory": memory.peak(device),
                                  "reserved": memory.reserved(device),
                                  "held": strategy.holdings(),
                                  "digest": strategy.parameter_digest(),
                                  "startup": startup_phases(MARKS, cfg.launched_at),
                                  "compile_s": compiler_s if cfg.compile else None,
                                  "compile_steps": compile_steps,
                                  "parts": marks.rows, "step_times": step_times,
                                  "losses": edge_losses(first_losses, last_losses)})
    figures = strategy.figures()
    strategy.close()
    if d.rank != 0:
        return None
    if not step_times:
        raise ConfigError(f"no step was timed: {global_step} steps ran and --warmup-steps is "
                          f"{cfg.warmup_steps}; run more steps or lower --warmup-steps")
    hosts = [p["host"] for p in summary]
    stats = metrics.step_stats(step_times)
    # The job's start-up is its slowest rank's: no step is timed before every rank is in.
    slowest = max(summary, key=lambda p: p["startup"]["total"] or 0.0)["startup"]
    record = results.make_record(
        "ok", run_id=cfg.run_id, config=cfg.as_record(), np=strategy.workers(), nodes=len(set(hosts)),
        started_at=started,
        world={"hosts": hosts, "devices_per_node": strategy.devices_per_node(),
               "controller": d.controller, **scheduler_job(),
               # Horovod's fusion threshold and cycle time, as rank 0's Horovod read them
               **({"horovod": horovod_tuning.effective()} if cfg.framework == "horovod" else {}),
               # --backend ccl: what Horovod's timeline showed carrying the all-reduce
               **({"allreduce_ops": d.ccl_check} if getattr(d, "ccl_check", None) else {})},
        figures={
            "throughput_img_s": metrics.global_throughput(
                b, strategy.data_world, [p["timed_s"] for p in summary],
                min(p["timed_steps"] for p in summary)),
            "step_time_mean_s": stats["mean_s"],
            "step_time_p50_s": stats["p50_s"],
            "step_time_p95_s": stats["p95_s"],
            "timed_steps": stats["steps"],
            "test_accuracy": epochs[-1]["test_accuracy"],
            "final_loss": epochs[-1]["train_loss"],
            "step_losses": mean_edges([p["losses"] for p in summary]),
            "peak_memory_bytes": [p["peak_memory"] for p in summary],
            "peak_reserved_bytes": [(p["reserved"] or {}).get("peak") for p in summary],
            "reserved_bytes": [(p["reserved"] or {}).get("end") for p in summary],
            "held_bytes": [p["held"] for p in summary],
            # Replicated strategies: the ranks' parameters after training, digested; equal
            # digests show the replicas agree (None where a rank holds one stage).
            "parameter_digests": [p["digest"] for p in summary],
            "batch_semantics": strategy.batch_semantics(),
            "lr_used": strategy.lr(),
            "forward_dtype": strategy.forward_dtype,
            "startup_s": slowest["total"],
            "startup_phases_s": {k: slowest[k] for k in STARTUP_PHASES},
            **({"collective_alone": probe} if probe else {}),
            **(compile_figures(summary) if cfg.compile else {}),
            "step_parts": step_parts.record(strategy, [p["parts"] for p in summary],
                                            [p["step_times"] for p in summary]),
            **(ckpt.figures(loop_s) if cfg.checkpoint_every else {}),
            **figures,
        },
        epochs=epochs,
        step_times_s=[round(t, 7) for t in step_times],
        manifest=manifest.collect(hosts, results.run_dir(cfg.results_dir, cfg.run_id)))
    return record


def compile_figures(summary: list[dict]) -> dict:
    """--compile's figures: the compiler's seconds on the slowest rank (the job's steps wait
    for it), each rank's, and rank 0's steps in which it ran (their wall time, compiling
    included)."""
    per_rank = [round(p["compile_s"], 3) for p in summary]
    return {"compile_s": max(per_rank), "compile_s_per_rank": per_rank,
            "compile_steps": summary[0]["compile_steps"]}


def edge_losses(first, last) -> dict | None:
    """A rank's losses of its launch's first and last EDGE_STEPS steps, as floats; None
    where it computed none (a pipeline's stages before the last)."""
    if not first:
        return None
    return {"first": [float(x) for x in first], "last": [float(x) for x in last]}


def mean_edges(parts: list) -> dict | None:
    """figures.step_losses: each edge step's loss averaged over the ranks that computed one."""
    have = [p for p in parts if p]
    if not have:
        return None
    return {k: [sum(p[k][i] for p in have) / len(have) for i in range(len(have[0][k]))]
            for k in ("first", "last")}


def start_heartbeat(cfg, rank):
    """This rank's heartbeat in <run>/heartbeats/<attempt>/ (NoHeartbeat when that
    folder cannot be written: the run goes on, unwatched)."""
    from lab.worker.heartbeat import Heartbeat
    try:
        return Heartbeat(results.run_dir(cfg.results_dir, cfg.run_id), cfg.attempt, rank, cfg.stall_s,
                         cfg.launched_at)
    except OSError:
        return NoHeartbeat()


def failure_path(cfg, rank) -> str:
    return os.path.join(results.run_dir(cfg.results_dir, cfg.run_id), "failures",
                        cfg.attempt or "manual", f"rank-{rank}.json")


# Where a rank learns its rank before any framework starts (its heartbeat and failure
# file are named by it), most specific first: horovodrun; Open MPI's mpirun; a PMIx
# (`srun --mpi=pmix`) or PMI launch; torch.distributed.run; last, the srun task, which is
# the rank only where srun starts the ranks themselves (under torchrun RANK came first).
RANK_VARIABLES = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "RANK",
                  "SLURM_PROCID")


def _rank_from_env(env=None) -> int:
    env = os.environ if env is None else env
    for var in RANK_VARIABLES:
        if str(env.get(var, "")).isdigit():
            return int(env[var])
    return 0


def main(argv=None) -> int:
    cfg = parse_args(argv)
    cfg.restart = restarts.of_launch(cfg.restart)     # bench's relaunch, or torchrun's restart
    rank = _rank_from_env()
    d = None
    hb = NoHeartbeat()
    try:
        cfg.check()
        hb = start_heartbeat(cfg, rank)
        import torch  # noqa: F401 - timed apart from the framework's start

        if cfg.compile:
            compiled.load()             # the compiler first: lean's shortcut is for runs without it
        else:
            lean.skip_compiler_import()     # nothing compiles: torch._dynamo stays unimported
        MARKS["torch"] = time.time()
        from lab.worker import dist
        from lab.worker.heartbeat import rendezvous_detail
        hb.beat("rendezvous", **rendezvous_detail(cfg.framework, cfg.backend))
        d = dist.create(cfg)
        MARKS["group"] = time.time()
        rank = d.rank
        hb.beat("setup")
        record = train(cfg, d, hb=hb)
        if record is not None:
            path = results.run_dir(cfg.results_dir, cfg.run_id) / results.RESULTS_FILE
            results.append_record(path, record)
            f = record["figures"]
            print(f"rank 0: {f['throughput_img_s']:,.0f} images/s, step "
                  f"{f['step_time_mean_s'] * 1000:.2f} ms, accuracy "
                  f"{_accuracy_text(cfg, f['test_accuracy'])}; "
                  f"recorded in {path}", flush=True)
        d.shutdown()
        hb.close()
        if d.finalizes_at_exit:
            return 0
        # Leave without the interpreter's teardown: the record is written and fsynced and
        # the group destroyed, and what native libraries' static destructors do at exit
        # (Gloo's and DeepSpeed's threads) once aborted a rank that had finished
        # ("terminate called without an active exception", SIGABRT, in CI).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except BaseException as e:  # noqa: BLE001 - every failure is recorded, then the rank exits
        import socket
        reason = f"{type(e).__name__}: {e}" if not isinstance(e, ConfigError) else str(e)
        if isinstance(e, KeyboardInterrupt):
            reason = "interrupted"
        info = {"rank": rank, "host": socket.gethostname(), "reason": reason,
                "time": results.now_iso(), "t": time.time(),
                "traceback": "" if isinstance(e, ConfigError) else traceback.format_exc()}
        try:
            path = failure_path(cfg, rank)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                json.dump(info, f)
        except OSError:
            pass
        hb.close("failed")
        print(f"rank {rank} on {info['host']} failed: {reason}", file=sys.stderr, flush=True)
        # Leave at once: a clean shutdown could wait forever on peers that are gone.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2 if isinstance(e, ConfigError) else 1)


if __name__ == "__main__":
    sys.exit(main())
