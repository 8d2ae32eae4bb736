"""A sink that raises in `serwatt profile` (issue 43, item 7): the record's disk is full,
a tracker errs. The window pipeline owns the failure: it is counted, the other sinks still
get every window, and later windows are not lost. Before, the exception ended the
session's finisher thread, and every later window was lost without a word."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Sequence

from serwatt.collectors.pyspy import SamplingPlan
from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.profile.session import ProfileSession, SessionInfo

LOOP = textwrap.dedent(
    """
    import pickle, time
    d = {"k%d" % i: list(range(20)) for i in range(500)}
    end = time.time() + 60
    while time.time() < end:
        pickle.dumps(d)
    """
)


class _Kept:
    def __init__(self) -> None:
        self.windows: list[AttributedWindow] = []

    def on_start(self, info: SessionInfo) -> None:
        pass

    def on_window(self, window: AttributedWindow) -> None:
        self.windows.append(window)

    def on_episodes(self, episodes: Sequence[Episode]) -> None:
        pass

    def finish(self) -> None:
        pass


class _DiskFull(_Kept):
    """Writes the first window, then fails every later one."""

    def on_window(self, window: AttributedWindow) -> None:
        if self.windows:
            raise OSError(28, "No space left on device")
        super().on_window(window)


def test_a_failing_sink_loses_no_window_and_is_counted() -> None:
    proc = subprocess.Popen([sys.executable, "-c", LOOP])
    try:
        full, after = _DiskFull(), _Kept()
        session = ProfileSession(
            proc.pid,
            classifier=Classifier.default(),
            plan=SamplingPlan(rate_hz=50, on_cpu_run=True),
            window_s=0.5,
            duration_s=3.0,
            sinks=[full, after],
            follow_children=False,
            progress=None,
        )
        result = session.run()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    windows = sum(t.windows for t in result.targets)
    # every window sampled was classified and delivered (none lost with the finisher)
    assert windows == sum(t.collected for t in result.targets) >= 3, windows
    # the sink after the failing one got every window the session classified
    assert len(after.windows) == windows
    assert len(full.windows) == 1
    # each failed delivery counted, by sink, and said
    assert result.sink_failures == {"_DiskFull": windows - 1}
    assert result.acc.failures.get("sink_failed") == windows - 1
    assert "No space left on device" in (result.sink_errors[0] if result.sink_errors else "")


def test_a_run_with_failed_deliveries_says_so_and_exits_non_zero(capsys) -> None:  # type: ignore[no-untyped-def]
    from pathlib import Path

    from serwatt.profiler.cli.profile import delivery_rc
    from serwatt.profiler.exitcodes import EXIT_OK, EXIT_RUNTIME
    from serwatt.profiler.profile.accumulator import Accumulator
    from serwatt.profiler.profile.session import SessionResult

    info = SessionInfo(1, "cmd", 0.0, 50.0, 1.0, Path("/proc"))
    clean = SessionResult(info=info, ended_at=1.0, targets=[], acc=Accumulator())
    assert delivery_rc(clean) == EXIT_OK and capsys.readouterr().err == ""
    failed = SessionResult(
        info=info,
        ended_at=1.0,
        targets=[],
        acc=Accumulator(),
        sink_failures={"RecordSink": 3},
        sink_errors=["RecordSink: OperationalError: database or disk is full"],
    )
    assert delivery_rc(failed) == EXIT_RUNTIME
    err = capsys.readouterr().err
    assert err == (
        "serwatt profile: error: deliveries failed (3 to RecordSink): the outputs they feed "
        "are incomplete; first: RecordSink: OperationalError: database or disk is full\n"
    )
