"""The window pipeline both drivers run (profiler/attribution/pipeline.py): the order a
window and its closed episodes reach the sinks, a sink that fails (counted, the others
still served) and one that rejects the window (it goes no further)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from serwatt.profiler.attribution.episodes import Episode
from serwatt.profiler.attribution.pipeline import WindowPipeline, WindowRejected
from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.sampling.window import CodepathWindow, TimedLabel, WindowReport

PID = 4242
P = 0.01


def _report(start: float, codes: str, cpu: dict[str, float] | None = None) -> WindowReport:
    """One thread's window, one tick per character: p = pickle, . = other."""
    labels = tuple(
        TimedLabel(
            t=start + (k + 0.5) * P,
            tid=PID,
            thread_id=PID * 10,
            codepath="pickle" if ch == "p" else "other",
        )
        for k, ch in enumerate(codes)
    )
    cps = {cp: CodepathWindow(cpu_s=(cpu or {}).get(cp, 0.0)) for cp in CODEPATHS}
    return WindowReport(
        pid=PID,
        started_at=start,
        ended_at=start + len(codes) * P,
        rate_hz=1 / P,
        cpu_s=sum((cpu or {}).values()),
        codepaths=cps,
        timeline=labels,
        cpu_timeline=labels,
        timeline_period_s=P,
    )


class _Sink:
    def __init__(
        self, name: str, log: list[tuple[str, str, object]], fail: type[Exception] | None = None
    ):
        self.name, self.log, self.fail = name, log, fail

    def on_window(self, window: AttributedWindow) -> None:
        if self.fail is not None:
            raise self.fail("disk full")
        self.log.append((self.name, "window", window.report.started_at))

    def on_episodes(self, episodes: Sequence[Episode]) -> None:
        self.log.append((self.name, "episodes", tuple(e.codepath for e in episodes)))


def test_a_window_then_the_episodes_it_closed_reach_every_sink_in_order() -> None:
    pipe, log = WindowPipeline(), []
    sinks = [_Sink("ledger", log), _Sink("record", log)]
    first = pipe.attribute(_report(0.0, "....pppp"))
    assert first.reading is None and first.attribution is None  # no tracker: no joules
    # the pickle run may go on in the next window
    assert pipe.deliver(first, sinks).episodes == []
    closed = pipe.deliver(pipe.attribute(_report(0.08, "pp......")), sinks).episodes
    assert [e.codepath for e in closed] == ["pickle"]
    assert closed[0].start == pytest.approx(0.04) and closed[0].end == pytest.approx(0.10)
    assert log == [
        ("ledger", "window", 0.0),
        ("record", "window", 0.0),
        ("ledger", "window", 0.08),
        ("record", "window", 0.08),
        ("ledger", "episodes", ("pickle",)),
        ("record", "episodes", ("pickle",)),
    ]


def test_a_sink_that_fails_is_counted_and_the_others_still_get_the_window() -> None:
    pipe, log = WindowPipeline(), []
    sinks = [_Sink("a", log, OSError), _Sink("b", log)]
    got = pipe.deliver(pipe.attribute(_report(0.0, "....pppp")), sinks)
    assert [str(f) for f in got.failures] == ["_Sink: OSError: disk full"]
    assert log == [("b", "window", 0.0)]
    got = pipe.deliver(pipe.attribute(_report(0.08, "pp......")), sinks)
    # the episode tracker saw both windows: the pickle run closed across them
    assert [e.codepath for e in got.episodes] == ["pickle"]
    assert pipe.sink_failures == {"_Sink": 2}
    assert pipe.sink_errors == ["_Sink: OSError: disk full"] * 2


def test_a_rejected_window_goes_no_further() -> None:
    pipe, log = WindowPipeline(), []
    with pytest.raises(WindowRejected, match="disk full"):
        pipe.deliver(
            pipe.attribute(_report(0.0, "pppp....")),
            [_Sink("a", log), _Sink("b", log, WindowRejected), _Sink("c", log)],
        )
    assert log == [("a", "window", 0.0)] and pipe.sink_failures == {}
    # neither did the episode tracker see it: nothing is open to close
    assert pipe.finish([_Sink("a", log)]).episodes == []
    assert pipe.episodes.open_episodes() == 0


def test_finish_closes_what_is_open_into_the_sinks() -> None:
    pipe, log = WindowPipeline(), []
    pipe.deliver(pipe.attribute(_report(0.0, "....pppp")), [])
    (ep,) = pipe.finish([_Sink("record", log)], pid=PID).episodes
    assert ep.codepath == "pickle" and ep.truncated
    assert log == [("record", "episodes", ("pickle",))]
