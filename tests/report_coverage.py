"""The report's own interval procedure simulated on skewed data: coverage of the ratio of
means' 95% interval (profiler.report.stats.ratio_tests, the function `compare` calls) on
lognormal sides that differ by a known factor. Shared by the CI test and the bench."""

from __future__ import annotations

import numpy as np

from profiler.report import stats

TRUE_RATIO = 0.7
BATCH = 200  # trials per vectorized call: (arrangements x 200) arrays stay ~16 MB


def coverage(sigma: float, n: int, trials: int, seed: int = 0) -> tuple[float, int]:
    """(share of trials whose interval holds TRUE_RATIO, trials with no bound)."""
    rng = np.random.default_rng(seed)
    covered = unbounded = 0
    for start in range(0, trials, BATCH):
        t = min(BATCH, trials - start)
        xb = rng.lognormal(0.0, sigma, (t, n))
        xc = rng.lognormal(0.0, sigma, (t, n)) * TRUE_RATIO
        w = np.ones((t, n))
        res = stats.ratio_tests(xb, w, xc, w)
        lo = np.where(np.isnan(res.lo), 0.0, res.lo)
        hi = np.where(np.isnan(res.hi), np.inf, res.hi)
        covered += int(((lo <= TRUE_RATIO) & (TRUE_RATIO <= hi)).sum())
        unbounded += int((np.isnan(res.lo) | np.isnan(res.hi)).sum())
    return covered / trials, unbounded


def one_sided_margin(trials: int, target: float = 0.93, z: float = 2.326) -> float:
    """How far below `target` an estimate from `trials` trials may fall at one-sided 99%
    before it shows that the coverage is below target."""
    return z * float(np.sqrt(target * (1 - target) / trials))
