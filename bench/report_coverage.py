"""The report's A/A false positives and coverage on the cases of issue 46 (autocorrelation
inside runs, run effects, unequal shapes, 4-30 runs a side), through the report's own test
(tests/report_coverage.py), each with its 95% Monte-Carlo interval. 2000 trials a case
give +-1% at 5%. The CI test (tests/report/test_report_coverage.py) runs fewer.

    .venv/bin/python -m bench.report_coverage [--trials 2000]
"""

from __future__ import annotations

import argparse
import json
import time

from tests.report_coverage import CASES, TRUE_RATIO, Result, run_case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=2000)
    args = parser.parse_args()
    for k, case in enumerate(CASES):
        t0 = time.perf_counter()
        got = run_case(case, args.trials, seed=1000 + k)
        fp, cov = got.false_positive, got.coverage
        row = {
            "case": case.name,
            "trials": args.trials,
            "true_ratio": TRUE_RATIO,
            "aa_false_positive": round(fp, 4),
            "aa_mc_ci95": [round(fp - Result.margin(fp, args.trials), 4),
                           round(fp + Result.margin(fp, args.trials), 4)],
            "coverage": round(cov, 4),
            "coverage_mc_ci95": [round(cov - Result.margin(cov, args.trials), 4),
                                 round(cov + Result.margin(cov, args.trials), 4)],
            "unbounded": got.unbounded,
            "seconds": round(time.perf_counter() - t0, 1),
        }  # fmt: skip
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
