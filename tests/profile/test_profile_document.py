"""The serwatt.profile/1 document maths (pure) and the session's observer plug-in."""

from __future__ import annotations

import io
import random
import subprocess
import textwrap
from pathlib import Path

import pytest

from serwatt.collectors.pyspy import SamplingPlan
from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.profile.document import batches, build_document, share_ci95
from serwatt.profiler.profile.energy_sink import CodepathEnergy, ProfileEnergy
from serwatt.profiler.profile.session import ProfileSession, SessionInfo
from serwatt.profiler.profile.table import render_table
from serwatt.profiler.sampling.window import WindowReport
from tests.workloads.targets import find_interpreter

PY312 = str(find_interpreter(("3.12.1", "3.13.0", "3.12")))


def test_batches_merge_contiguous_bins_and_keep_totals() -> None:
    bins = {i: {"pickle": 1.0, "other": 1.0} for i in range(100)}
    del bins[50]  # an empty second
    rows = batches(bins)
    assert len(rows) == 30
    assert sum(r.get("pickle", 0) for r in rows) == pytest.approx(99.0)
    assert len(batches({3: {"json": 1.0}})) == 1
    assert batches({}) == []


def test_ci_needs_two_batches() -> None:
    assert share_ci95([{"pickle": 1.0}], "pickle", samples=50) is None
    assert share_ci95([{}, {}], "pickle", samples=50) is None
    assert share_ci95([{"pickle": 1.0}, {"other": 1.0}], "pickle", samples=0) is None


def test_ci_covers_the_true_share_for_independent_batches() -> None:
    """Coverage check: batches with a true share of 0.3 and noise; the 95% interval
    should contain 0.3 in roughly 95% of repetitions (wide tolerance: 88-99%)."""
    rng = random.Random(7)
    hits = 0
    reps = 400
    for _ in range(reps):
        rows = []
        for _ in range(20):
            total = rng.uniform(0.5, 1.5)
            share = min(1.0, max(0.0, rng.gauss(0.3, 0.1)))
            rows.append({"pickle": share * total, "other": (1 - share) * total})
        # samples without end: the batches alone set the width
        lo, hi = share_ci95(rows, "pickle", samples=1e9)  # type: ignore[misc]
        hits += lo <= 0.3 <= hi
    assert 0.88 <= hits / reps <= 0.99


def test_ci_is_wider_when_phases_are_long() -> None:
    steady = [{"pickle": 0.5, "other": 0.5} for _ in range(20)]
    phased = [{"pickle": 1.0} if i < 10 else {"other": 1.0} for i in range(20)]
    lo1, hi1 = share_ci95(steady, "pickle", samples=1e6)  # type: ignore[misc]
    lo2, hi2 = share_ci95(phased, "pickle", samples=1e6)  # type: ignore[misc]
    assert hi1 - lo1 < 0.005  # a million independent samples: +-0.1 pp
    assert hi2 - lo2 > 0.3


class Recorder:
    """A stand-in for the energy/GPU and run-record sinks."""

    def __init__(self) -> None:
        self.started: SessionInfo | None = None
        self.reports: list[WindowReport] = []

    def on_start(self, info: SessionInfo) -> None:
        self.started = info

    def on_window(self, window: AttributedWindow) -> None:
        self.reports.append(window.report)

    def on_episodes(self, episodes: object) -> None:
        pass

    def finish(self) -> ProfileEnergy:
        pickle_cpu = sum(r.codepaths["pickle"].cpu_s for r in self.reports)
        self.summary = ProfileEnergy(
            codepaths={"pickle": CodepathEnergy(energy_j=10.0 * pickle_cpu, gpu_wait_s=0.0)},
            energy={"source": "model", "reason": None, "package_j": 42.0},
        )
        return self.summary


def test_observers_see_every_window_and_extend_the_document(tmp_path: Path) -> None:
    script = tmp_path / "w.py"
    script.write_text(
        textwrap.dedent(
            """
            import pickle, time
            d = {str(i): [i] for i in range(5000)}
            end = time.time() + 3
            while time.time() < end:
                b = pickle.dumps(d)
            """
        )
    )
    p = subprocess.Popen([PY312, str(script)])
    obs = Recorder()
    progress = io.StringIO()
    session = ProfileSession(
        p.pid,
        classifier=Classifier.default(),
        plan=SamplingPlan(rate_hz=50, on_cpu_run=True),
        window_s=1.0,
        sinks=[obs],
        progress=progress,
        root_exit_check=lambda: p.poll() is not None,
        root_may_be_wrapper=True,
    )
    result = session.run()
    p.wait()
    assert obs.started is not None and obs.started.root_pid == p.pid
    assert len(obs.reports) >= 2  # 1 s windows over ~3 s
    assert all(set(r.codepaths) == set(CODEPATHS) for r in obs.reports)
    doc = build_document(result, energy=obs.summary)
    assert doc["energy"] == {"source": "model", "reason": None, "package_j": 42.0}
    assert doc["codepaths"]["pickle"]["energy_j"] > 0
    assert doc["codepaths"]["json"]["energy_j"] is None
    table = render_table(doc)
    # the head row (after the first lines: a loaded node's run says it was contended)
    head = next(ln for ln in table.splitlines() if ln.startswith("codepath "))
    assert " J" in head and "GPU-wait s" in head
    assert "elapsed" in progress.getvalue()
    assert doc["sampler"]["windows"] == len(obs.reports)


def _failing_pyspy(tmp_path: Path, *, keep_output: bool) -> Path:
    """A py-spy that runs the real one, then, for `record`, fails (exit 1) as if it had
    failed on its target's exit, with or without the output it wrote."""
    from serwatt.collectors.pyspy.runner import find_pyspy

    spy = tmp_path / "py-spy"
    drop = "" if keep_output else 'rm -f "$out"\n'
    spy.write_text(
        "#!/bin/sh\n"
        f'"{find_pyspy()}" "$@" || exit\n'
        '[ "$1" = record ] || exit 0\n'
        'out=""; prev=""\n'
        'for a in "$@"; do [ "$prev" = --output ] && out="$a"; prev="$a"; done\n'
        f'{drop}echo "Error: lost" >&2\nexit 1\n'
    )
    spy.chmod(0o755)
    return spy


def _profile_with(tmp_path: Path, spy: Path) -> dict:
    from serwatt.collectors.pyspy import PySpy

    script = tmp_path / "w.py"
    # 5 s of work: under a loaded parallel pass the interpreter's start and py-spy's attach
    # took most of a 2.5 s run, and the samples kept fell below the bound below
    script.write_text("import time\nend = time.time() + 5.0\nwhile time.time() < end:\n    pass\n")
    p = subprocess.Popen([PY312, str(script)])
    session = ProfileSession(
        p.pid,
        classifier=Classifier.default(),
        plan=SamplingPlan(rate_hz=50, on_cpu_run=True),
        window_s=60.0,
        pyspy=PySpy(spy),
        root_exit_check=lambda: p.poll() is not None,
    )
    result = session.run()
    p.wait()
    return build_document(result)


def test_a_window_lost_as_its_target_exits_is_counted_and_said(tmp_path: Path) -> None:
    # the window's samples are lost: the document must say so, not read as a run that
    # was never sampled
    doc = _profile_with(tmp_path, _failing_pyspy(tmp_path, keep_output=False))
    assert doc["sampler"]["windows"] == 0
    assert doc["sampler"]["window_failures"] == {"lost_at_exit": 1}, doc["sampler"]
    (target,) = doc["targets"]
    assert target["error"].startswith("lost_at_exit: the window's py-spy failed as the target")
    assert target["windows_lost"] == 1
    # the table says a window was lost, not that the target was never sampled
    (line,) = [ln for ln in render_table(doc).splitlines() if ln.startswith("target ")]
    assert line.startswith(f"target {target['pid']}: 1 window(s) lost: lost_at_exit:"), line


def test_samples_a_py_spy_wrote_before_failing_on_the_exit_are_kept(tmp_path: Path) -> None:
    doc = _profile_with(tmp_path, _failing_pyspy(tmp_path, keep_output=True))
    assert doc["sampler"]["windows"] == 1 and doc["sampler"]["window_failures"] == {}
    assert doc["samples"] >= 50, doc["sampler"]  # ~5 s at 50 Hz; at least 1 s of them
