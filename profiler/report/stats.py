"""The report's statistics: the run as the unit, a studentized permutation test of a ratio
of means over whole runs and the interval that inverts it, Holm, the smallest attainable p.

The unit is the run. The checkpoints of one run share its page cache, allocator, node and
noisy neighbours, and consecutive windows of one process are autocorrelated, so neither is
an independent observation; a pre-test for dependence (a trend, a lag-1 autocorrelation)
misses it at the counts a report has (it fired in 9-37% of dependent trials at 6-10 per
side), and what it misses is then tested as independent. So nothing inside a run is
resampled: each run is one cluster (S_i, W_i), S_i its summed values (stall seconds,
CPU-seconds) and W_i its weight (checkpoint episodes, window-seconds, restores).

Per comparison, with G runs on a side:
- each side's value is the ratio estimator R = ΣS/ΣW; the change is ρ = R_c / R_b;
- its statistic is studentized: T = log(R_c/R_b) / √(v_b + v_c), v = the cluster-robust
  (linearization) relative variance of R, Σ(S_i − R·W_i)² / (W̄² · G(G−1) · R²). Studentized,
  the permutation test is exact when the sides' runs are exchangeable under no change and
  stays asymptotically valid when they differ in spread or count (Janssen 1997; Chung and
  Romano 2013, "Exact and asymptotically robust permutation tests", Ann. Statist. 41);
- p is two-sided over arrangements of whole runs between the sides (scipy.stats.
  permutation_test's definition: 2 × the smaller tail, every arrangement when there are at
  most N_RESAMPLES, else N_RESAMPLES seeded random ones with the observed counted in);
- the reported p is the larger of that permutation p and a Welch t test's p of the same
  log ratio (`_Batch.welch_p`): each side's relative variance is floored at the one the
  spread of its runs' logs implies for a lognormal side, (e^{s²} − 1)/G, and the df is
  Hsu's, the fewer runs less one. Why: with sides of unequal shape the permutation test is
  only asymptotically valid, and a heavy-tailed side with few runs (lognormal σ 1.4, 8 runs
  against 18 of σ 0.8) usually lacks the rare large runs that make its mean, so its own
  variance is small exactly when its mean is; the permutation test alone rejected 11% of
  such A/A trials. The larger of two p-values is valid wherever either test is (P(max <
  α) ≤ either one's), so the permutation test's exactness for exchangeable runs stands, and
  the floor (the logs' spread does not need the tail to show it) holds the unequal-shape
  cases. The floor is exact for lognormal runs; a tail heavier than a lognormal's with the
  same log spread (Pareto-like) is not covered by it. A side with a zero run has no floor;
- the 95% interval of ρ inverts that p: the ratios r for which dividing the candidate's
  runs by r leaves p >= alpha. So p < alpha exactly when the interval excludes 1, up to a
  gap in the accepted set (`ci_note` says). Coverage is simulated on the cases that broke
  the old per-episode test (autocorrelation, run effects, unequal shapes) through this
  function in tests/report/test_report_coverage.py and bench/report_coverage.py;
- no test with fewer than 2 runs on a side (the run-to-run variation is not seen), and no
  interval where the arrangements cannot reach alpha (`min_p`);
- resampling runs on each side's runs sorted by (value, weight) with a fixed seed, so the
  same data in any order give the same p and interval;
- the family of every p is Holm-corrected (`holm`); a change is significant only when its
  corrected p < 0.05. scipy has no Holm (false_discovery_control is Benjamini-Hochberg/
  Yekutieli), so `holm` is the five-line step-down, tested against a hand-worked table.

Smallest attainable p: the test cannot go below 2 / (number of arrangements) (exact) or
2 / (N_RESAMPLES + 1) (random), and in a Holm family of k tests the smallest adjusted p is
k times the smallest raw one; `power_warning` says when no outcome could reach alpha.
More checkpoints per run do not lower it: only runs do.

`serial_dependence` stays as a description of a side's stalls in time order (a warm-up
trend); it changes no test.
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

Values = Sequence[float] | np.ndarray  # observations: a list or a numpy array

ALPHA = 0.05
CONFIDENCE = 0.95
N_RESAMPLES = 9999
SEED = 2006  # fixed: the same inputs give the same intervals
MIN_RUNS = 2  # per side: one run shows no run-to-run variation
UNIT = "runs"
TEST = (
    "studentized permutation test of the ratio of means over whole runs "
    "(Janssen 1997; Chung and Romano 2013), two-sided, p the larger of it and a Welch t "
    "test of the log ratio with lognormal-floored variances and Hsu's df"
)
CI_METHOD = "inverted studentized permutation and floored Welch tests over runs (scale model)"
_MAX_NEEDED = 10_000  # search bound for `needed_n`
_BRACKET_STEPS = 10  # log-ratio steps 0.25 * 2^k out from the estimate: e^256 at most
_BISECTIONS = 20  # to 2^-20 of the bracket in log ratio: far below 3 significant digits
_TIE = 1e-9  # statistics this close (relative, or absolute near 0) count as equal


# --------------------------------------------------------------------------- serial dependence


@dataclass(frozen=True)
class SerialDependence:
    """One side's series in time order: Kendall's tau trend p and lag-1 autocorrelation.
    Descriptive: the test takes runs as its unit whatever these say."""

    n: int
    trend_p: float | None
    lag1_autocorrelation: float | None

    @property
    def found(self) -> bool:
        trend = self.trend_p is not None and self.trend_p < ALPHA
        r1 = self.lag1_autocorrelation
        return trend or (r1 is not None and r1 > 1.96 / math.sqrt(self.n))


def lag1_autocorrelation(values: Values) -> float | None:
    """r1 = Σ(x_t − x̄)(x_{t+1} − x̄) / Σ(x_t − x̄)²; None below 3 values or with no spread."""
    x = np.asarray(values, dtype=float)
    if len(x) < 3:
        return None
    d = x - x.mean()
    denom = float((d * d).sum())
    return float((d[:-1] * d[1:]).sum() / denom) if denom > 0 else None


def serial_dependence(values: Values) -> SerialDependence:
    """Trend and lag-1 autocorrelation of a series in time order."""
    x = np.asarray(values, dtype=float)
    trend_p = None
    if len(x) >= 3 and float(np.ptp(x)) > 0:
        trend_p = float(sps.kendalltau(np.arange(len(x)), x).pvalue)
    return SerialDependence(len(x), trend_p, lag1_autocorrelation(x))


# --------------------------------------------------------------------------- the test


@dataclass(frozen=True)
class Comparison:
    """One metric compared between the sides.

    baseline, candidate: ΣS/ΣW per side; ratio: candidate/baseline (None when the
    baseline is zero); ci95: the ratio's 95% interval, a bound None when unbounded (None
    when there is none: `ci_note` says why); p: the test's two-sided p (None when not
    tested: `note` says why); n: runs per side; ci_method: how the interval was formed.
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
    """(membership matrix, exact): row b marks which of the n + m pooled runs (baseline
    first) arrangement b puts on the candidate side. Every arrangement when there are at
    most N_RESAMPLES, else N_RESAMPLES seeded random ones."""
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
    """A batch of tests: p at ratio 1 and the inverted interval, one entry per trial (nan
    bounds: unbounded)."""

    p: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    p_at_bounds_ok: np.ndarray  # False where the accepted set has a gap at 1


class _Arm:
    """One side of every arrangement (the observed one first): the sums over the runs it
    holds, split by where each run came from, so that the candidate's runs can be divided
    by any r in a few vector operations."""

    def __init__(self, member: np.ndarray, n: int, s: tuple[np.ndarray, ...]) -> None:
        sb, wb, sc, wc = s
        mb, mc = member[:, :n].astype(float), member[:, n:].astype(float)
        self.g = member.sum(axis=1).astype(float)[:, None]  # runs on this side
        # (arrangements, trials): Σ S, Σ S², Σ S·W from baseline runs (0) and candidate runs (1)
        self.s0, self.s1 = mb @ sb.T, mc @ sc.T
        self.ss0, self.ss1 = mb @ (sb * sb).T, mc @ (sc * sc).T
        self.sw0, self.sw1 = mb @ (sb * wb).T, mc @ (sc * wc).T
        self.w = mb @ wb.T + mc @ wc.T
        self.ww = mb @ (wb * wb).T + mc @ (wc * wc).T

    def value_and_var(self, inv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(R, v): the ratio estimator and its cluster-robust relative variance, with the
        candidate's runs divided by r = 1/inv."""
        s = self.s0 + self.s1 * inv
        ss = self.ss0 + self.ss1 * inv * inv
        sw = self.sw0 + self.sw1 * inv
        with np.errstate(divide="ignore", invalid="ignore"):
            r = s / self.w
            resid = np.maximum(ss - 2.0 * r * sw + r * r * self.ww, 0.0)
            wbar = self.w / self.g
            v = resid / (wbar * wbar * self.g * (self.g - 1.0)) / (r * r)
        return r, v


class _Batch:
    """The studentized statistic of every arrangement of whole runs, for a batch of
    trials, so that p(r) for any r is a few vector ops."""

    def __init__(self, xb: np.ndarray, wb: np.ndarray, xc: np.ndarray, wc: np.ndarray) -> None:
        xb, wb = _sorted_pairs(xb, wb)
        xc, wc = _sorted_pairs(xc, wc)
        n, m = xb.shape[1], xc.shape[1]
        g, self.exact = _arrangements(n, m)
        observed = np.zeros((1, n + m), dtype=bool)
        observed[0, n:] = True
        member = np.vstack([observed, g])  # row 0: the observed arrangement
        pieces = (xb, wb, xc, wc)
        self.cand, self.base = _Arm(member, n, pieces), _Arm(~member, n, pieces)
        self.size = g.shape[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            self.ratio = (xc.sum(axis=1) / wc.sum(axis=1)) / (xb.sum(axis=1) / wb.sum(axis=1))
            self.log_ratio = np.log(self.ratio)
        self.t_var = _floored_var(xb, wb) + _floored_var(xc, wc)
        self.t_df = min(n, m) - 1.0  # Hsu's: conservative beside Welch-Satterthwaite's

    def statistic(self, inv: np.ndarray) -> np.ndarray:
        """T of every arrangement (row 0 the observed) with the candidate divided by 1/inv."""
        rc, vc = self.cand.value_and_var(inv)
        rb, vb = self.base.value_and_var(inv)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            log_ratio = np.log(rc / rb)
            t = log_ratio / np.sqrt(vb + vc)
        # a side zero in every run it holds: beyond any finite T; 0/0 (no spread, no change): 0
        t = np.where(np.isinf(log_ratio), log_ratio, t)
        return np.where(np.isnan(t), 0.0, t)

    def p(self, log_r: np.ndarray) -> np.ndarray:
        """Two-sided p of the test that candidate / e^log_r and baseline are exchangeable."""
        t = self.statistic(np.exp(-log_r))
        observed, null = t[0], t[1:]
        with np.errstate(invalid="ignore"):
            tol = _TIE * np.maximum(1.0, np.abs(np.where(np.isinf(observed), 0.0, observed)))
            less = (null <= observed + tol).sum(axis=0)
            greater = (null >= observed - tol).sum(axis=0)
        extra = 0 if self.exact else 1  # a random sample counts the observed arrangement in
        tail = (np.minimum(less, greater) + extra) / (self.size + extra)
        permutation = np.minimum(1.0, 2.0 * tail)
        return np.maximum(permutation, self.welch_p(log_r))

    def welch_p(self, log_r: np.ndarray) -> np.ndarray:
        """Welch's two-sided p of the log ratio against log_r, with each side's floored
        variance (`_floored_var`) and Hsu's df (the fewer runs less one); 0 where it is not
        defined (a side zero, no spread), which leaves the permutation p alone."""
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            t = (self.log_ratio - log_r) / np.sqrt(self.t_var)
            p = 2.0 * sps.t.sf(np.abs(t), self.t_df)
        return np.where(np.isfinite(p), p, 0.0)

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


def _floored_var(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """max(v, f) per trial for one side's runs: v the cluster-robust relative variance of
    R = ΣS/ΣW (as `_Arm`), f the floor that the spread of the runs' log values S_i/W_i
    implies for a lognormal side, (e^{s²} − 1)·ΣW²/(ΣW)², s the sample sd of the logs (0
    where a run is zero: no floor). Why a floor: a heavy-tailed side with few runs usually
    lacks the rare large runs that make its mean, so v, read from the runs it has, is too
    small exactly when its mean is too small; the spread of the logs does not need the
    tail to show it."""
    g = np.full(x.shape[0], float(x.shape[1]))
    sw = w.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = x.sum(axis=1) / sw
        wbar = sw / g
        resid = ((x - r[:, None] * w) ** 2).sum(axis=1)
        v = resid / (wbar * wbar * g * (g - 1.0)) / (r * r)
        positive = np.asarray((x > 0).all(axis=1) & (w > 0).all(axis=1))
        logs = np.log(np.where(positive[:, None], x / w, 1.0))
        f = np.expm1(logs.var(axis=1, ddof=1)) * (w * w).sum(axis=1) / (sw * sw)
    return np.maximum(v, np.where(positive, f, 0.0))


def ratio_tests(xb: np.ndarray, wb: np.ndarray, xc: np.ndarray, wc: np.ndarray) -> RatioTests:
    """The report's test and interval for a batch of trials: arrays (trials, runs) of each
    run's summed value and weight, at least 2 runs a side; every side's value sum > 0.
    One implementation for the report (a batch of one) and its coverage simulation."""
    batch = _Batch(xb, wb, xc, wc)
    p1 = batch.p(np.zeros(xb.shape[0]))
    est = np.log(batch.ratio)
    lo = batch.bound(est, -1.0)
    hi = batch.bound(est, +1.0)
    lo_r, hi_r = np.exp(lo), np.exp(hi)
    holds_one = (np.isnan(lo_r) | (lo_r <= 1.0)) & (np.isnan(hi_r) | (hi_r >= 1.0))
    consistent = holds_one == (p1 >= ALPHA)
    return RatioTests(p1, lo_r, hi_r, consistent)


def ratio_p(
    xb: np.ndarray, wb: np.ndarray, xc: np.ndarray, wc: np.ndarray, ratio: float = 1.0
) -> np.ndarray:
    """The test's p of `ratio` for a batch of trials (as `ratio_tests`). The interval is
    the set of ratios this accepts, so it holds a ratio exactly when p >= alpha here (up to
    a gap, `RatioTests.p_at_bounds_ok`): the coverage simulation reads it at the truth."""
    batch = _Batch(xb, wb, xc, wc)
    return batch.p(np.full(xb.shape[0], math.log(ratio)))


def permutation_p(xb: np.ndarray, wb: np.ndarray, xc: np.ndarray, wc: np.ndarray) -> float:
    """The test's p alone, for one comparison (at ratio 1)."""
    return float(ratio_p(xb[None, :], wb[None, :], xc[None, :], wc[None, :])[0])


def _arrays(values: Values, weights: Values | None) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(values, dtype=float)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=float)
    if x.shape != w.shape:
        raise ValueError("values and weights differ in length")
    order = np.lexsort((w, x))  # sums and resamples that do not depend on the input order
    return x[order], w[order]


def side_value(values: Values, weights: Values | None = None) -> float | None:
    """ΣS/ΣW, None when there is no weight."""
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
    """Compare two sides' runs: each run's summed value with its weight (default 1)."""
    xb, wb = _arrays(baseline, baseline_weights)
    xc, wc = _arrays(candidate, candidate_weights)
    n = (len(xb), len(xc))
    vb = float(xb.sum() / wb.sum()) if wb.sum() > 0 else 0.0
    vc = float(xc.sum() / wc.sum()) if wc.sum() > 0 else 0.0

    def untested(why: str) -> Comparison:
        return Comparison(vb, vc, None if vb == 0 else vc / vb, None, None, n, None, why, why)

    if n[0] == 0 or n[1] == 0:
        return untested(f"not tested: no {'baseline' if n[0] == 0 else 'candidate'} data")
    if vb == 0 and vc == 0:
        return untested("not tested: zero on both sides")
    if min(n) < MIN_RUNS:
        return untested(
            f"not tested: needs at least {MIN_RUNS} runs per side (one run shows no "
            f"run-to-run variation), has {n[0]}+{n[1]}"
        )
    if vb == 0 or vc == 0:
        p = permutation_p(xb, wb, xc, wc)
        side = "baseline" if vb == 0 else "candidate"
        why = f"no ratio interval: the {side} is zero (p still tested)"
        ratio = None if vb == 0 else 0.0
        return Comparison(vb, vc, ratio, None, p, n, None, why if vb == 0 else None, why)
    ratio = vc / vb
    if min_p(*n) >= ALPHA:
        p = permutation_p(xb, wb, xc, wc)
        why = (
            f"no interval: {n[0]}+{n[1]} runs have no arrangement extreme enough to reject "
            f"any ratio (smallest p {min_p(*n):.3g})"
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
    """The smallest two-sided p the permutation test can give with n and m runs:
    2 / C(n+m, n) when every arrangement is enumerated, 2 / (N_RESAMPLES + 1) when they
    are sampled (the observed arrangement the only one as extreme); 1 below MIN_RUNS."""
    if n < MIN_RUNS or m < MIN_RUNS:
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
    if other < MIN_RUNS:
        return None
    for n in range(MIN_RUNS, _MAX_NEEDED + 1):
        if min_attainable_p(n, other, family) < alpha:
            return n
    return None


def needed_per_side(alpha: float = ALPHA, family: int = 1) -> int:
    """The fewest observations per side (equal sizes) that can reach an adjusted p < alpha."""
    k = MIN_RUNS
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
    if best < alpha:
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
        "min_runs": MIN_RUNS,
        "blocking": "none: each run is one observation (its windows and checkpoints summed)",
        "bootstrap": "none: the interval inverts the permutation test",
        "unit": "run: each run's summed value and weight is one observation; nothing inside "
        "a run (checkpoints, windows) is resampled, so dependence inside a run and "
        "run-to-run variation are both in the variance",
        "skip_warmup": skip_warmup,
        "test": f"{TEST}: statistic T = log(R_c/R_b) / sqrt(v_b + v_c), R = ΣS/ΣW over a "
        "side's runs, v its cluster-robust relative variance; every arrangement of whole "
        f"runs up to {N_RESAMPLES}, else {N_RESAMPLES} seeded random ones (seed {SEED}); "
        "the Welch test's v is at least (e^{s^2} - 1)·ΣW²/(ΣW)², s the sd of the log of "
        "the side's run values, its df the fewer runs less one",
        "interval": f"{CI_METHOD}: the ratios r for which the test of candidate/r against "
        f"baseline keeps p >= {ALPHA:g}; none where no arrangement can reach it",
        "method": "ratio of means over runs, tested by a studentized permutation test of "
        "whole runs and a floored Welch test (p the larger), with the interval from "
        "inverting the same p",
    }


# the fewest values whose order statistics give the median a 95% interval: (min, max) of
# 6 covers 1 - 2/64 = 0.969; of 5 only 0.9375
def median_interval(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """The median of `values` (one per run) and its distribution-free interval: the
    order statistics (x_(k), x_(n-k+1)) with the largest k whose coverage
    1 - 2·P(Binomial(n, ½) ≤ k-1) is at least `level` (exact for any continuous
    distribution of independent runs). `ci95` is None when no k reaches it (n < 6)."""
    xs = sorted(float(v) for v in values)
    n = len(xs)
    out: dict[str, Any] = {
        "median": float(np.median(xs)) if xs else None,
        "ci95": None,
        "coverage": None,
        "n": n,
        "method": "order statistics of the runs' values (distribution-free)",
    }
    best = None
    for k in range(1, n // 2 + 1):
        coverage = 1.0 - 2.0 * float(sps.binom.cdf(k - 1, n, 0.5))
        if coverage >= level:
            best = (k, coverage)
    if best is not None:
        k, coverage = best
        out["ci95"], out["coverage"] = [xs[k - 1], xs[n - k]], coverage
    return out
