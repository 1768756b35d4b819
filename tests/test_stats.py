"""The statistics of repeated runs, on fixed numbers (computed by hand or by the
definitions, not copied from the code's output)."""
import statistics

import pytest

from lab.common import stats


def test_a_single_run_is_its_own_interval():
    s = stats.summarize([4400.0])
    assert (s.n, s.median, s.low, s.high, s.kind) == (1, 4400.0, 4400.0, 4400.0, "single run")


def test_below_five_repeats_the_spread_is_min_max():
    s = stats.summarize([10.0, 12.0, 11.0])
    assert (s.median, s.low, s.high, s.kind) == (11.0, 10.0, 12.0, "min-max")
    assert s.relative_spread == pytest.approx(2 / 11)
    assert stats.summarize([1.0, 2.0, 3.0, 10.0]).median == 2.5     # even count: mean of middle two


def test_from_five_repeats_a_seeded_bootstrap_interval():
    values = [100.0, 102.0, 98.0, 101.0, 99.0, 130.0]
    s = stats.summarize(values)
    assert s.kind == "95% bootstrap" and s.median == 100.5
    # Inside the data's range, around the median, and the same every time (seeded).
    assert min(values) <= s.low <= s.median <= s.high <= max(values)
    assert stats.summarize(values) == s
    # A median's bootstrap ignores the outlier more than min-max would.
    assert s.high < 130.0
    # The seed is really used: with few resamples, two seeds draw different intervals.
    assert stats.bootstrap(values, resamples=20, seed=1) != stats.bootstrap(values, resamples=20, seed=2)


def test_bootstrap_of_identical_values_is_a_point():
    assert stats.bootstrap([5.0] * 6) == (5.0, 5.0)


def test_bootstrap_interval_covers_the_median_of_a_known_sample():
    # 41 values 0..40: the median is 20, and its 95% interval is a few units either side.
    lo, hi = stats.bootstrap([float(v) for v in range(41)])
    assert 12 <= lo < 20 < hi <= 28


def test_speedup_interval_with_few_repeats_is_every_ratio_the_runs_allow():
    np2, np1 = [180.0, 200.0, 190.0], [100.0, 110.0, 105.0]
    s = stats.ratio(np2, np1)
    assert s.median == pytest.approx(190 / 105)
    assert s.low == pytest.approx(180 / 110) and s.high == pytest.approx(200 / 100)
    assert s.kind == "min-max"


def test_speedup_interval_from_five_repeats_is_a_bootstrap_of_the_ratio():
    np2 = [190.0, 200.0, 195.0, 205.0, 198.0]
    np1 = [100.0, 104.0, 98.0, 101.0, 99.0]
    s = stats.ratio(np2, np1)
    assert s.kind == "95% bootstrap"
    assert s.median == pytest.approx(statistics.median(np2) / statistics.median(np1))
    assert 190 / 104 <= s.low <= s.median <= s.high <= 205 / 98


def test_ratio_refuses_a_zero_baseline():
    with pytest.raises(ValueError):
        stats.ratio([1.0], [0.0])


def test_noisy_rows_differ_by_more_than_ten_percent():
    assert not stats.noisy([100.0, 105.0, 109.0])          # 9% of 105
    assert stats.noisy([100.0, 105.0, 112.0])              # 12% of 105
    assert not stats.noisy([100.0])


def test_intervals_that_overlap_are_no_difference():
    a, b, c = stats.summarize([1.0, 1.2]), stats.summarize([1.1, 1.3]), stats.summarize([1.4, 1.5])
    assert a.overlaps(b) and b.overlaps(a) and not a.overlaps(c)


def test_interleaving_runs_every_combination_before_any_again():
    order = stats.interleaved(["a", "b", "c"], 2)
    assert order == [(0, "a"), (0, "b"), (0, "c"), (1, "a"), (1, "b"), (1, "c")]
    with pytest.raises(ValueError):
        stats.interleaved(["a"], 0)


def test_repeats_needed_to_separate_two_configurations():
    import math
    import random
    zz = 1.96 + statistics.NormalDist().inv_cdf(0.8)      # 80% power at 5%
    # medians 100 and 104, pooled standard deviation 2: n = pi/2 * 2 * (2.80 * 2 / 4)^2 = 6.2 -> 7
    a, b = [98.0, 100.0, 102.0], [102.0, 104.0, 106.0]
    assert stats.repeats_to_separate(a, b) == math.ceil(math.pi * (zz * 2 / 4) ** 2) == 7
    # twice the spread needs four times the repeats; half the difference too
    wide = stats.repeats_to_separate([96.0, 100.0, 104.0], [100.0, 104.0, 108.0])
    assert wide == math.ceil(math.pi * (zz * 4 / 4) ** 2)
    assert stats.repeats_to_separate(a, [b[0] - 2, b[1] - 2, b[2] - 2]) == math.ceil(math.pi * (zz * 2 / 2) ** 2)
    assert stats.repeats_to_separate([1.0], b) is None and stats.repeats_to_separate(a, a) is None
    # and the claim holds by simulation: with that many repeats of two normal samples, the
    # medians' 95% intervals of a difference (z = 1.96 standard errors, the median's
    # standard error sqrt(pi/2) times the mean's) leave out 0 in about 80% of draws
    rng = random.Random(1)
    n = stats.repeats_to_separate([96.0, 100.0, 104.0], [100.0, 104.0, 108.0])
    se = math.sqrt(math.pi / 2 * 2 * 16 / n)
    apart = sum(statistics.median(rng.gauss(104, 4) for _ in range(n))
                - statistics.median(rng.gauss(100, 4) for _ in range(n)) > 1.96 * se for _ in range(2000))
    assert abs(apart / 2000 - 0.8) <= 0.05
