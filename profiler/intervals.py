"""95% intervals and the verdicts read off them: the statistics behind every measured claim
(README, docs/benchmarks.md, bench/*, the profile document's t quantile).

An interval here is two-sided, at LEVEL (95%), from Student's t with the data's own degrees
of freedom (scipy.stats.t), never the normal 1.96: benches decide claims on 2-16 repeats,
where t_{0.975, 5} = 2.571 is 31% wider than 1.96.

- `mean_interval`: the mean of independent repeats, mean +- t_{0.975, n-1} s / sqrt(n).
- `geometric_mean_interval`: per-round ratios, through the mean of their logarithms (a
  ratio of 2 and one of 1/2 average to 1, as they should).
- `clopper_pearson`: a proportion of x successes in n trials, the exact (beta quantile)
  interval; x and n may be fractional (an effective count: Korn & Graubard 1998, Survey
  Methodology 24, 193), and 0 of n gives [0, 1 - (alpha/2)^(1/n)], never a zero width.
- `slope_interval`: the least-squares slope of a series sampled in time (RSS every 2 s).
  Consecutive samples are not independent, so the slope's standard error is widened by the
  lag-1 autocorrelation r of the residuals to an effective count n (1 - r) / (1 + r)
  (Santer et al. 2000, J. Geophys. Res. 105, 7337), whose t has that count less 2 degrees
  of freedom.

A claim is a goal the quantity must reach (`at_least`) or stay under (`at_most`), or both
(a band). `verdict` reads it off the interval:
- confirmed: the whole interval lies inside the claim;
- not met: the whole interval lies outside it;
- undecided: the interval straddles a goal, or there is no interval (`Interval.why_none`
  says why: fewer values than the method needs, or no spread to measure a slope over).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

LEVEL = 0.95
CONFIRMED = "confirmed"
NOT_MET = "not met"
UNDECIDED = "undecided"
# the fewest effective points a slope's interval keeps (one degree of freedom)
MIN_EFFECTIVE_POINTS = 3.0


@dataclass(frozen=True)
class Interval:
    """An estimate and its two-sided LEVEL interval; lo and hi are None when there is none,
    and then `why_none` says why."""

    estimate: float
    lo: float | None
    hi: float | None
    n: int
    df: float | None
    method: str
    why_none: str | None = None

    @property
    def has_interval(self) -> bool:
        return self.lo is not None and self.hi is not None

    def bounds(self) -> tuple[float, float]:
        """(lo, hi); nan for both when there is no interval (for tables and JSON)."""
        if self.lo is None or self.hi is None:
            return math.nan, math.nan
        return self.lo, self.hi


@dataclass(frozen=True)
class SlopeInterval(Interval):
    """A slope's interval, with what widened it."""

    lag1_autocorrelation: float | None = None
    effective_n: float | None = None


def t_quantile(df: float, level: float = LEVEL) -> float:
    """The two-sided `level` quantile of Student's t with `df` degrees of freedom:
    t_{(1 + level) / 2, df} (2.570582 for df 5 at 95%)."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, not {df}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), not {level}")
    # scipy.special's inverse of Student's t CDF, the function stats.t.ppf calls: importing
    # scipy.stats costs every `serwatt profile` 0.6 s of CPU at start-up, special 0.05 s
    return float(special.stdtrit(df, (1 + level) / 2))


def clopper_pearson(x: float, n: float, level: float = LEVEL) -> tuple[float, float]:
    """The exact two-sided `level` interval of a proportion x / n (module doc): lower
    B^-1(alpha/2; x, n - x + 1), upper B^-1(1 - alpha/2; x + 1, n - x), 0 and 1 at the ends."""
    if not n > 0 or not 0 <= x <= n:
        raise ValueError(f"a proportion needs 0 <= x <= n and n > 0, not x {x}, n {n}")
    alpha = 1 - level
    lo = 0.0 if x <= 0 else float(special.betaincinv(x, n - x + 1, alpha / 2))
    hi = 1.0 if x >= n else float(special.betaincinv(x + 1, n - x, 1 - alpha / 2))
    return lo, hi


def mean_interval(xs: Sequence[float], level: float = LEVEL) -> Interval:
    """The mean of independent values and its Student t interval."""
    n = len(xs)
    method = f"Student t, {n - 1} df" if n >= 2 else "Student t"
    if n == 0:
        return Interval(math.nan, None, None, 0, None, method, "no values")
    values = np.asarray(xs, dtype=float)
    mean = float(values.mean())
    if n < 2:
        return Interval(mean, None, None, 1, None, method, "1 value: an interval needs 2")
    half = t_quantile(n - 1, level) * float(values.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, n - 1, method)


def geometric_mean_interval(ratios: Sequence[float], level: float = LEVEL) -> Interval:
    """The geometric mean of positive ratios and its interval: the Student t interval of
    their mean logarithm, mapped back."""
    bad = [r for r in ratios if not r > 0]
    if bad:
        raise ValueError(f"ratios must be > 0: {bad[:3]}")
    logs = mean_interval([math.log(r) for r in ratios], level)
    method = f"geometric mean, {logs.method} on log ratios"
    if logs.lo is None or logs.hi is None:
        return Interval(
            math.exp(logs.estimate) if logs.n else math.nan,
            None,
            None,
            logs.n,
            None,
            method,
            logs.why_none,
        )
    return Interval(
        math.exp(logs.estimate), math.exp(logs.lo), math.exp(logs.hi), logs.n, logs.df, method
    )


def slope_interval(
    xs: Sequence[float],
    ys: Sequence[float],
    *,
    autocorrelated: bool = True,
    level: float = LEVEL,
) -> SlopeInterval:
    """The least-squares slope of ys on xs (units of y per unit of x) and its interval;
    `autocorrelated` (a series sampled in time) widens it by the residuals' lag-1
    autocorrelation (module doc). Needs 3 points and xs that are not all equal."""
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"{n} xs but {len(ys)} ys")
    method = "least squares, Student t" + (
        ", widened for lag-1 autocorrelation" if autocorrelated else ""
    )
    if n < 2:
        return SlopeInterval(math.nan, None, None, n, None, method, f"{n} point(s): no slope")
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    if float(np.ptp(x)) == 0.0:
        return SlopeInterval(math.nan, None, None, n, None, method, "every x is the same")
    from scipy import stats  # only benches fit slopes (see t_quantile)

    fit = stats.linregress(x, y)
    slope = float(fit.slope)
    if n < 3:
        return SlopeInterval(slope, None, None, n, None, method, "2 points: an interval needs 3")
    r1, n_eff = 0.0, float(n)
    if autocorrelated:
        resid = y - (fit.intercept + fit.slope * x)
        if resid.std() > 0:
            # a negative r would narrow the interval below the independent case: kept at 0
            r1 = max(0.0, float(np.corrcoef(resid[:-1], resid[1:])[0, 1]))
        n_eff = max(MIN_EFFECTIVE_POINTS, n * (1 - r1) / (1 + r1))
    se = float(fit.stderr) * math.sqrt(n / n_eff)
    half = t_quantile(n_eff - 2, level) * se
    return SlopeInterval(slope, slope - half, slope + half, n, n_eff - 2, method, None, r1, n_eff)


def verdict(iv: Interval, *, at_least: float | None = None, at_most: float | None = None) -> str:
    """CONFIRMED, NOT_MET or UNDECIDED for the claim at_least <= quantity <= at_most (give
    one or both), read off the interval (module doc)."""
    if at_least is None and at_most is None:
        raise ValueError("a claim needs at_least, at_most or both")
    if at_least is not None and at_most is not None and at_least > at_most:
        raise ValueError(f"an empty claim: at_least {at_least} > at_most {at_most}")
    if iv.lo is None or iv.hi is None:
        return UNDECIDED
    lo, hi = iv.lo, iv.hi
    if (at_least is not None and hi < at_least) or (at_most is not None and lo > at_most):
        return NOT_MET
    if (at_least is None or lo >= at_least) and (at_most is None or hi <= at_most):
        return CONFIRMED
    return UNDECIDED
