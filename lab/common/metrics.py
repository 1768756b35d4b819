"""The arithmetic of the figures: step-time statistics, throughput, speedup, efficiency."""
from __future__ import annotations

import statistics


def percentile(values, q: int) -> float:
    """The q-th percentile (a whole number 0..100) with linear interpolation between
    closest ranks: statistics.quantiles' "inclusive" method, numpy's default."""
    if not values:
        raise ValueError("percentile of no values")
    if q not in range(101):
        raise ValueError("q is a whole number in 0..100")
    if q in (0, 100) or len(values) == 1:
        return max(values) if q == 100 else min(values) if q == 0 else values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def step_stats(step_times: list[float]) -> dict:
    """Mean, median and 95th percentile of the timed steps, in seconds."""
    if not step_times:
        raise ValueError("no timed steps: run more steps than --warmup-steps")
    return {
        "steps": len(step_times),
        "mean_s": sum(step_times) / len(step_times),
        "p50_s": percentile(step_times, 50),
        "p95_s": percentile(step_times, 95),
    }


def global_throughput(images_per_rank_step: int, world: int, rank_seconds: list[float],
                      steps: int) -> float:
    """Images per second over all ranks. Every rank takes the same steps; the slowest
    rank's timed seconds bound the job, so that is the time used."""
    if steps <= 0:
        raise ValueError("no timed steps")
    slowest = max(rank_seconds)
    if slowest <= 0:
        raise ValueError("timed seconds must be positive")
    return images_per_rank_step * world * steps / slowest


def speedup(throughput: float, baseline_throughput: float) -> float:
    """Throughput relative to the one-process run of the same configuration."""
    if baseline_throughput <= 0:
        raise ValueError("baseline throughput must be positive")
    return throughput / baseline_throughput


def efficiency(speedup_value: float, workers: int) -> float:
    """Speedup divided by the number of workers: 1.0 is perfect scaling."""
    if workers < 1:
        raise ValueError("workers must be at least 1")
    return speedup_value / workers
