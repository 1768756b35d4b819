"""Statistics of repeated runs: the median, its spread (min-max below BOOTSTRAP_FROM
repeats, a 95% bootstrap interval from there), the speedup of two medians with an
interval carried through, and the mark for a row whose repeats disagree. Standard
library only; every random draw comes from a seeded generator, so a table is the same
each time it is made from the same records."""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

BOOTSTRAP_FROM = 5      # repeats from which the interval is a bootstrap one
LEVEL = 0.95            # the bootstrap interval's coverage
RESAMPLES = 2000        # bootstrap resamples
SEED = 0                # the generator's seed: same records, same table
NOISY = 0.10            # (max - min) / median above this marks a row as noisy


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    low: float
    high: float
    kind: str            # "single run", "min-max" or "95% bootstrap"

    @property
    def relative_spread(self) -> float:
        return (self.high - self.low) / self.median if self.median else 0.0

    def overlaps(self, other: "Summary") -> bool:
        return self.low <= other.high and other.low <= self.high


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap(values: list[float], stat=statistics.median, level: float = LEVEL,
              resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float]:
    """The percentile bootstrap interval of `stat` over `values`."""
    if not values:
        raise ValueError("no values")
    rng = random.Random(seed)
    n = len(values)
    draws = sorted(stat([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    tail = (1 - level) / 2
    return _quantile(draws, tail), _quantile(draws, 1 - tail)


def summarize(values: list[float], seed: int = SEED) -> Summary:
    """The median of the repeats and their spread."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no values to summarize")
    med = statistics.median(values)
    if len(values) == 1:
        return Summary(1, med, med, med, "single run")
    if len(values) < BOOTSTRAP_FROM:
        return Summary(len(values), med, min(values), max(values), "min-max")
    lo, hi = bootstrap(values, seed=seed)
    return Summary(len(values), med, lo, hi, "95% bootstrap")


def ratio(numerator: list[float], denominator: list[float], seed: int = SEED) -> Summary:
    """The ratio of two medians (a speedup: throughput at np over throughput at 1) with
    an interval carried through: below BOOTSTRAP_FROM repeats on either side, the
    extremes (min / max to max / min: every ratio the repeats allow); from there, a
    bootstrap of the ratio, both samples drawn independently."""
    num, den = [float(v) for v in numerator], [float(v) for v in denominator]
    if not num or not den or min(den) <= 0:
        raise ValueError("a ratio needs values on both sides and a positive denominator")
    med = statistics.median(num) / statistics.median(den)
    if len(num) == 1 and len(den) == 1:
        return Summary(1, med, med, med, "single run")
    if min(len(num), len(den)) < BOOTSTRAP_FROM:
        return Summary(min(len(num), len(den)), med, min(num) / max(den), max(num) / min(den),
                       "min-max")
    rng = random.Random(seed)
    draws = []
    for _ in range(RESAMPLES):
        a = statistics.median([num[rng.randrange(len(num))] for _ in num])
        b = statistics.median([den[rng.randrange(len(den))] for _ in den])
        draws.append(a / b)
    draws.sort()
    tail = (1 - LEVEL) / 2
    return Summary(min(len(num), len(den)), med, _quantile(draws, tail),
                   _quantile(draws, 1 - tail), "95% bootstrap")


def repeats_to_separate(a: list[float], b: list[float], z: float = 1.96, power: float = 0.8) -> int | None:
    """About how many repeats of each of two configurations would tell their medians
    apart, with probability `power`, at the difference and spread their repeats show: the n
    at which the difference, d, is (z + z_power) standard errors of a difference,
    d = (z + z_power) * s * sqrt(2 / n), with s the pooled standard deviation (a normal
    approximation: at z alone the chance would be one half; the median needs about pi/2
    times as many as the mean, Kendall & Stuart's asymptotic efficiency of the median).
    None with fewer than 2 repeats on a side or no difference."""
    if len(a) < 2 or len(b) < 2:
        return None
    d = abs(statistics.median(a) - statistics.median(b))
    if d == 0:
        return None
    pooled = ((len(a) - 1) * statistics.variance(a) + (len(b) - 1) * statistics.variance(b)) / (
        len(a) + len(b) - 2)
    import math
    zp = statistics.NormalDist().inv_cdf(power)
    return max(2, math.ceil(math.pi / 2 * 2 * ((z + zp) * math.sqrt(pooled) / d) ** 2))


def fewest_to_separate(level: float = LEVEL) -> int:
    """The fewest repeats whose interval can leave out the most extreme run, so that two
    overlapping rows can come apart by running more: below BOOTSTRAP_FROM the interval is
    the runs' range, and from there a resampled median equals the lowest of n distinct runs
    when at least n//2 + 1 of its n draws are that run (odd n: (n + 1) // 2), a binomial
    tail of p = 1/n; while that is above the interval's tail, (1 - level) / 2, the
    interval is still the whole range, which more runs only widen (n = 5: 5.8%; n = 6:
    0.9%, the answer at 95%)."""
    import math
    n = BOOTSTRAP_FROM
    while True:
        k = n // 2 + 1 if n % 2 == 0 else (n + 1) // 2
        tail = sum(math.comb(n, j) * (1 / n) ** j * (1 - 1 / n) ** (n - j) for j in range(k, n + 1))
        if tail < (1 - level) / 2:
            return n
        n += 1


def noisy(values: list[float], threshold: float = NOISY) -> bool:
    """Whether repeats differ by more than `threshold` of their median."""
    if len(values) < 2:
        return False
    med = statistics.median(values)
    return med > 0 and (max(values) - min(values)) / med > threshold


def interleaved(combinations: list, repeats: int) -> list[tuple[int, object]]:
    """(repeat index, combination) in the order a sweep runs them: every combination
    once, then every one again, so that a drift of the machine's speed falls on all of
    them alike rather than on the ones that happened to run last."""
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    return [(r, c) for r in range(repeats) for c in combinations]
