"""The compute ceiling around a run (bench --ceiling): the model's own steps on the run's
own input at its --precision with no framework (lab.worker.ceiling) in as many independent
processes as the run has ranks, placed where its ranks run (each node or server its share, all at once),
just before and just after the run. The result goes into the run's record
(figures.ceiling), so a table shows every run against its own ceiling."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from lab import models
from lab.host.errors import BenchError
from lab.host.places.base import Runner, RunnerError
from lab.host.settings import BenchSettings
from lab.worker.ceiling import MIN_SECONDS  # the timing rule (standard library at import)


def command(s: BenchSettings, processes: int, python: str) -> list[str]:
    steps, warmup = models.get(s.model).ceiling_steps
    return [python, "-m", "lab.worker.ceiling", "--processes", str(processes), "--model", s.model,
            "--data", s.data, "--batch-size", str(s.batch_size), "--threads", str(s.threads),
            "--device", s.device, "--steps", str(steps), "--warmup", str(warmup),
            "--min-seconds", str(MIN_SECONDS), "--precision", s.precision]


def _parse(rc, out, where=""):
    try:
        if rc != 0:
            raise ValueError
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise BenchError(f"measuring the compute ceiling{where} failed: "
                         f"{(out.strip().splitlines() or ['no output'])[-1]}") from None


def measure(s: BenchSettings, processes: int, runner: Runner) -> dict:
    """One measurement: on every host of the run's placement at once (the runner's
    placement(np): this machine or the image alone, each cluster node, each server)."""
    placement = runner.placement(processes)
    limit = s.timeout_s or 3600
    try:
        with ThreadPoolExecutor(len(placement)) as pool:
            outs = list(pool.map(lambda h: runner.output_on(h, command(s, placement[h], runner.python),
                                                            limit), placement))
    except RunnerError as e:
        raise BenchError(str(e)) from None
    per_host = {h: _parse(rc, out, f" on {h}" if h else "") for h, (rc, out) in zip(placement, outs)}
    first = next(iter(per_host.values()))
    return {"processes": processes, "images_per_s": sum(m["images_per_s"] for m in per_host.values()),
            "per_process": [v for m in per_host.values() for v in m["per_process"]],
            "spread": [v for m in per_host.values() for v in m.get("spread", [])],
            "per_host": {h: m["images_per_s"] for h, m in per_host.items() if h},
            "input": first.get("input"), "classes": first.get("classes"),
            "precision": first.get("precision", "fp32")}


def around(s: BenchSettings, processes: int, before: dict, runner: Runner) -> dict:
    """The ceiling measured just before and just after a run, averaged: a shared
    machine's speed drifts, and the run lies between the two."""
    after = measure(s, processes, runner)
    b, a = before["images_per_s"], after["images_per_s"]
    return {"processes": processes, "images_per_s": (a + b) / 2, "before": b, "after": a,
            "spread": {"before": before.get("spread"), "after": after.get("spread")},
            "hosts": list(after["per_host"]), "input": after["input"], "classes": after["classes"],
            "precision": after.get("precision")}
