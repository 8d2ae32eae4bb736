"""The report's statistics: blocking, the permutation test of a ratio of means and the
interval that inverts it, Holm, the smallest attainable p, serial dependence.

Windows of one process are autocorrelated (a slow stretch of a noisy node spans several),
so they are not tested one by one. The windows of each (run, pid) series, in time order,
are grouped into consecutive blocks and each block becomes one observation, its rate
Σvalue / Σwindow-seconds. Block length rule: L = max(1, round(n^(1/3))) windows for a
series of n windows (the n^(1/3) growth of Hall, Horowitz and Jing 1995 for block
resampling), and the series is split into ⌊n/L⌋ consecutive blocks of near-equal size
(numpy.array_split), so no window is dropped and no block spans two series.

Checkpoint episodes of one run can be seconds apart and share a warm-up (page cache,
allocator), so each side's series is tested (`serial_dependence`): Kendall's tau of value
against order for a trend, and the lag-1 autocorrelation r1 against its large-sample bound
1.96/√n. When either is found the episodes are resampled in consecutive blocks of
L = ⌈(1 + r1)/(1 − r1)⌉ (at least 2; the AR(1) variance inflation n/n_eff), each block one
observation weighted by its episode count.

Per comparison (observations x_i with weights w_i: window-seconds for blocks, episode
counts for episodes):
- each side's value is Σx/Σw; the change is the ratio ρ = candidate/baseline of those;
- p is a two-sided permutation test of that same statistic, log ρ, between the sides'
  observations (scipy.stats.permutation_test's definition: 2 × the smaller tail, every
  arrangement when there are at most N_RESAMPLES of them, else N_RESAMPLES seeded random
  ones with the observed counted in);
- the 95% interval of ρ inverts that test: the ratios r for which dividing the candidate
  by r leaves a test p >= alpha (the scale model: the sides differ by a factor). So p < alpha
  exactly when the interval excludes 1, up to a gap in the accepted set (`ci_note` says).
  Under the scale model the coverage is at least 95% by construction; on lognormal data the
  report's own procedure is simulated in tests/report/test_report_coverage.py and
  bench/report_coverage.py;
- no interval below MIN_CI_N observations per side (benchstat's rule: "need >= 6 samples
  for confidence interval");
- resampling runs on each side's observations sorted by (value, weight) with a fixed seed,
  so the same data in any order give the same p and interval;
- the family of every p is Holm-corrected (`holm`); a change is significant only when its
  corrected p < 0.05. scipy has no Holm (false_discovery_control is Benjamini-Hochberg/
  Yekutieli), so `holm` is the five-line step-down, tested against a hand-worked table.

Smallest attainable p: the test cannot go below 2 / (number of arrangements) (exact) or
2 / (N_RESAMPLES + 1) (random), and in a Holm family of k tests the smallest adjusted p is
k times the smallest raw one; `power_warning` says when no outcome could reach alpha.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import stats as sps

from profiler.report.inputs import WindowInput

Values = Sequence[float] | np.ndarray  # observations: a list or a numpy array

ALPHA = 0.05
CONFIDENCE = 0.95
N_RESAMPLES = 9999
SEED = 2006  # fixed: the same inputs give the same intervals
MIN_CI_N = 6  # per side; benchstat: "need >= 6 samples for confidence interval"
TEST = "permutation test of the ratio of means, two-sided"
CI_METHOD = "inverted permutation test (scale model)"
_MAX_NEEDED = 10_000  # search bound for `needed_n`
_BRACKET_STEPS = 10  # log-ratio steps 0.25 * 2^k out from the estimate: e^256 at most
_BISECTIONS = 20  # to 2^-20 of the bracket in log ratio: far below 3 significant digits
_TIE = 1e-12  # relative: statistics this close count as equal (scipy's tie tolerance idea)


# --------------------------------------------------------------------------- blocking


def block_length(n_windows: int) -> int:
    """Windows per block for a series of n windows: max(1, round(n^(1/3)))."""
    return max(1, round(n_windows ** (1.0 / 3.0))) if n_windows > 0 else 1


def block_count(n_windows: int) -> int:
    """Blocks a series of n windows becomes."""
    return n_windows // block_length(n_windows) if n_windows > 0 else 0


def windows_for_blocks(blocks: int) -> int:
    """The fewest windows in one series that make at least `blocks` blocks."""
    n = blocks
    while block_count(n) < blocks:
        n += 1
    return n


def block_windows(windows: Sequence[WindowInput]) -> list[list[WindowInput]]:
    """Consecutive blocks of one run's windows, per pid series (see the module docstring)."""
    series: dict[int | None, list[WindowInput]] = {}
    for w in windows:
        series.setdefault(w.pid, []).append(w)
    out: list[list[WindowInput]] = []
    for pid in sorted(series, key=lambda p: -1 if p is None else p):
        ordered = sorted(series[pid], key=lambda w: w.started_at)
        count = block_count(len(ordered))
        idx = np.array_split(np.arange(len(ordered)), count)
        out.extend([ordered[i] for i in chunk] for chunk in idx)
    return out


# --------------------------------------------------------------------------- serial dependence


@dataclass(frozen=True)
class SerialDependence:
    """One side's series in time order: Kendall's tau trend p, lag-1 autocorrelation, and
    the block length the resampling uses (1: independent)."""

    n: int
    trend_p: float | None
    lag1_autocorrelation: float | None
    block_length: int

    @property
    def found(self) -> bool:
        return self.block_length > 1


def lag1_autocorrelation(values: Values) -> float | None:
    """r1 = Σ(x_t − x̄)(x_{t+1} − x̄) / Σ(x_t − x̄)²; None below 3 values or with no spread."""
    x = np.asarray(values, dtype=float)
    if len(x) < 3:
        return None
    d = x - x.mean()
    denom = float((d * d).sum())
    return float((d[:-1] * d[1:]).sum() / denom) if denom > 0 else None


def serial_dependence(values: Values) -> SerialDependence:
    """Trend and lag-1 autocorrelation of a series in time order, and the block length
    they call for (module docstring)."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    r1 = lag1_autocorrelation(x)
    trend_p = None
    if n >= 3 and float(np.ptp(x)) > 0:
        trend_p = float(sps.kendalltau(np.arange(n), x).pvalue)
    length = 1
    correlated = r1 is not None and r1 > 1.96 / math.sqrt(n)
    if correlated or (trend_p is not None and trend_p < ALPHA):
        r = min(max(r1 or 0.0, 0.0), 0.9)
        length = max(2, math.ceil((1 + r) / (1 - r)))
    return SerialDependence(n, trend_p, r1, length)


def block_series(values: Values, length: int) -> tuple[list[float], list[float]]:
    """Consecutive blocks of `length` (near-equal, numpy.array_split): (Σ value, count)."""
    x = np.asarray(values, dtype=float)
    if length <= 1 or len(x) == 0:
        return [float(v) for v in x], [1.0] * len(x)
    chunks = np.array_split(x, max(1, len(x) // length))
    return [float(c.sum()) for c in chunks], [float(len(c)) for c in chunks]


# --------------------------------------------------------------------------- the test


@dataclass(frozen=True)
class Comparison:
    """One metric compared between the sides.

    baseline, candidate: Σx/Σw per side; ratio: candidate/baseline (None when the
    baseline is zero); ci95: the ratio's 95% interval, a bound None when unbounded (None
    when there is none: `ci_note` says why); p: the permutation test's two-sided p (None
    when not tested: `note` says why); n: observations per side; ci_method: how the
    interval was formed.
    """

    baseline: float
    candidate: float
    ratio: float | None
    ci95: tuple[float | None, float | None] | None
    p: float | None
    n: tuple[int, int]
    ci_method: str | None
    note: str | None
    ci_note: str | None = None
    test: str = TEST


@lru_cache(maxsize=64)
def _arrangements(n: int, m: int) -> tuple[np.ndarray, bool]:
    """(membership matrix, exact): row b marks which of the n + m pooled observations
    (baseline first) arrangement b puts on the candidate side. Every arrangement when
    there are at most N_RESAMPLES, else N_RESAMPLES seeded random ones."""
    total = n + m
    if math.comb(total, m) <= N_RESAMPLES:
        rows = np.zeros((math.comb(total, m), total), dtype=bool)
        for b, chosen in enumerate(itertools.combinations(range(total), m)):
            rows[b, list(chosen)] = True
        return rows, True
    rng = np.random.default_rng(SEED)
    order = rng.permuted(np.tile(np.arange(total), (N_RESAMPLES, 1)), axis=1)
    rows = np.zeros((N_RESAMPLES, total), dtype=bool)
    np.put_along_axis(rows, order[:, :m], True, axis=1)
    return rows, False


def _sorted_pairs(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # per trial (last axis): by value, then weight, so the input order cannot matter
    order = np.lexsort((w, x), axis=-1)
    return np.take_along_axis(x, order, axis=-1), np.take_along_axis(w, order, axis=-1)


@dataclass(frozen=True)
class RatioTests:
    """A batch of ratio-of-means permutation tests: p at ratio 1 and the inverted
    interval, one entry per trial (nan bounds: unbounded)."""

    p: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    p_at_bounds_ok: np.ndarray  # False where the accepted set has a gap at 1


class _Batch:
    """The sums every arrangement gives, so that p(r) for any r is a few vector ops."""

    def __init__(self, xb: np.ndarray, wb: np.ndarray, xc: np.ndarray, wc: np.ndarray) -> None:
        xb, wb = _sorted_pairs(xb, wb)
        xc, wc = _sorted_pairs(xc, wc)
        n, m = xb.shape[1], xc.shape[1]
        g, self.exact = _arrangements(n, m)
        gb, gc = g[:, :n].astype(float), g[:, n:].astype(float)
        self.size = g.shape[0]
        # (arrangements, trials): each side's sums of baseline and of candidate values
        self.a = gb @ xb.T
        self.c = gc @ xc.T
        self.a_rest = xb.sum(axis=1) - self.a
        self.c_rest = xc.sum(axis=1) - self.c
        w_cand = gb @ wb.T + gc @ wc.T
        w_base = wb.sum(axis=1) + wc.sum(axis=1) - w_cand
        with np.errstate(divide="ignore", invalid="ignore"):
            self.weight_ratio = w_base / w_cand
            # the observed ratio of means at r = 1
            self.observed = (xc.sum(axis=1) / wc.sum(axis=1)) / (xb.sum(axis=1) / wb.sum(axis=1))

    def p(self, log_r: np.ndarray) -> np.ndarray:
        """Two-sided p of the test that candidate / e^log_r and baseline are exchangeable:
        the statistic is the ratio of means (compared as a ratio, the same order as its
        logarithm); arrangements within a relative 1e-12 of the observed count as ties."""
        inv = np.exp(-log_r)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            null = (self.a + self.c * inv) / (self.a_rest + self.c_rest * inv)
            null *= self.weight_ratio
            observed = self.observed * inv
            less = (null <= observed * (1.0 + _TIE)).sum(axis=0)
            greater = (null >= observed * (1.0 - _TIE)).sum(axis=0)
        extra = 0 if self.exact else 1  # a random sample counts the observed arrangement in
        tail = (np.minimum(less, greater) + extra) / (self.size + extra)
        return np.minimum(1.0, 2.0 * tail)

    def bound(self, center: np.ndarray, direction: float) -> np.ndarray:
        """The accepted log ratio farthest from `center` in `direction` before p < alpha
        (bracketed by doubling steps, then bisected); nan when no step is rejected."""
        inside = center.copy()
        outside = np.full_like(center, np.nan)
        for k in range(_BRACKET_STEPS):
            todo = np.isnan(outside)
            if not todo.any():
                break
            trial = center + direction * 0.25 * 2.0**k
            rejected = self.p(trial) < ALPHA
            outside = np.where(todo & rejected, trial, outside)
            inside = np.where(todo & ~rejected, trial, inside)
        bounded = ~np.isnan(outside)
        if bounded.any():
            lo, hi = inside.copy(), np.where(bounded, outside, inside)
            for _ in range(_BISECTIONS):
                mid = 0.5 * (lo + hi)
                rejected = self.p(mid) < ALPHA
                hi = np.where(rejected, mid, hi)
                lo = np.where(rejected, lo, mid)
            inside = lo
        return np.where(bounded, inside, np.nan)


def ratio_tests(xb: np.ndarray, wb: np.ndarray, xc: np.ndarray, wc: np.ndarray) -> RatioTests:
    """The report's test and interval for a batch of trials: arrays (trials, n) and
    (trials, m) of observations and weights; every baseline and candidate value sum > 0.
    One implementation for the report (a batch of one) and its coverage simulation."""
    batch = _Batch(xb, wb, xc, wc)
    p1 = batch.p(np.zeros(xb.shape[0]))
    est = np.log(batch.observed)
    lo = batch.bound(est, -1.0)
    hi = batch.bound(est, +1.0)
    lo_r, hi_r = np.exp(lo), np.exp(hi)
    holds_one = (np.isnan(lo_r) | (lo_r <= 1.0)) & (np.isnan(hi_r) | (hi_r >= 1.0))
    consistent = holds_one == (p1 >= ALPHA)
    return RatioTests(p1, lo_r, hi_r, consistent)


def permutation_p(xb: np.ndarray, wb: np.ndarray, xc: np.ndarray, wc: np.ndarray) -> float:
    """The test's p alone, for one comparison (at ratio 1)."""
    batch = _Batch(xb[None, :], wb[None, :], xc[None, :], wc[None, :])
    return float(batch.p(np.zeros(1))[0])


def _arrays(values: Values, weights: Values | None) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(values, dtype=float)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=float)
    if x.shape != w.shape:
        raise ValueError("values and weights differ in length")
    order = np.lexsort((w, x))  # sums and resamples that do not depend on the input order
    return x[order], w[order]


def side_value(values: Values, weights: Values | None = None) -> float | None:
    """Σx/Σw, None when there is no weight."""
    x, w = _arrays(values, weights)
    total_w = float(w.sum())
    return float(x.sum()) / total_w if total_w > 0 else None


def _bound(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def compare(
    baseline: Values,
    candidate: Values,
    baseline_weights: Values | None = None,
    candidate_weights: Values | None = None,
) -> Comparison:
    """Compare two sides' observations (values with weights; weights default to 1)."""
    xb, wb = _arrays(baseline, baseline_weights)
    xc, wc = _arrays(candidate, candidate_weights)
    n = (len(xb), len(xc))
    vb = float(xb.sum() / wb.sum()) if wb.sum() > 0 else 0.0
    vc = float(xc.sum() / wc.sum()) if wc.sum() > 0 else 0.0

    def untested(why: str) -> Comparison:
        return Comparison(vb, vc, None, None, None, n, None, why, why)

    if n[0] == 0 or n[1] == 0:
        return untested(f"not tested: no {'baseline' if n[0] == 0 else 'candidate'} data")
    if vb == 0 and vc == 0:
        return untested("not tested: zero on both sides")
    if vb == 0 or vc == 0:
        p = permutation_p(xb, wb, xc, wc)
        side = "baseline" if vb == 0 else "candidate"
        why = f"no ratio interval: the {side} is zero (p still tested)"
        ratio = None if vb == 0 else 0.0
        return Comparison(vb, vc, ratio, None, p, n, None, why if vb == 0 else None, why)
    ratio = vc / vb
    if min(n) < MIN_CI_N:
        p = permutation_p(xb, wb, xc, wc)
        why = (
            f"no interval: needs at least {MIN_CI_N} per side (benchstat's rule), has {n[0]}+{n[1]}"
        )
        return Comparison(vb, vc, ratio, None, p, n, None, None, why)
    res = ratio_tests(xb[None, :], wb[None, :], xc[None, :], wc[None, :])
    ci = (_bound(res.lo[0]), _bound(res.hi[0]))
    ci_note = None
    if ci[0] is None or ci[1] is None:
        ci_note = "interval unbounded: no ratio that far is rejected at these counts"
    if not bool(res.p_at_bounds_ok[0]):
        ci_note = "the accepted ratios have a gap at 1: the test's p and the interval disagree"
    return Comparison(vb, vc, ratio, ci, float(res.p[0]), n, CI_METHOD, None, ci_note)


# --------------------------------------------------------------------------- Holm


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values, in the given order; None entries are not tested
    and not counted in the family. Significant at alpha when adjusted p < alpha."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(tested)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


# --------------------------------------------------------------------------- minimum n


@lru_cache(maxsize=4096)
def min_p(n: int, m: int) -> float:
    """The smallest two-sided p the permutation test can give with n and m observations:
    2 / C(n+m, n) when every arrangement is enumerated, 2 / (N_RESAMPLES + 1) when they
    are sampled (the observed arrangement the only one as extreme)."""
    if n < 1 or m < 1:
        return 1.0
    arrangements = math.comb(n + m, n)
    if arrangements <= N_RESAMPLES:
        return min(1.0, 2.0 / arrangements)
    return 2.0 / (N_RESAMPLES + 1)


def min_attainable_p(n: int, m: int, family: int = 1) -> float:
    """The smallest Holm-adjusted p a test of n and m observations can reach in a family
    of `family` tests: Holm's first step multiplies the smallest p by the family size."""
    return min(1.0, max(1, family) * min_p(n, m))


def needed_n(other: int, alpha: float = ALPHA, family: int = 1) -> int | None:
    """The fewest observations on one side that, against `other` on the other side, can
    reach an adjusted p < alpha in a family of `family`; None when none up to 10,000 can."""
    if other < 1:
        return None
    for n in range(1, _MAX_NEEDED + 1):
        if min_attainable_p(n, other, family) < alpha:
            return n
    return None


def needed_per_side(alpha: float = ALPHA, family: int = 1) -> int:
    """The fewest observations per side (equal sizes) that can reach an adjusted p < alpha."""
    k = 1
    while min_attainable_p(k, k, family) >= alpha:
        k += 1
    return k


@dataclass(frozen=True)
class PowerWarning:
    """Too few observations for any outcome to reach an adjusted p < alpha."""

    unit: str
    n: tuple[int, int]
    family: int
    min_attainable_p: float
    needed_per_side: int
    needed_baseline: int | None  # with the candidate's n as it is
    needed_candidate: int | None  # with the baseline's n as it is
    message: str


def power_warning(
    n_baseline: int, n_candidate: int, unit: str, alpha: float = ALPHA, family: int = 1
) -> PowerWarning | None:
    """A warning when no outcome with these sizes, in a Holm family of `family` tests,
    can reach an adjusted p < alpha; else None."""
    best = min_attainable_p(n_baseline, n_candidate, family)
    if n_baseline >= 1 and n_candidate >= 1 and best < alpha:
        return None
    k = needed_per_side(alpha, family)
    nb = needed_n(n_candidate, alpha, family)
    nc = needed_n(n_baseline, alpha, family)
    alternatives = []
    if nb is not None and nb > n_baseline:
        alternatives.append(f"{nb} baseline {unit} with the candidate's {n_candidate}")
    if nc is not None and nc > n_candidate:
        alternatives.append(f"{nc} candidate {unit} with the baseline's {n_baseline}")
    in_family = f" in a Holm family of {family} tests" if family > 1 else ""
    message = (
        f"too few {unit} to ever reach p < {alpha:g}: baseline {n_baseline}, candidate "
        f"{n_candidate}; the smallest attainable p{in_family} is {best:.3g}; needs at least "
        f"{k} per side" + (f" (or {' or '.join(alternatives)})" if alternatives else "")
    )
    return PowerWarning(unit, (n_baseline, n_candidate), family, best, k, nb, nc, message)


def description(
    families: Mapping[str, int], min_attainable: Mapping[str, Any], skip_warmup: int
) -> dict[str, Any]:
    """The report's `statistics`: the families tested and how every figure is tested,
    blocked and given its interval, in words."""
    return {
        "alpha": ALPHA,
        "confidence": CONFIDENCE,
        "correction": "holm",
        "families": families,
        "family_size": sum(families.values()),
        "min_attainable_p": min_attainable,
        "min_ci_n": MIN_CI_N,
        "skip_warmup": skip_warmup,
        "blocking": "consecutive windows of each (run, pid) series in blocks of "
        "L = max(1, round(n^(1/3))) windows, split near-equally (numpy.array_split); "
        "checkpoint episodes blocked by L = ceil((1 + r1)/(1 - r1)) when a side shows a "
        "trend or lag-1 autocorrelation",
        "interval": f"{CI_METHOD}: the ratios r for which the test of candidate/r "
        f"against baseline keeps p >= {ALPHA:g}; none below {MIN_CI_N} "
        "observations per side",
        "bootstrap": "none: the interval inverts the permutation test (statistics.interval)",
        "test": f"{TEST}: statistic Σvalue/Σweight candidate over baseline, every "
        f"arrangement up to {N_RESAMPLES}, else {N_RESAMPLES} seeded random "
        f"ones (seed {SEED}) over each side sorted; the statistic the report shows",
        "method": "ratio of means, tested by a permutation test of that ratio, with the "
        "interval from inverting the same test",
    }
