"""Every window says what weighed its CPU: the kernel's timeline, or the estimates when
the timeline is absent (real py-spy, real target; the tracefs root is the boundary)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from serwatt.collectors import sched_timeline
from serwatt.collectors.pyspy import SamplingPlan
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.sampling.collect import sample_window

STATUS = sched_timeline.probe()
# pickle.dumps of d takes ~1.1 ms of CPU here, json.dumps ~4.2 ms: 80 of one against 20 of
# the other gives each about half the thread's CPU (20 and 20 gave pickle ~21%, near the
# 10% bound below, which a contended window then crossed)
BUSY = """
import json, pickle
d = {str(i): list(range(20)) for i in range(2000)}
def pickling():
    for _ in range(80):
        pickle.dumps(d)
def dumping():
    for _ in range(20):
        json.dumps(d)
while True:
    pickling()
    dumping()
"""
PLAN = SamplingPlan(rate_hz=50, timing_rate_hz=200, kernel_timeline=True)


@pytest.fixture
def target(tmp_path: Path):
    script = tmp_path / "busy.py"
    script.write_text(BUSY)
    p = subprocess.Popen([sys.executable, str(script)])
    time.sleep(0.5)
    yield p.pid
    p.kill()
    p.wait()


def _notes(report) -> list[str]:
    return [n for n in report.errors.notes if n.startswith("cpu_source")]


@pytest.mark.skipif(not STATUS.up, reason=f"no scheduler timeline: {STATUS}")
def test_the_kernel_weighs_a_window_it_timed(target: int) -> None:
    report = sample_window(target, duration_s=2.0, classifier=Classifier.default(), plan=PLAN)
    assert report.cpu_source == "kernel"
    assert _notes(report) == ["cpu_source kernel: on-CPU intervals from the scheduler timeline"]
    # all the busy thread's CPU went to its two serializers
    cps = report.codepaths
    assert cps["pickle"].cpu_s + cps["json"].cpu_s > 0.9 * report.cpu_s
    assert cps["pickle"].cpu_s > 0.1 * report.cpu_s and cps["json"].cpu_s > 0.1 * report.cpu_s


def test_without_the_timeline_the_estimates_weigh_and_say_why(
    target: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sched_timeline, "TRACEFS", tmp_path)  # no tracefs there
    report = sample_window(target, duration_s=2.0, classifier=Classifier.default(), plan=PLAN)
    assert report.cpu_source == "estimate"
    (note,) = _notes(report)
    assert note.startswith("cpu_source estimate (no scheduler timeline (")
    assert "mount -t tracefs" in note
    cps = report.codepaths
    assert cps["pickle"].cpu_s + cps["json"].cpu_s > 0.9 * report.cpu_s


def test_not_asked_is_the_estimate_too(target: int) -> None:
    plan = SamplingPlan(rate_hz=50, timing_rate_hz=200)
    report = sample_window(target, duration_s=1.0, classifier=Classifier.default(), plan=plan)
    assert report.cpu_source == "estimate"
    assert _notes(report) == ["cpu_source estimate"]
