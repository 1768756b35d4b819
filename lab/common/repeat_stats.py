"""Statistics `--repeat auto` decides with (lab.host.run.repeat_auto): whether two configurations'
mean throughputs differ, by the Welch t interval of their difference, which holds its
coverage at any number of repeats from 2 when the runs' noise is normal (Welch 1947); the
level corrected for repeated looks (Bonferroni: each of K looks at alpha / K, so that the
chance of calling two equal configurations apart in any look is at most alpha); and the
repeats each would need for a power of 80% at the spread measured. Standard library only:
Student's t from the regularized incomplete beta function (Numerical Recipes' continued
fraction)."""
from __future__ import annotations

import math
import statistics

ALPHA = 0.05        # the chance, over all looks, of calling two equal configurations apart
POWER = 0.80        # the chance of telling apart a difference as large as the one measured


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1 + aa * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-14:
            break
    return h


def _ibeta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _ibeta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


def t_pdf(t: float, df: float) -> float:
    return math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
                    - (df + 1) / 2 * math.log1p(t * t / df))


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (0 < p < 1): Newton's method from the normal quantile, which
    lies below it; the t CDF is concave above 0, so the steps approach from below."""
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1 - p, df)
    x = statistics.NormalDist().inv_cdf(p)
    for _ in range(100):
        step = (p - t_cdf(x, df)) / t_pdf(x, df)
        x += step
        if abs(step) < 1e-12 * max(1.0, x):
            break
    return x


def t_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """The t interval of the mean: mean +- t(level, n-1) x s / sqrt(n) (n >= 2)."""
    n = len(values)
    m, s = statistics.fmean(values), statistics.stdev(values)
    half = t_quantile(1 - (1 - level) / 2, n - 1) * s / math.sqrt(n)
    return m - half, m + half


def difference(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float]:
    """Welch's interval of mean(a) - mean(b) (2 or more values on each side)."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    d = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:
        return d, d
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(1 - (1 - level) / 2, df) * math.sqrt(va + vb)
    return d - half, d + half


def look_alpha(looks: int, alpha: float = ALPHA) -> float:
    """Each look's level when `looks` looks share alpha (Bonferroni)."""
    return alpha / max(1, looks)


def apart(a: list[float], b: list[float], alpha: float) -> bool:
    """Whether the (1 - alpha) interval of the difference of the means leaves out 0."""
    if len(a) < 2 or len(b) < 2:
        return False
    lo, hi = difference(a, b, 1 - alpha)
    return lo > 0 or hi < 0


def repeats_needed(a: list[float], b: list[float], alpha: float = ALPHA, power: float = POWER,
                   most: int = 10_000) -> int | None:
    """The repeats of each that a two-sided t test at `alpha` needs to tell apart, with
    probability `power`, a difference of the means as large as the one measured at the
    pooled spread measured: the least n with t(1 - alpha/2, 2n-2) + t(power, 2n-2) <=
    d / (s sqrt(2/n)). None with fewer than 2 values on a side or no difference."""
    if len(a) < 2 or len(b) < 2:
        return None
    d = abs(statistics.fmean(a) - statistics.fmean(b))
    if d == 0:
        return None
    s = math.sqrt(((len(a) - 1) * statistics.variance(a) + (len(b) - 1) * statistics.variance(b))
                  / (len(a) + len(b) - 2))
    if s == 0:
        return 2
    for n in range(2, most + 1):
        df = 2 * n - 2
        if t_quantile(1 - alpha / 2, df) + t_quantile(power, df) <= d / (s * math.sqrt(2 / n)):
            return n
    return most
