"""profiler/intervals.py against answers found without it: Student t quantiles from printed
tables and closed forms, R's t.test on Student's own sleep data, a regression slope worked
by hand, and every branch of the verdict."""

from __future__ import annotations

import math

import pytest

from serwatt.profiler.intervals import (
    CONFIRMED,
    NOT_MET,
    UNDECIDED,
    Interval,
    geometric_mean_interval,
    mean_interval,
    slope_interval,
    t_quantile,
    verdict,
)

# t_{0.975, df}, from a printed table (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2) to 6 places
T975 = {3: 3.182446, 5: 2.570582, 10: 2.228139, 30: 2.042272, 100: 1.983972}


@pytest.mark.parametrize("df, want", sorted(T975.items()))
def test_t_quantiles_are_the_tables(df: int, want: float) -> None:
    assert t_quantile(df) == pytest.approx(want, abs=5e-7)


def test_t_quantiles_in_closed_form() -> None:
    # df 1 is the Cauchy distribution: t_p = tan(pi (p - 1/2)); df 2: t_p = (2p - 1) /
    # sqrt(2 p (1 - p)). Neither goes through scipy.
    p = 0.975
    assert t_quantile(1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
    assert t_quantile(2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)
    # a 90% interval: t_{0.95, 5} = 2.015048 (table)
    assert t_quantile(5, level=0.90) == pytest.approx(2.015048, abs=5e-7)
    # many degrees of freedom: Fisher's expansion about the normal z = 1.959964,
    # t = z + (z^3 + z) / (4 df) + O(1 / df^2)
    z = 1.959963985
    assert t_quantile(10_000) == pytest.approx(z + (z**3 + z) / 40_000, abs=1e-7)


@pytest.mark.parametrize("df, level", [(0, 0.95), (-1, 0.95), (math.nan, 0.95), (5, 1.0)])
def test_t_quantile_refuses_what_has_none(df: float, level: float) -> None:
    with pytest.raises(ValueError):
        t_quantile(df, level)


def test_mean_interval_is_r_t_test_on_students_sleep_data() -> None:
    # Cushny & Peebles' extra hours of sleep, drug 2 minus drug 1, per patient (Student
    # 1908). R: t.test(extra ~ group, data = sleep, paired = TRUE) gives the difference
    # -1.58 with 95% CI -2.4598858 to -0.7001142; here the other way round.
    diff = [1.2, 2.4, 1.3, 1.3, 0.0, 1.0, 1.8, 0.8, 4.6, 1.4]
    iv = mean_interval(diff)
    assert iv.estimate == pytest.approx(1.58, abs=1e-12)
    assert iv.lo == pytest.approx(0.7001142, abs=5e-8)
    assert iv.hi == pytest.approx(2.4598858, abs=5e-8)
    assert iv.n == 10 and iv.df == 9 and "Student t" in iv.method and iv.why_none is None


def test_mean_interval_of_six_repeats_uses_t_not_the_normal() -> None:
    # 1..6: mean 3.5, sd sqrt(3.5); t_{0.975, 5} = 2.570582, where 1.96 would be 24% short
    iv = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    half = 2.570582 * math.sqrt(3.5) / math.sqrt(6)
    assert iv.estimate == 3.5
    assert iv.lo == pytest.approx(3.5 - half, abs=1e-6)
    assert iv.hi == pytest.approx(3.5 + half, abs=1e-6)


def test_identical_values_give_a_point_interval() -> None:
    iv = mean_interval([0.25] * 4)
    assert (iv.lo, iv.hi) == (0.25, 0.25)


@pytest.mark.parametrize("xs, why", [([], "no values"), ([3.0], "1 value: an interval needs 2")])
def test_fewer_than_two_values_give_no_interval_and_say_why(xs: list[float], why: str) -> None:
    iv = mean_interval(xs)
    assert iv.lo is None and iv.hi is None and not iv.has_interval
    assert iv.why_none == why
    assert all(math.isnan(b) for b in iv.bounds())
    assert verdict(iv, at_least=0.0) == UNDECIDED
    if xs:
        assert iv.estimate == 3.0


def test_geometric_mean_interval_is_the_t_interval_of_the_logs_mapped_back() -> None:
    # ratios e^1 .. e^6: their logs are 1..6, whose interval is worked above
    iv = geometric_mean_interval([math.exp(k) for k in range(1, 7)])
    half = 2.570582 * math.sqrt(3.5) / math.sqrt(6)
    assert iv.estimate == pytest.approx(math.exp(3.5), rel=1e-12)
    assert iv.lo == pytest.approx(math.exp(3.5 - half), rel=1e-5)
    assert iv.hi == pytest.approx(math.exp(3.5 + half), rel=1e-5)
    # a ratio of 2 and one of 1/2 average to 1 (the arithmetic mean would say 1.25)
    assert geometric_mean_interval([2.0, 0.5]).estimate == pytest.approx(1.0, rel=1e-12)
    same = geometric_mean_interval([0.5] * 6)
    assert same.bounds() == pytest.approx((0.5, 0.5), rel=1e-12)
    one = geometric_mean_interval([0.5])
    assert one.estimate == pytest.approx(0.5) and one.why_none == "1 value: an interval needs 2"
    with pytest.raises(ValueError, match="> 0"):
        geometric_mean_interval([1.0, 0.0])


def test_slope_interval_is_the_least_squares_slope_worked_by_hand() -> None:
    # y on x = 1..5: Sxx = 10, Sxy = 19.9, slope 1.99; residuals' SSE over n - 2 is the
    # variance, se = sqrt(var / Sxx), and t_{0.975, 3} = 3.182446 (table).
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    ys = [2.1, 3.9, 6.2, 7.8, 10.1]
    mx, my = 3.0, 6.02
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    sse = sum((y - (my + slope * (x - mx))) ** 2 for x, y in zip(xs, ys, strict=True))
    half = 3.182446 * math.sqrt(sse / 3 / sxx)
    iv = slope_interval(xs, ys, autocorrelated=False)
    assert slope == pytest.approx(1.99) and iv.estimate == pytest.approx(slope, rel=1e-12)
    assert iv.lo == pytest.approx(slope - half, rel=1e-6)
    assert iv.hi == pytest.approx(slope + half, rel=1e-6)
    assert iv.df == 3 and iv.effective_n == 5


def test_an_autocorrelated_series_gets_the_effective_count() -> None:
    # A line plus a slow swing (residuals that stay on one side for 5 samples): the lag-1
    # autocorrelation r of the residuals, computed here with plain sums, shrinks the count
    # to n (1 - r) / (1 + r) and widens the standard error by sqrt(n / n_eff).
    n = 40
    xs = [float(i) for i in range(n)]
    swing = [1.0 if (i // 5) % 2 == 0 else -1.0 for i in range(n)]
    ys = [0.5 * x + s for x, s in zip(xs, swing, strict=True)]
    plain = slope_interval(xs, ys, autocorrelated=False)
    wide = slope_interval(xs, ys)
    mx, my = sum(xs) / n, sum(ys) / n
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    res = [y - (my + b * (x - mx)) for x, y in zip(xs, ys, strict=True)]
    a, c = res[:-1], res[1:]
    ma, mc = sum(a) / len(a), sum(c) / len(c)
    r = sum((u - ma) * (v - mc) for u, v in zip(a, c, strict=True)) / math.sqrt(
        sum((u - ma) ** 2 for u in a) * sum((v - mc) ** 2 for v in c)
    )
    n_eff = n * (1 - r) / (1 + r)
    assert 0.5 < r < 0.9 and wide.lag1_autocorrelation == pytest.approx(r, rel=1e-9)
    assert wide.effective_n == pytest.approx(n_eff, rel=1e-9)
    assert wide.estimate == plain.estimate
    assert plain.lo is not None and plain.hi is not None and wide.hi is not None
    se_plain = (plain.hi - plain.lo) / 2 / t_quantile(n - 2)
    se_wide = (wide.hi - wide.estimate) / t_quantile(n_eff - 2)
    assert se_wide == pytest.approx(se_plain * math.sqrt(n / n_eff), rel=1e-9)


def test_alternating_residuals_never_narrow_the_interval() -> None:
    # a negative r would claim more independent points than there are: kept at 0
    xs = [float(i) for i in range(20)]
    ys = [x + (0.3 if i % 2 else -0.3) for i, x in enumerate(xs)]
    iv = slope_interval(xs, ys)
    assert iv.lag1_autocorrelation == 0.0 and iv.effective_n == 20
    assert iv.bounds() == slope_interval(xs, ys, autocorrelated=False).bounds()


def test_an_exact_line_has_a_point_interval() -> None:
    iv = slope_interval([0.0, 1.0, 2.0, 3.0], [1.0, 3.0, 5.0, 7.0])
    assert iv.estimate == pytest.approx(2.0) and iv.bounds() == pytest.approx((2.0, 2.0))


@pytest.mark.parametrize(
    "xs, ys, why",
    [
        ([], [], "0 point(s): no slope"),
        ([1.0], [2.0], "1 point(s): no slope"),
        ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0], "every x is the same"),
        ([0.0, 1.0], [0.0, 2.0], "2 points: an interval needs 3"),
    ],
)
def test_slopes_without_an_interval_say_why(xs: list, ys: list, why: str) -> None:
    iv = slope_interval(xs, ys)
    assert not iv.has_interval and iv.why_none == why
    assert verdict(iv, at_most=1.0) == UNDECIDED
    if len(xs) == 2:
        assert iv.estimate == pytest.approx(2.0)  # the slope itself is still known
    with pytest.raises(ValueError, match="ys"):
        slope_interval([1.0, 2.0], [1.0])


def _iv(lo: float, hi: float) -> Interval:
    return Interval((lo + hi) / 2, lo, hi, 6, 5, "test")


@pytest.mark.parametrize(
    "lo, hi, want",
    [
        (0.991, 0.999, CONFIRMED),  # the whole interval clears the goal
        (0.99, 0.995, CONFIRMED),  # its low end on the goal still does
        (0.95, 0.989, NOT_MET),  # the whole interval is short of it
        (0.98, 1.00, UNDECIDED),  # it straddles the goal
    ],
)
def test_at_least_verdicts(lo: float, hi: float, want: str) -> None:
    assert verdict(_iv(lo, hi), at_least=0.99) == want


@pytest.mark.parametrize(
    "lo, hi, want",
    [
        (0.3, 1.4, CONFIRMED),
        (0.3, 1.5, CONFIRMED),
        (1.51, 2.0, NOT_MET),
        (1.2, 1.8, UNDECIDED),
    ],
)
def test_at_most_verdicts(lo: float, hi: float, want: str) -> None:
    assert verdict(_iv(lo, hi), at_most=1.5) == want


@pytest.mark.parametrize(
    "lo, hi, want",
    [
        (-0.5, 0.5, CONFIRMED),  # flat: inside the band
        (1.2, 3.0, NOT_MET),  # growing
        (-3.0, -1.2, NOT_MET),  # shrinking
        (0.5, 1.5, UNDECIDED),  # straddles the top
        (-2.0, 2.0, UNDECIDED),  # wider than the band
    ],
)
def test_band_verdicts(lo: float, hi: float, want: str) -> None:
    assert verdict(_iv(lo, hi), at_least=-1.0, at_most=1.0) == want


def test_a_verdict_needs_a_claim() -> None:
    with pytest.raises(ValueError, match="at_least, at_most"):
        verdict(_iv(0.0, 1.0))
    with pytest.raises(ValueError, match="empty claim"):
        verdict(_iv(0.0, 1.0), at_least=2.0, at_most=1.0)
