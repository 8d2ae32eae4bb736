"""The profile's share interval (profile/document.py, issue 46 ask 7): exact at no sample,
its coverage on simulated samples with a known share, and the run that is too short for
it or too contended, said in the table's first lines. Pure maths and a synthetic
document: no timing."""

from __future__ import annotations

import random
from typing import Any

import pytest
from scipy import stats

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.intervals import clopper_pearson
from serwatt.profiler.profile.document import (
    CONTENDED_WAIT_PER_CPU,
    MIN_INTERVAL_SAMPLES,
    contended,
    share_ci95,
    too_short,
)
from serwatt.profiler.profile.table import render_table


def test_a_codepath_with_no_sample_gets_the_exact_upper_bound_not_zero_width() -> None:
    # 12 one-second batches of a 6 Hz thread: 72 samples, none in json
    rows = [{"pickle": 0.3, "other": 0.7} for _ in range(12)]
    lo, hi = share_ci95(rows, "json", samples=72)  # type: ignore[misc]
    # Clopper-Pearson's 0 of n, n the samples less what 11 batch df cost (Korn-Graubard)
    n = 72 * (stats.t.ppf(0.975, 71) / stats.t.ppf(0.975, 11)) ** 2
    assert lo == 0.0
    assert hi == pytest.approx(1 - 0.025 ** (1 / n), rel=1e-9)
    assert hi == pytest.approx(stats.beta.ppf(0.975, 1, n), rel=1e-9)
    assert 0.05 < hi < 0.07
    # all samples in one codepath: [exact lower bound, 1]
    lo, hi = share_ci95([{"pickle": 1.0} for _ in range(12)], "pickle", samples=72)  # type: ignore[misc]
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / n), rel=1e-9)


def test_clopper_pearson_matches_scipy_and_takes_effective_counts() -> None:
    for k, n in [(0, 60), (1, 60), (30, 60), (60, 60), (3, 7)]:
        ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
        assert clopper_pearson(k, n) == pytest.approx((ci.low, ci.high), abs=1e-9)
    lo, hi = clopper_pearson(2.5, 40.3)
    assert (lo, hi) == pytest.approx(
        (stats.beta.ppf(0.025, 2.5, 38.8), stats.beta.ppf(0.975, 3.5, 37.8)), rel=1e-9
    )
    with pytest.raises(ValueError, match="0 <= x <= n"):
        clopper_pearson(5, 4)


def _independent_rows(p: float, rng: random.Random) -> tuple[list[dict[str, float]], int]:
    """12 one-second batches of 6 independent samples (py-spy's Poisson ticks at the default
    budget's 6 Hz), each in the codepath with probability p, each carrying 1/6 CPU-s."""
    rows, hits = [], 0
    for _ in range(12):
        k = sum(rng.random() < p for _ in range(6))
        rows.append({"x": k / 6, "other": (6 - k) / 6})
        hits += k
    return rows, hits


@pytest.mark.parametrize("p", [0.015, 0.05, 0.25, 0.5])
def test_the_interval_covers_a_known_share_at_the_default_rate(p: float) -> None:
    """Coverage >= 0.93 (the issue's goal) at a few samples a batch, where a batch-means t
    interval covered 0.66 at 1.5% and 0.88 at 5%; and the price of not knowing that the
    samples were independent is bounded: at most 1.3x the width of Clopper-Pearson on
    the true count."""
    rng = random.Random(46)
    reps, hits, width, exact_width = 1000, 0, 0.0, 0.0
    for _ in range(reps):
        rows, k = _independent_rows(p, rng)
        lo, hi = share_ci95(rows, "x", samples=72)  # type: ignore[misc]
        hits += lo <= p <= hi
        width += hi - lo
        a, b = clopper_pearson(k, 72)
        exact_width += b - a
    assert hits / reps >= 0.93
    assert width / exact_width <= 1.3


def test_the_interval_widens_for_samples_that_stay_in_a_codepath() -> None:
    """A thread that stays in the codepath for ~10 consecutive samples (a two-state chain, 20
    batches of 50 samples): batch means lower the effective count, so the interval still
    covers, where Clopper-Pearson on the 1000 samples as if independent covers far less."""
    rng = random.Random(46)
    p, leave = 0.25, 0.1
    enter = p * leave / (1 - p)
    reps, hits, naive = 400, 0, 0
    for _ in range(reps):
        inside, rows, total = rng.random() < p, [], 0
        for _ in range(20):
            k = 0
            for _ in range(50):
                inside = rng.random() >= leave if inside else rng.random() < enter
                k += inside
            rows.append({"x": k / 50, "other": (50 - k) / 50})
            total += k
        lo, hi = share_ci95(rows, "x", samples=1000)  # type: ignore[misc]
        hits += lo <= p <= hi
        a, b = clopper_pearson(total, 1000)
        naive += a <= p <= b
    assert hits / reps >= 0.93
    assert naive / reps < 0.6


def test_too_short_says_why_and_names_the_options() -> None:
    rows = [{"pickle": 0.3, "other": 0.7} for _ in range(12)]
    assert too_short(rows, 72, 12.3) is None
    assert too_short(rows, 0, 12.3) is None  # nothing sampled: the table's own first line
    why = too_short(rows[:1], 6, 1.4)
    assert why is not None and "1 one-second batch(es)" in why and "need 2" in why
    # 3 s at 6 Hz: 18 samples, and 2 batch df cost most of them
    why = too_short(rows[:3], 18, 3.2)
    assert why is not None and "effective samples in 3.2 s" in why
    for option in ("--duration", "--cpu-budget", "--rate"):
        assert option in why
    # the bound: just over MIN_INTERVAL_SAMPLES after the t ratio is not too short
    assert too_short(rows * 3, 2 * MIN_INTERVAL_SAMPLES, 36.0) is None


def _doc(too_short_why: str | None, samples: int = 60) -> dict[str, Any]:
    row = {
        "samples": 0, "cpu_s": 0.0, "share": 0.0, "share_ci95": [0.0, 0.06], "wall_s": 0.0,
        "low_confidence_share": 0.0,
    }  # fmt: skip
    return {
        "target": {"pid": 1, "command": "python x.py", "python": "3.11.7"},
        "duration_s": 3.2,
        "rate_hz": 50,
        "samples": samples,
        "cpu_s": 3.0,
        "codepaths": {cp: dict(row) for cp in CODEPATHS},
        "low_confidence_cpu_share": 0.0,
        "share_ci95_too_short": too_short_why,
        "sampler": {
            "pyspy_samples": samples,
            "pyspy_errors": 0,
            "partial_stacks": 0,
            "behind_s": 0.0,
            "windows": 1,
            "window_failures": {},
        },  # fmt: skip
        "energy": {"source": "unavailable", "reason": "off"},
    }


def test_the_table_says_too_short_in_its_first_line() -> None:
    why = "9 effective samples in 3.2 s (under 20), so ...: profile longer (--duration)"
    first = render_table(_doc(why)).splitlines()[0]
    assert first == f"serwatt profile: TOO SHORT FOR ITS SHARE INTERVALS: {why}"
    assert not render_table(_doc(None)).splitlines()[0].startswith("serwatt profile: TOO SHORT")
    # a run that sampled nothing says that instead
    empty = _doc(why, samples=0)
    empty["cpu_s"] = 0.0
    assert "NOTHING WAS SAMPLED" in render_table(empty).splitlines()[0]


def test_contended_says_when_the_wait_reaches_the_cpu() -> None:
    assert contended(0.0, 6.0) is None
    assert contended(0.99 * 6.0, 6.0) is None
    assert contended(1.0, 0.0) is None  # no CPU: no share to be biased
    why = contended(CONTENDED_WAIT_PER_CPU * 6.0, 6.0)
    assert why is not None and f"waited {CONTENDED_WAIT_PER_CPU:.1f} s" in why
    assert "--kernel-timeline" in why
    assert "8.5 s in the run queue per CPU-second" in (contended(51.0, 6.0) or "")


def test_the_table_says_contended_in_its_first_lines() -> None:
    why = "the target waited 8.5 s in the run queue per CPU-second it ran: ..."
    doc = _doc(None)
    doc["share_ci95_contended"] = why
    first = render_table(doc).splitlines()[0]
    assert first == f"serwatt profile: CONTENDED, SHARES MAY BE OFF BEYOND THEIR INTERVALS: {why}"
    doc["share_ci95_too_short"] = "9 effective samples"
    lines = render_table(doc).splitlines()
    assert lines[0].startswith("serwatt profile: TOO SHORT FOR ITS SHARE INTERVALS: 9 eff")
    assert lines[1].startswith("serwatt profile: CONTENDED, SHARES MAY BE OFF")
