"""Cost of Classifier.classify() per sample, on the recorded real py-spy samples.

    .venv/bin/python bench/classify_cost.py [--repeat N] [--no-prefilter]

Four cases, each the median of N runs over every sample in tests/fixtures/pyspy/:
- cold: a fresh Classifier (parses the workload source, matches every rule);
- cold, host paths: the same without the capture-time root, so leaves in the stdlib
  and site-packages are read from this host (what a fresh daemon or `serwatt demo`
  meets: library files with no serializer call, read and, without the call-site
  prefilter, parsed);
- new stack: rule/frame and call-site caches warm, but the stack itself never seen
  (what a deep pure-Python serializer that keeps producing new stacks costs);
- warm: the same stacks again (the steady state of a training loop).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from serwatt.profiler.classify.classifier import Classifier  # noqa: E402
from tests.workloads.harness import samples_from_dump  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "pyspy"


def load_samples(root: Path) -> list:
    samples = []
    for path in sorted(FIXTURES.glob("*.json")):
        doc = json.loads(path.read_text())
        for path, copy in doc["sources"].items():
            dst = root / path.lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(FIXTURES / copy, dst)
        for dump in doc["dumps"]:
            samples.extend(s for s in samples_from_dump(dump) if s.frames)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--no-prefilter",
        action="store_true",
        help="parse every leaf file (Classifier(callsite_prefilter=False)): the reference",
    )
    args = parser.parse_args()
    options = {"callsite_prefilter": not args.no_prefilter}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        samples = load_samples(root)
        n = len(samples)
        depth = statistics.mean(len(s.frames) for s in samples)
        cold, host, fresh, warm = [], [], [], []
        parses = filtered = 0
        for _ in range(args.repeat):
            h = Classifier.default(**options)
            t0 = time.perf_counter()
            for s in samples:
                h.classify(s)
            host.append((time.perf_counter() - t0) / n)
            parses, filtered = h.stats.source_parses, h.stats.sources_prefiltered
            c = Classifier.default(**options)
            t0 = time.perf_counter()
            for s in samples:
                c.classify(s, proc_root=root)
            cold.append((time.perf_counter() - t0) / n)
            t0 = time.perf_counter()
            for s in samples:
                c._stacks.clear()  # bench only: force the stack walk with warm rule caches
                c.classify(s, proc_root=root)
            fresh.append((time.perf_counter() - t0) / n)
            t0 = time.perf_counter()
            for _ in range(20):
                for s in samples:
                    c.classify(s, proc_root=root)
            warm.append((time.perf_counter() - t0) / (20 * n))
    print(f"samples: {n} (mean depth {depth:.1f} frames), median of {args.repeat} runs")
    print(f"call-site prefilter: {'off' if args.no_prefilter else 'on'}")
    print(
        f"cold (fresh classifier, parses sources): {statistics.median(cold) * 1e6:8.1f} us/sample"
    )
    print(
        f"cold, leaves read from host paths:       {statistics.median(host) * 1e6:8.1f} us/sample"
        f" (source files parsed {parses}, read but not parsed {filtered})"
    )
    print(
        f"new stack, warm rule/source caches:      {statistics.median(fresh) * 1e6:8.1f} us/sample"
    )
    print(
        f"warm (stack cache hit):                  {statistics.median(warm) * 1e6:8.1f} us/sample"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
