"""`python -m lab.worker.ceiling`: the compute ceiling of one process — the model's training
steps on batches already in memory, with no framework and no data pipeline. A run's
throughput is judged against it: np=1 should come close, np=N should approach N times it
when each rank has its own cores or GPU."""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

# How long the ceiling is timed, the one place the rule is written: after the warm-up,
# steps are timed until at least the model's minimum of steps (lab.models: its spec's
# ceiling_steps) AND at least MIN_SECONDS of timed steps are done, and never more than
# MAX_STEPS. A count alone is either unstable or endless: a ResNet-50 step lasts
# seconds on a CPU and milliseconds on a GPU. The result is the median step (robust to
# a step the machine stole) with the spread of the steps around it.
MIN_SECONDS = 10.0
MAX_STEPS = 100_000


def time_steps(step, min_steps: int, min_seconds: float = MIN_SECONDS,
               max_steps: int = MAX_STEPS, clock=time.perf_counter) -> list[float]:
    """Run step() and time each call until the rule above is met; the times, in order."""
    times: list[float] = []
    total = 0.0
    while len(times) < max_steps and (len(times) < min_steps or total < min_seconds):
        t0 = clock()
        step()
        times.append(clock() - t0)
        total += times[-1]
    return times


def summarize(times: list[float], batch_size: int) -> dict:
    """The median step, its images per second, and the spread: the 10th and 90th
    percentiles of the steps and their distance relative to the median."""
    from lab.common.metrics import percentile
    median = percentile(times, 50)
    p10, p90 = percentile(times, 10), percentile(times, 90)
    return {"steps": len(times), "timed_s": sum(times), "step_time_median_s": median,
            "step_time_p10_s": p10, "step_time_p90_s": p90,
            "spread": (p90 - p10) / median if median else None,
            "images_per_s": batch_size / median}


def measure(model_name: str = "mnist", batch_size: int = 64, threads: int = 1, steps: int = 200,
            warmup: int = 10, device: str = "cpu", seed: int = 0, data_name: str = "synthetic",
            min_seconds: float = MIN_SECONDS, precision_name: str = "fp32") -> dict:
    """The model's training steps on random batches of the input the run trains on: the
    data set's shape and classes (MNIST and the digits: 1x28x28, 10), or on synthetic
    data the model's own (lab.models: the spec's input), at the run's --precision as a
    rank of the ddp strategy takes it (lab.worker.precision: autocast, fp16's scaler,
    TF32, channels-last)."""
    import torch

    from lab import models as specs
    from lab.worker import data, models, precision

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    dev = torch.device(device)
    precision.set_math(precision_name, dev)
    last = precision.channels_last(precision_name, dev, model_name)
    scaler = precision.scaler(precision_name, dev)
    channels, size, classes = specs.get(model_name).input(data_name)
    ds = data.synthetic(channels, size, classes, batch_size * 4, 1, seed=seed)
    x, y = ds.train.to(dev).take(slice(None))
    x = precision.to_layout(x, last)
    n_batches = len(y) // batch_size
    model, loss_fn = models.build(model_name, ds.channels, ds.size, ds.classes)
    if last:
        model = model.to(memory_format=torch.channels_last)
    model.to(dev).train()
    # the model's own optimizer (its spec), as its run steps it
    if specs.get(model_name).optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    i = 0
    dtypes: set[str] = set()     # the dtype its layers computed in: what the precision made of it

    def step():
        nonlocal i
        j = i % n_batches
        i += 1
        opt.zero_grad(set_to_none=True)
        with precision.autocast(precision_name, dev):
            # the first step's layers watched (the hooks gone before the timed steps)
            with precision.layer_dtypes(model) if i == 1 else contextlib.nullcontext(None) as seen:
                out = model(x[j * batch_size:(j + 1) * batch_size])
            loss = loss_fn(out, y[j * batch_size:(j + 1) * batch_size])
        if seen is not None:
            dtypes.add(precision.forward_dtype(seen, out))
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    for _ in range(warmup):
        step()
    times = time_steps(step, steps, min_seconds)
    return {"model": model_name, "input": [channels, size, size], "classes": classes,
            "batch_size": batch_size, "threads": threads, "device": device, "precision": precision_name,
            "forward_dtypes": sorted(dtypes),
            "min_steps": steps, "min_seconds": min_seconds,
            "step_time_mean_s": sum(times) / len(times), **summarize(times, batch_size)}


def child_env(index: int, threads: int, device: str, base: dict) -> dict:
    """The environment of the index-th process of a concurrent measurement: its thread
    count, and on GPUs a GPU of its own, as a rank has (the index-th of the visible ones:
    CUDA_VISIBLE_DEVICES when set, else every GPU by number), so that N processes are not
    N shares of GPU 0."""
    env = dict(base, OMP_NUM_THREADS=str(threads))
    if device == "cuda":
        visible = [d for d in base.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        env["CUDA_VISIBLE_DEVICES"] = visible[index % len(visible)] if visible else str(index)
    return env


def measure_concurrent(processes: int, model_name: str = "mnist", batch_size: int = 64,
                       threads: int = 1, steps: int = 200, warmup: int = 10,
                       device: str = "cpu", timeout_s: float = 3600,
                       data_name: str = "synthetic", min_seconds: float = MIN_SECONDS,
                       precision_name: str = "fp32") -> dict:
    """The same measurement in `processes` independent processes at once: what the machine
    gives N ranks that never communicate (shared cores, memory bandwidth, caches). When
    one fails or the time runs out, the others are stopped."""
    import os

    from lab.common import proc
    # Each process is this module measuring in itself, so torch is set up afresh in each.
    cmd = [sys.executable, "-m", "lab.worker.ceiling", "--model", model_name, "--batch-size",
           str(batch_size), "--threads", str(threads), "--steps", str(steps), "--warmup",
           str(warmup), "--device", device, "--data", data_name, "--min-seconds", str(min_seconds),
           "--precision", precision_name]
    procs = [proc.start(cmd, env=child_env(i, threads, device, os.environ), merge=False)
             for i in range(processes)]
    deadline = time.monotonic() + timeout_s
    outs = []
    try:
        for p in procs:
            res = p.wait(max(0.1, deadline - time.monotonic()))
            if not res.ok:
                raise RuntimeError(res.describe() if res.timed_out else
                                   (res.stderr.strip().splitlines() or ["no output"])[-1])
            outs.append(json.loads(res.stdout))
    finally:
        for p in procs:
            p.stop(grace=1.0)
    return {"processes": processes, "images_per_s": sum(o["images_per_s"] for o in outs),
            "per_process": [o["images_per_s"] for o in outs],
            "spread": [o["spread"] for o in outs], "steps": [o["steps"] for o in outs],
            "input": outs[0]["input"],
            "classes": outs[0]["classes"], "precision": precision_name}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.worker.ceiling", description=__doc__.split("\n\n")[0])
    from lab import models
    from lab.common.config import DATASETS, PRECISIONS
    p.add_argument("--model", default="mnist", choices=models.names())
    p.add_argument("--data", default="synthetic", choices=DATASETS,
                   help="the run's data set: its input shape and classes are measured")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=200, help="the fewest steps timed")
    p.add_argument("--min-seconds", type=float, default=MIN_SECONDS,
                   help="the fewest seconds of steps timed (the rule: lab.worker.ceiling)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="the run's --precision (lab.worker.precision)")
    p.add_argument("--processes", type=int, default=0,
                   help="run this many independent processes at once, each with OMP_NUM_THREADS "
                        "set to --threads, and sum them (0: measure in this process)")
    a = p.parse_args(argv)
    if a.processes:
        out = measure_concurrent(a.processes, a.model, a.batch_size, a.threads, a.steps,
                                 a.warmup, a.device, data_name=a.data, min_seconds=a.min_seconds,
                                 precision_name=a.precision)
    else:
        out = measure(a.model, a.batch_size, a.threads, a.steps, a.warmup, a.device,
                      data_name=a.data, min_seconds=a.min_seconds, precision_name=a.precision)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
