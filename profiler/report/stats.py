"""The report's statistics: blocking, bootstrap intervals, Mann-Whitney U, Holm, minimum n.

Windows of one process are autocorrelated (a slow stretch of a noisy node spans several),
so they are not tested one by one. The windows of each (run, pid) series, in time order,
are grouped into consecutive blocks and each block becomes one observation, its rate
Σvalue / Σwindow-seconds. Block length rule: L = max(1, round(n^(1/3))) windows for a
series of n windows (the n^(1/3) growth of Hall, Horowitz and Jing 1995 for block
resampling), and the series is split into ⌊n/L⌋ consecutive blocks of near-equal size
(numpy.array_split), so no window is dropped and no block spans two series. Checkpoint
episodes are minutes apart and are taken as independent observations, unblocked.

Per comparison (observations x_i with weights w_i: window-seconds for blocks, 1 for
episodes):
- each side's value is Σx/Σw; the change is the ratio candidate/baseline of those values;
- the 95% interval of the ratio comes from scipy.stats.bootstrap, resampling each side's
  observations independently (BCa; the percentile method when BCa is degenerate, e.g.
  all values equal), 9999 resamples, a fixed seed so a report is reproducible;
- p is scipy.stats.mannwhitneyu, two-sided, on the per-observation values x_i/w_i;
- the family of every p in one report is Holm-corrected (`holm`); a change is
  significant only when its corrected p < 0.05.
scipy has no Holm (false_discovery_control is Benjamini-Hochberg/Yekutieli), so `holm`
is the five-line step-down, tested against a hand-worked table.

Minimum n: with n and m observations and no ties, the smallest two-sided U-test p is
that of two fully separated samples (2 / C(n+m, n)); `min_p` takes it from scipy's exact
distribution, and `power_warning` says how many observations a side needs before any
outcome could reach p < alpha.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
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
_MAX_NEEDED = 10_000  # search bound for `needed_n`


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


# --------------------------------------------------------------------------- comparison


@dataclass(frozen=True)
class Comparison:
    """One metric compared between the sides.

    baseline, candidate: Σx/Σw per side; ratio: candidate/baseline (None when the
    baseline is zero); ci95: the ratio's 95% interval, a bound None when unbounded
    (None when no interval could be formed, `note` says why); p: two-sided Mann-Whitney
    U (None when not tested); n: observations per side; ci_method: BCa or percentile.
    """

    baseline: float
    candidate: float
    ratio: float | None
    ci95: tuple[float | None, float | None] | None
    p: float | None
    n: tuple[int, int]
    ci_method: str | None
    note: str | None


def _rates(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(weights > 0, values / np.where(weights > 0, weights, 1.0), 0.0)


def _finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _bootstrap(
    data: tuple[np.ndarray, ...], statistic: Any
) -> tuple[tuple[float | None, float | None] | None, str | None]:
    """Run scipy's bootstrap, BCa first, percentile when BCa is degenerate."""
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            res = sps.bootstrap(
                data,
                statistic,
                n_resamples=N_RESAMPLES,
                vectorized=True,
                confidence_level=CONFIDENCE,
                method=method,
                rng=np.random.default_rng(SEED),
            )
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
        if math.isnan(lo) or math.isnan(hi):
            continue
        return (_finite_or_none(lo), _finite_or_none(hi)), method
    return None, None


def _ratio_statistic(xb: np.ndarray, wb: np.ndarray, xc: np.ndarray, wc: np.ndarray) -> Any:
    # scipy resamples the index arrays, so each observation's value and weight move together.
    def statistic(ib: np.ndarray, ic: np.ndarray, axis: int = -1) -> np.ndarray:
        ib = ib.astype(np.intp)
        ic = ic.astype(np.intp)
        with np.errstate(divide="ignore", invalid="ignore"):
            base = xb[ib].sum(axis=axis) / wb[ib].sum(axis=axis)
            cand = xc[ic].sum(axis=axis) / wc[ic].sum(axis=axis)
            return cand / base

    return statistic


def _value_statistic(x: np.ndarray, w: np.ndarray) -> Any:
    def statistic(i: np.ndarray, axis: int = -1) -> np.ndarray:
        i = i.astype(np.intp)
        with np.errstate(divide="ignore", invalid="ignore"):
            return x[i].sum(axis=axis) / w[i].sum(axis=axis)

    return statistic


def _arrays(values: Values, weights: Values | None) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(values, dtype=float)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=float)
    if x.shape != w.shape:
        raise ValueError("values and weights differ in length")
    return x, w


def side_value(values: Values, weights: Values | None = None) -> float | None:
    """Σx/Σw, None when there is no weight."""
    x, w = _arrays(values, weights)
    total_w = float(w.sum())
    return float(x.sum()) / total_w if total_w > 0 else None


def value_interval(
    values: Values, weights: Values | None = None
) -> tuple[float | None, float | None] | None:
    """95% bootstrap interval of one side's Σx/Σw; None with fewer than 2 observations."""
    x, w = _arrays(values, weights)
    if len(x) < 2 or float(w.sum()) <= 0:
        return None
    ci, _ = _bootstrap((np.arange(len(x)),), _value_statistic(x, w))
    return ci


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
    if n[0] == 0 or n[1] == 0:
        side = "baseline" if n[0] == 0 else "candidate"
        return Comparison(vb, vc, None, None, None, n, None, f"not tested: no {side} data")
    if vb == 0 and vc == 0:
        return Comparison(vb, vc, None, None, None, n, None, "not tested: zero on both sides")
    p = float(sps.mannwhitneyu(_rates(xb, wb), _rates(xc, wc), alternative="two-sided").pvalue)
    if vb == 0:
        return Comparison(
            vb, vc, None, None, p, n, None, "no ratio: the baseline is zero (p still tested)"
        )
    ratio = vc / vb
    if min(n) < 2:
        return Comparison(vb, vc, ratio, None, p, n, None, "no interval: needs at least 2 per side")
    ci, method = _bootstrap((np.arange(n[0]), np.arange(n[1])), _ratio_statistic(xb, wb, xc, wc))
    note = None
    if ci is None:
        note = "no interval: the bootstrap was degenerate"
    elif ci[0] is None or ci[1] is None:
        note = "interval unbounded: some resamples had a zero baseline"
    return Comparison(vb, vc, ratio, ci, p, n, method, note)


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
    """The smallest two-sided Mann-Whitney U p-value any samples of sizes n and m can give
    (fully separated, no ties), from scipy's exact null distribution."""
    if n < 1 or m < 1:
        return 1.0
    x = np.arange(n, dtype=float)
    y = np.arange(n, n + m, dtype=float)
    return float(sps.mannwhitneyu(x, y, alternative="two-sided", method="exact").pvalue)


def needed_n(other: int, alpha: float = ALPHA) -> int | None:
    """The fewest observations on one side that, against `other` on the other side, can
    reach p < alpha; None when none up to 10,000 can (other < 1)."""
    if other < 1:
        return None
    for n in range(1, _MAX_NEEDED + 1):
        if min_p(n, other) < alpha:
            return n
    return None


def needed_per_side(alpha: float = ALPHA) -> int:
    """The fewest observations per side (equal sizes) that can reach p < alpha."""
    k = 1
    while min_p(k, k) >= alpha:
        k += 1
    return k


@dataclass(frozen=True)
class PowerWarning:
    """Too few observations for any outcome to reach p < alpha."""

    unit: str
    n: tuple[int, int]
    needed_per_side: int
    needed_baseline: int | None  # with the candidate's n as it is
    needed_candidate: int | None  # with the baseline's n as it is
    message: str


def power_warning(
    n_baseline: int, n_candidate: int, unit: str, alpha: float = ALPHA
) -> PowerWarning | None:
    """A warning when no outcome with these sizes can reach p < alpha, else None."""
    if n_baseline >= 1 and n_candidate >= 1 and min_p(n_baseline, n_candidate) < alpha:
        return None
    k = needed_per_side(alpha)
    nb = needed_n(n_candidate, alpha)
    nc = needed_n(n_baseline, alpha)
    alternatives = []
    if nb is not None and nb > n_baseline:
        alternatives.append(f"{nb} baseline {unit} with the candidate's {n_candidate}")
    if nc is not None and nc > n_candidate:
        alternatives.append(f"{nc} candidate {unit} with the baseline's {n_baseline}")
    message = (
        f"too few {unit} to ever reach p < {alpha:g}: baseline {n_baseline}, candidate "
        f"{n_candidate}; needs at least {k} per side"
        + (f" (or {' or '.join(alternatives)})" if alternatives else "")
    )
    return PowerWarning(unit, (n_baseline, n_candidate), k, nb, nc, message)
