"""Fixtures shared across test modules.

Where a new test goes (markers in pyproject.toml, the targets in the Makefile): unmarked,
it runs in `make test`, before every commit, on a loaded machine too, so its bounds must
hold at any load (a claim covering the truth, not a quiet machine's figure). Mark it
`long` when it takes over ~15 s on a quiet machine (`--durations`) and is not its
component's only real-process test, and `serial` when it holds a figure only a quiet
machine gives (time, CPU shares, scheduling; measure the load and say it:
tests/node_load.py); both run in `make check`.

Session-scoped fixtures here are per process: under pytest-xdist each worker has its own
session, so a worker that runs none of a fixture's tests never starts it, and two workers
that both do start one each. (xdist_group cannot pin them to one worker: with pytest 9.2
and xdist 3.8 --dist loadgroup does not group, pytest-xdist issue 1386.)
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import settings

from tests.daemon_support import start_daemon, start_powercap, start_workload, stop_process

# Hypothesis's per-example deadline (200 ms) is a quiet machine's figure, not a property of
# the code: at load 17-25 test_series and test_weighting::test_conservation failed it with
# 337 ms examples that ran in 0.02 ms when replayed. A property test that must be fast
# says so with its own bound.
settings.register_profile("serwatt", deadline=None)
settings.load_profile("serwatt")


@dataclass(frozen=True)
class DaemonScrape:
    """One /metrics page of a real daemon, and how that daemon ended."""

    text: str
    pid: int
    exit_code: int
    log: str


# The first slot's records and the daemon's own CPU: series the page has once a slot
# after the first window was applied (docs/scaling.md's formula counts them).
_FIRST_SLOT_SERIES = (
    'serwatt_collector_up{collector="recorder"}',
    'serwatt_self_cpu_seconds_total{part="samplers"}',
)


@pytest.fixture(scope="session")
def daemon_scrape(tmp_path_factory: pytest.TempPathFactory) -> DaemonScrape:
    """A real daemon over a real workload ("trainer") and a target with no process
    ("absent"), RAPL from a powercap tree advanced at 30 W, no GPU: its /metrics once
    every series has come, then a clean stop. For the tests that only read /metrics
    (test_metrics_contract, test_scaling); everything is stopped before they run."""
    tmp: Path = tmp_path_factory.mktemp("daemon_scrape")
    sysfs = tmp / "sys"
    advancer = start_powercap(sysfs, 30.0)
    # the workload's marker names this process: each xdist worker's daemon sees its own
    marker = f"scrape_trainer_{os.getpid()}"
    work = start_workload(tmp, marker)
    d = start_daemon(tmp, {"trainer": marker, "absent": "no_such_process_xyz"}, sysfs=sysfs)
    try:
        d.wait_metric("serwatt_samples_total", 5, target="trainer")
        deadline = time.monotonic() + 30
        text = d.get("/metrics")
        while not all(s in text for s in _FIRST_SLOT_SERIES) and time.monotonic() < deadline:
            time.sleep(0.2)
            text = d.get("/metrics")
        code, _took = d.stop()
        return DaemonScrape(text, d.pid, code, d.log())
    finally:
        d.kill()
        stop_process(work)
        stop_process(advancer)


PYSPY_FIXTURES = Path(__file__).parent / "fixtures" / "pyspy"


@pytest.fixture(scope="session")
def pyspy_proc_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fake /proc/<pid>/root holding the sources of the recorded py-spy fixtures
    (tests/fixtures/pyspy/) as they were at capture time: the path the classifier reads
    a container target's sources through."""
    root = tmp_path_factory.mktemp("root")
    for p in sorted(PYSPY_FIXTURES.glob("*.json")):
        for path, copy in json.loads(p.read_text())["sources"].items():
            dst = root / path.lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(PYSPY_FIXTURES / copy, dst)
    return root


def pytest_addoption(parser: pytest.Parser) -> None:
    # tests/replay/golden.py and tests/report/test_report_golden.py: rewrite the checked-in
    # golden files from this run
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite the golden files (tests/replay/golden, tests/report/golden) from this run",
    )
