"""WindowPipeline.attribute_held: when a process tree's windows are handed on. A window
waits while a process still sampled may yet deliver a window overlapping it (so the two
are fitted together before any sink reads them), but never longer than two windows'
length for a process whose windows stopped coming; one process's windows come back at
once. (The joint fit itself: tests/replay/test_tree.py, tests/attribution/test_energy.py.)"""

from __future__ import annotations

from dataclasses import replace

from serwatt.profiler.attribution.pipeline import WindowPipeline
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.sampling.window import CodepathWindow, WindowReport

W = 1.0  # each window's length


def _report(pid: int, start: float) -> WindowReport:
    cps = {cp: CodepathWindow(cpu_s=0.0) for cp in CODEPATHS}
    return WindowReport(
        pid=pid, started_at=start, ended_at=start + W, rate_hz=100.0, cpu_s=0.0, codepaths=cps
    )


def _starts(windows: list) -> list[tuple[int, float]]:
    return [(w.report.pid, w.report.started_at) for w in windows]


def test_one_process_windows_come_back_at_once_as_attributed() -> None:
    pipe = WindowPipeline()
    for k in range(3):
        rep = _report(1, 10.0 + k * W)
        (got,) = pipe.attribute_held(rep, live=[1])
        assert got == WindowPipeline().attribute(rep)
    assert pipe.flush() == []


def test_a_window_waits_for_the_overlapping_window_of_a_live_process() -> None:
    pipe = WindowPipeline()
    assert pipe.attribute_held(_report(1, 10.0), live=[1, 2]) == []  # 2 may overlap it
    # 2's window overlaps 1's, and 1's next one may overlap 2's: both still wait
    assert pipe.attribute_held(_report(2, 10.5), live=[1, 2]) == []
    # 1's next window (after a restart) begins where 2's ended: the two overlapping
    # windows come back together, in order
    got = pipe.attribute_held(_report(1, 11.5), live=[1, 2])
    assert _starts(got) == [(1, 10.0), (2, 10.5)]
    assert _starts(pipe.flush()) == [(1, 11.5)]


def test_a_process_whose_windows_stopped_holds_nothing_past_two_windows() -> None:
    """Process 2 is still sampled but delivers nothing: 1's windows wait only while the
    newest is within two windows' length of the oldest held."""
    pipe = WindowPipeline()
    released = [
        _starts(pipe.attribute_held(_report(1, 10.0 + k * W), live=[1, 2])) for k in range(5)
    ]
    assert released == [[], [], [(1, 10.0), (1, 11.0), (1, 12.0)], [], []]
    assert _starts(pipe.flush()) == [(1, 13.0), (1, 14.0)]


def test_an_exited_process_holds_nothing_back() -> None:
    for exited, want in ((False, [(2, 10.0)]), (True, [(2, 10.0), (1, 11.0)])):
        pipe = WindowPipeline()
        assert pipe.attribute_held(replace(_report(2, 10.0), exited=exited), live=[1, 2]) == []
        got = pipe.attribute_held(_report(1, 11.0), live=[1, 2])
        assert _starts(got) == want, exited
