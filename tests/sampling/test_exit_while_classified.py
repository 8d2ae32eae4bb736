"""A target that exits while its window is classified (profiler.sampling.collect._classify).

The profiled command's root exits as its last window closes; serwatt profile reaps it
later, so for a while it is a zombie, whose /proc/<pid>/root no longer resolves. Reads of
its sources through that path then fail, and a call-site serializer (pickle.dumps, C code
with no Python frame of its own) reads as `other`: a CI run's parent process, 260 samples
of pickling, all `other`. The window is classified again from host paths."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from serwatt.collectors import procstat
from serwatt.collectors.pyspy import SamplingPlan
from serwatt.collectors.samples import Sample
from serwatt.profiler.classify.classifier import Classification, Classifier
from serwatt.profiler.sampling.collect import collect_window, finish_window

PICKLE_LOOP = """\
import pickle, sys
data = list(range(3000))
print("ready", flush=True)
while True:
    blob = pickle.dumps(data)
"""


class _KillsTargetFirst:
    """A classifier that, on its first call, kills the target and waits until it is a
    zombie (not reaped: this test is its parent), as if it exited just then."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.inner = Classifier.default()
        self.stats = self.inner.stats
        self.proc = proc

    def classify(
        self, sample: Sample, *, proc_root: Path | None = None, deadline: float | None = None
    ) -> Classification:
        if self.proc.returncode is None and procstat.exists(self.proc.pid):
            os.kill(self.proc.pid, signal.SIGKILL)
            until = time.monotonic() + 10.0
            while procstat.exists(self.proc.pid) and time.monotonic() < until:
                time.sleep(0.01)
            assert not procstat.exists(self.proc.pid), "the target did not die"
            assert Path(f"/proc/{self.proc.pid}").exists()  # a zombie, not reaped
        return self.inner.classify(sample, proc_root=proc_root, deadline=deadline)


def test_a_target_exiting_during_classification_is_classified_from_host_paths(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job.py"
    job.write_text(PICKLE_LOOP)
    proc = subprocess.Popen([sys.executable, str(job)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        raw = collect_window(proc.pid, duration_s=1.0, plan=SamplingPlan(rate_hz=50))
        assert not raw.exited
        report = finish_window(raw, _KillsTargetFirst(proc), deadline_s=30.0)
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    samples = sum(cp.samples for cp in report.codepaths.values())
    assert samples > 10, report.codepaths
    # the loop is all pickling: its samples are pickle's, not `other`
    assert report.codepaths["pickle"].samples >= 0.9 * samples, report.codepaths
    assert "target exited: sources read from host paths" in report.errors.notes
