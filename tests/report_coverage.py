"""The report's own test and interval (profiler.report.stats.ratio_tests, the function
`compare` calls) simulated on the data that broke the per-episode test: stalls that are
autocorrelated inside a run, runs that differ from each other, sides of different shape,
and 4-30 runs a side. Shared by the CI test and the bench.

A side is G runs of k checkpoints. A checkpoint's stall is lognormal: log-stall = σ·z_t +
u, z an AR(1) series in time order inside the run with lag-1 correlation φ (unit variance),
u ~ N(0, run_sd²) one draw per run (the run's page cache, node, neighbours). Every side is
scaled to mean 1 (E = exp(σ²/2 + run_sd²/2)), and the candidate then by the true ratio, so
the truth is a ratio of means, the figure the report shows. Each run enters the test as
(Σ its stalls, k), as build.py gives it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from serwatt.profiler.report import stats

TRUE_RATIO = 0.7
BATCH = 100  # trials per vectorized call: (arrangements x 100) arrays stay ~8 MB each


@dataclass(frozen=True)
class Side:
    runs: int
    per_run: int  # checkpoints a run
    sigma: float  # log-sd of one stall
    phi: float = 0.0  # lag-1 correlation of log-stalls inside a run
    run_sd: float = 0.0  # log-sd of the run's own level


@dataclass(frozen=True)
class Case:
    name: str
    baseline: Side
    candidate: Side


CASES: tuple[Case, ...] = (
    *(
        Case(f"lag-1 autocorrelation 0.4, {g} runs x 5", Side(g, 5, 0.5, 0.4), Side(g, 5, 0.5, 0.4))
        for g in (4, 6, 10, 30)
    ),
    *(
        Case(
            f"run effect log sd 0.15, {g} runs x {k}",
            Side(g, k, 0.5, 0, 0.15),
            Side(g, k, 0.5, 0, 0.15),
        )
        for g, k in ((2, 16), (4, 8))
    ),
    Case("unequal shapes sigma 1.4 (8) vs 0.8 (18)", Side(8, 1, 1.4), Side(18, 1, 0.8)),
    Case("unequal shapes sigma 0.8 (8) vs 1.4 (18)", Side(8, 1, 0.8), Side(18, 1, 1.4)),
    *(
        Case(f"independent lognormal sigma 1, {g} runs x 1", Side(g, 1, 1.0), Side(g, 1, 1.0))
        for g in (4, 6, 10, 30)
    ),
)


def stalls(side: Side, trials: int, rng: np.random.Generator) -> np.ndarray:
    """(trials, runs, per_run) stalls with mean 1."""
    e = rng.standard_normal((trials, side.runs, side.per_run))
    z = np.empty_like(e)
    z[..., 0] = e[..., 0]
    for t in range(1, side.per_run):
        z[..., t] = side.phi * z[..., t - 1] + math.sqrt(1 - side.phi**2) * e[..., t]
    u = side.run_sd * rng.standard_normal((trials, side.runs, 1))
    return np.exp(side.sigma * z + u - (side.sigma**2 + side.run_sd**2) / 2)


@dataclass(frozen=True)
class Result:
    trials: int
    false_positive: float  # A/A: p < alpha with the same law on both sides
    coverage: float  # the interval holds TRUE_RATIO
    unbounded: int  # trials whose p never fell below alpha at any ratio (open interval)

    @staticmethod
    def margin(share: float, trials: int) -> float:
        """The 95% Monte-Carlo half-width of a share from `trials` trials."""
        return 1.96 * math.sqrt(max(share * (1 - share), 1e-12) / trials)


def run_case(case: Case, trials: int, seed: int = 0) -> Result:
    """A/A false positives and coverage of TRUE_RATIO, each from its own `trials` draws.
    Coverage is read as p(TRUE_RATIO) >= alpha: the interval is the set of ratios the
    test accepts (tests/report/test_report_coverage.py checks the two agree)."""
    rng = np.random.default_rng(seed)
    rejected = covered = 0
    b, c = case.baseline, case.candidate
    for start in range(0, trials, BATCH):
        t = min(BATCH, trials - start)
        wb, wc = np.full((t, b.runs), float(b.per_run)), np.full((t, c.runs), float(c.per_run))
        # A/A: both sides from their own laws, equal means
        p = stats.ratio_p(stalls(b, t, rng).sum(2), wb, stalls(c, t, rng).sum(2), wc)
        rejected += int((p < stats.ALPHA).sum())
        xc = stalls(c, t, rng).sum(2) * TRUE_RATIO
        p = stats.ratio_p(stalls(b, t, rng).sum(2), wb, xc, wc, TRUE_RATIO)
        covered += int((p >= stats.ALPHA).sum())
    unbounded = trials if stats.min_p(b.runs, c.runs) >= stats.ALPHA else 0
    return Result(trials, rejected / trials, covered / trials, unbounded)
