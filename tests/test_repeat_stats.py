"""The statistics `--repeat auto` decides with (lab.common.repeat_stats), checked by
simulation with a fixed seed: draws from known distributions, the intervals' coverage
within 3 points of nominal at 3 repeats, the error of the repeated looks, the power of the
repeats it says are needed."""
import math
import random
import statistics

import pytest

from lab.common import repeat_stats as rs
from lab.host.run import repeat_auto

TRIALS = 4000


def test_students_t_is_the_tables():
    # two-sided 95% critical values from any table of Student's t
    for df, t in ((1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (30, 2.042)):
        assert rs.t_quantile(0.975, df) == pytest.approx(t, abs=5e-4)
    assert rs.t_cdf(0.0, 5) == 0.5 and rs.t_quantile(0.025, 4) == pytest.approx(-2.776, abs=5e-4)


def test_the_t_interval_holds_95_percent_at_3_repeats_where_the_range_holds_75():
    rng = random.Random(20261126)
    t_hits = range_hits = 0
    for _ in range(TRIALS):
        x = [rng.gauss(100.0, 5.0) for _ in range(3)]
        lo, hi = rs.t_interval(x, 0.95)
        t_hits += lo <= 100.0 <= hi
        range_hits += min(x) <= 100.0 <= max(x)
    assert abs(t_hits / TRIALS - 0.95) <= 0.03
    # the interval the tables use below 5 repeats, the runs' range: 1 - 2 / 2^3 = 75%
    assert abs(range_hits / TRIALS - 0.75) <= 0.03


@pytest.mark.parametrize("sd_b", [2.0, 8.0])
def test_welchs_interval_of_a_difference_holds_its_coverage_at_3_repeats(sd_b):
    rng = random.Random(7)
    hits = 0
    for _ in range(TRIALS):
        a = [rng.gauss(100.0, 4.0) for _ in range(3)]
        b = [rng.gauss(95.0, sd_b) for _ in range(3)]
        lo, hi = rs.difference(a, b, 0.95)
        hits += lo <= 5.0 <= hi
    assert abs(hits / TRIALS - 0.95) <= 0.03


def test_repeated_looks_call_two_equal_configurations_apart_at_most_5_percent():
    """--repeat auto's rule on two configurations that perform the same: a look at 3
    repeats, then one more repeat of each and another look, up to 10 (8 looks at 5%/8)."""
    rng = random.Random(11)
    most, trials, wrong, wrong_uncorrected = 10, 1000, 0, 0
    alpha = rs.look_alpha(repeat_auto.looks(most))
    assert repeat_auto.looks(most) == 8 and alpha == pytest.approx(0.05 / 8)
    for _ in range(trials):
        a = [rng.gauss(100.0, 5.0) for _ in range(3)]
        b = [rng.gauss(100.0, 5.0) for _ in range(3)]
        called = naive = False
        while True:
            called = called or rs.apart(a, b, alpha)
            naive = naive or rs.apart(a, b, 0.05)
            if called and naive or len(a) >= most:
                break
            a.append(rng.gauss(100.0, 5.0))
            b.append(rng.gauss(100.0, 5.0))
        wrong += called
        wrong_uncorrected += naive
    assert wrong / trials <= 0.05
    # looking 8 times at 5% each would call them apart far more often
    assert wrong_uncorrected / trials > 0.10


def test_the_repeats_needed_give_80_percent_power():
    a, b = [99.0, 100.0, 101.0], [100.0, 101.0, 102.0]       # difference 1, spread 1
    n = rs.repeats_needed(a, b, alpha=0.05)
    # the normal approximation's 2 (z_0.975 + z_0.8)^2 = 15.7, a little more with t
    assert n == 17 and n > math.ceil(2 * (1.96 + 0.8416) ** 2)
    rng = random.Random(3)
    power = statistics.fmean(rs.apart([rng.gauss(1.0, 1.0) for _ in range(n)],
                                      [rng.gauss(0.0, 1.0) for _ in range(n)], 0.05) for _ in range(TRIALS))
    assert abs(power - 0.80) <= 0.03
    assert rs.repeats_needed([1.0], b) is None and rs.repeats_needed(a, a) is None
