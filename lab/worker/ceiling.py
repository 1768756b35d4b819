"""`python -m lab.worker.ceiling`: the compute ceiling of one process — the model's training
steps on batches already in memory, with no framework and no data pipeline. A run's
throughput is judged against it: np=1 should come close, np=N should approach N times it
when each rank has its own cores or GPU."""
from __future__ import annotations

import argparse
import json
import sys
import time


def measure(model_name: str = "mnist", batch_size: int = 64, threads: int = 1, steps: int = 200,
            warmup: int = 10, device: str = "cpu", seed: int = 0, data_name: str = "synthetic") -> dict:
    """The model's training steps on random batches of the input the run trains on: the
    data set's shape and classes (MNIST and the digits: 1x28x28, 10), or on synthetic
    data the model's own (lab.models: the spec's input)."""
    import torch

    from lab import models as specs
    from lab.worker import data, models

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    dev = torch.device(device)
    channels, size, classes = specs.get(model_name).input(data_name)
    ds = data.synthetic(channels, size, classes, batch_size * 4, 1, seed=seed)
    x, y = ds.train.to(dev).take(slice(None))
    n_batches = len(y) // batch_size
    model, loss_fn = models.build(model_name, ds.channels, ds.size, ds.classes)
    model.to(dev).train()
    # the model's own optimizer (its spec), as its run steps it
    if specs.get(model_name).optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    times = []
    for i in range(warmup + steps):
        j = i % n_batches
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x[j * batch_size:(j + 1) * batch_size]),
                y[j * batch_size:(j + 1) * batch_size]).backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return {"model": model_name, "input": [channels, size, size], "classes": classes,
            "batch_size": batch_size, "threads": threads, "device": device, "steps": steps, "step_time_mean_s": sum(times) / len(times),
            "images_per_s": batch_size * len(times) / sum(times)}


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
                       data_name: str = "synthetic") -> dict:
    """The same measurement in `processes` independent processes at once: what the machine
    gives N ranks that never communicate (shared cores, memory bandwidth, caches). When
    one fails or the time runs out, the others are stopped."""
    import os

    from lab.common import proc
    # Each process is this module measuring in itself, so torch is set up afresh in each.
    cmd = [sys.executable, "-m", "lab.worker.ceiling", "--model", model_name, "--batch-size",
           str(batch_size), "--threads", str(threads), "--steps", str(steps), "--warmup",
           str(warmup), "--device", device, "--data", data_name]
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
            "per_process": [o["images_per_s"] for o in outs], "input": outs[0]["input"],
            "classes": outs[0]["classes"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.worker.ceiling", description=__doc__.split("\n\n")[0])
    from lab import models
    from lab.common.config import DATASETS
    p.add_argument("--model", default="mnist", choices=models.names())
    p.add_argument("--data", default="synthetic", choices=DATASETS,
                   help="the run's data set: its input shape and classes are measured")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--processes", type=int, default=0,
                   help="run this many independent processes at once, each with OMP_NUM_THREADS "
                        "set to --threads, and sum them (0: measure in this process)")
    a = p.parse_args(argv)
    if a.processes:
        out = measure_concurrent(a.processes, a.model, a.batch_size, a.threads, a.steps,
                                 a.warmup, a.device, data_name=a.data)
    else:
        out = measure(a.model, a.batch_size, a.threads, a.steps, a.warmup, a.device,
                      data_name=a.data)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
