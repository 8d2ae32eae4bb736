"""bench/profile_coverage.py at smoke size (issue 46 ask 7): its output has the bench's shape,
each coverage is its runs' count, its Monte-Carlo interval is Clopper-Pearson's, and each
verdict is the one that interval gives. Figures are not checked: the bench measures them
(docs/benchmarks.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

from tests.benches import BENCH_DIR

NUM = r"(-?[0-9.]+|nan)"


@pytest.mark.serial  # the mix workload keeps a CPU busy for ~20 s
def test_profile_coverage_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "fig.json"
    # 20 Hz, not the budget's 5-8: 4 s then carries enough samples for an interval, and
    # the options after -- reach serwatt profile
    r = subprocess.run(
        [sys.executable, str(BENCH_DIR / "profile_coverage.py"), "--runs", "2", "--duration",
         "4", "--json", str(out), "--", "--cpu-budget", "off", "--rate", "20"],
        cwd=BENCH_DIR.parent, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert r.returncode in (0, 1), r.stderr[-3000:]
    assert "serwatt profile defaults --cpu-budget off --rate 20" in r.stdout, r.stdout
    assert len(re.findall(r"^run [12] this tree: \d+ samples, ", r.stdout, re.M)) == 2, r.stdout
    fig = json.loads(out.read_text())["this tree"]
    assert fig["runs"] == len(fig["per_run"]) == 2
    rows = re.findall(
        rf"^(pickle|json|protobuf|msgpack|other) +{NUM}% +{NUM}% +{NUM}pp +(\d+) +(\d+)/(\d+) +"
        rf"{NUM} \[{NUM}, {NUM}\]  (confirmed|not met|undecided)$",
        r.stdout,
        re.M,
    )
    assert [row[0] for row in rows] == ["pickle", "json", "protobuf", "msgpack", "other"], r.stdout
    for cp, *_, covered, runs, cov, lo, hi, word in rows:
        f = fig["codepaths"][cp]
        k, n = int(covered), int(runs)
        assert n == 2 - fig["said"]
        # covered: the runs whose printed interval held the truth
        held = sum(
            1
            for p in fig["per_run"]
            if not (p["too_short"] or p["contended"])
            and p["share_ci95"][cp] is not None
            and p["share_ci95"][cp][0] <= p["truth"][cp] <= p["share_ci95"][cp][1]
        )
        assert (k, n) == (f["covered"], f["runs"]) and k == held
        if n:
            assert float(cov) == pytest.approx(k / n, abs=5e-4)
            ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
            assert (float(lo), float(hi)) == pytest.approx((ci.low, ci.high), abs=5e-4)
            goal = 0.93
            want = "confirmed" if ci.low >= goal else "not met" if ci.high < goal else "undecided"
            assert word == want and f["verdict"] == want
    pooled = rf"^all +{NUM} \[{NUM}, {NUM}\]  (confirmed|not met|undecided) \(per-run"
    m = re.search(pooled, r.stdout, re.M)
    assert m, r.stdout
    plo, phi = float(m.group(2)), float(m.group(3))
    if plo == plo:  # an interval (not nan: every run too short)
        want = "confirmed" if plo >= 0.93 else "not met" if phi < 0.93 else "undecided"
        assert m.group(4) == want == fig["pooled_verdict"]
    every = re.search(r"^every run, those that said so included: (.*)$", r.stdout, re.M)
    assert every, r.stdout
    assert every.group(1) == ", ".join(f"{cp} {k}/2" for cp, k in fig["covered_every_run"].items())
    assert re.search(r"^truth's own edge error: .* is [0-9.]+ pp$", r.stdout, re.M), r.stdout
    assert r.returncode == (1 if "not met" in r.stdout.split("\n== this tree", 1)[1] else 0)


def test_profile_coverage_bench_refuses_one_run() -> None:
    r = subprocess.run(
        [sys.executable, str(BENCH_DIR / "profile_coverage.py"), "--runs", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and "--runs must be >= 2: the coverage needs an interval" in r.stderr
