"""Coverage of the report's 95% ratio interval on lognormal data, to ±1% (95%): 2000 trials
per case (1.96 √(0.95·0.05/2000) = 0.0096). The CI test (tests/report/test_report_coverage.py)
runs fewer; this is the figure docs/benchmarks.md quotes.

    .venv/bin/python -m bench.report_coverage [--trials 2000]
"""

from __future__ import annotations

import argparse
import json
import math
import time

from tests.report_coverage import TRUE_RATIO, coverage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=2000)
    args = parser.parse_args()
    rows = []
    for sigma in (0.5, 1.0):
        for n in (6, 10, 30):
            t0 = time.perf_counter()
            got, unbounded = coverage(sigma, n, args.trials, seed=1000 + n * 10 + int(sigma * 2))
            half = 1.96 * math.sqrt(got * (1 - got) / args.trials)
            rows.append(
                {
                    "sigma": sigma,
                    "n_per_side": n,
                    "trials": args.trials,
                    "true_ratio": TRUE_RATIO,
                    "coverage": round(got, 4),
                    "ci95": [round(got - half, 4), round(got + half, 4)],
                    "unbounded": unbounded,
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
