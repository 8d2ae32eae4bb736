"""py-spy's chrometrace output (the stack-change run) and episodes timed by it: pure
cases with known answers, then the event stream of a real py-spy run."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from serwatt.collectors.pyspy import PySpy, SamplingPlan
from serwatt.collectors.pyspy.chrometrace import MAX_EVENTS, parse_chrometrace, resolve_changes
from serwatt.collectors.samples import SamplerErrors
from serwatt.profiler.attribution.episodes import CHANGE_EDGES_95, EpisodeTracker, episodes_of
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.sampling.window import CodepathWindow, TimedLabel, WindowReport

PID = 4242


def ev(ph: str, name: str, ts: int, line: int = 1, filename: str = "/w.py") -> dict:
    return {"args": {"filename": filename, "line": line}, "cat": "py-spy", "name": name,
            "ph": ph, "pid": PID, "tid": 99, "ts": ts}  # fmt: skip


def thread(ph: str, ts: int, label: str = "4242", name: str | None = "MainThread") -> dict:
    text = f"thread ({label}): {name}" if name else f"thread ({label})"
    return ev(ph, text, ts, line=0, filename="")


def test_a_stream_becomes_each_threads_stack_at_each_change() -> None:
    doc = [
        thread("B", 100), ev("B", "<module>", 100, 10), ev("B", "dump", 100, 3, "/p.py"),
        ev("E", "dump", 5100, 3, "/p.py"), ev("E", "<module>", 5100, 10),
        ev("B", "<module>", 5100, 11),
        # py-spy's closing events at write time: the end, not a change
        ev("E", "<module>", 9000, 11), thread("E", 9000),
    ]  # fmt: skip
    trace = parse_chrometrace(doc)
    (th,) = trace.threads
    assert (th.label, th.name) == ("4242", "MainThread")
    assert [c.ts_s for c in th.changes] == [100e-6, 5100e-6]
    assert [f.name for f in th.changes[0].frames] == ["dump", "<module>"]  # leaf first
    assert [(f.name, f.line) for f in th.changes[1].frames] == [("<module>", 11)]
    assert (trace.first_ts_s, trace.end_ts_s) == (100e-6, 9000e-6)


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"traceEvents": []}, "JSON list"),
        ([{"ph": "X", "name": "a", "ts": 1, "pid": 1, "tid": 1}], "B/E frame event"),
        ([ev("B", "a", 1), ev("E", "b", 2)], "ends 'b' but the open frame is 'a'"),
        ([ev("E", "a", 1)], "open frame is None"),
        ([{**ev("B", "a", 1), "ts": "1"}], "non-integer"),
        ([{**ev("B", "a", 1), "ts": True}], "boolean"),
    ],
)
def test_a_stream_that_is_not_py_spys_is_refused_with_the_reason(doc, problem) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=problem):
        parse_chrometrace(doc)


def test_an_oversized_stream_is_refused() -> None:
    with pytest.raises(ValueError, match=f"more than {MAX_EVENTS}"):
        parse_chrometrace([ev("B", "a", 1)] * (MAX_EVENTS + 1))


# ------------------------------------------------------- episodes timed by stack changes

P = 0.02  # the counted run's period
PT = 0.005  # the stack-change run's


def report(
    start: float,
    ticks: str,
    changes: list[tuple[float, str, str]],
    *,
    end: float,
    clock_s: float = 0.0,
    thread_cpu: tuple[tuple[float, float], ...] = (),
) -> WindowReport:
    """A window whose counted run ticks at P from `start` (one char per tick: p pickle,
    . other) and whose stack-change run saw `changes` (t, codepath, durability) until
    `end`."""
    timeline = tuple(
        TimedLabel(t=start + (k + 0.5) * P, tid=PID, thread_id=PID,
                   codepath="pickle" if ch == "p" else "other", cpu_s=0.001)
        for k, ch in enumerate(ticks)
    )  # fmt: skip
    return WindowReport(
        pid=PID,
        started_at=start,
        ended_at=start + len(ticks) * P,
        rate_hz=1 / P,
        cpu_s=0.0,
        codepaths={c: CodepathWindow() for c in CODEPATHS},
        timeline=timeline,
        errors=SamplerErrors(),
        cpu_timeline=timeline,
        timeline_period_s=P,
        changes=tuple(
            TimedLabel(t=t, tid=PID, thread_id=PID, codepath=cp, durability=d)
            for t, cp, d in changes
        ),
        changes_period_s=PT,
        changes_end=end,
        changes_clock_s=clock_s,
        thread_cpu_s={PID: thread_cpu} if thread_cpu else {},
    )


def test_edges_come_from_the_stack_changes_not_the_sample_cells() -> None:
    # the counted run's cells put the episode at 10.04-10.14; the changes say 10.051-10.127
    r = report(
        10.0, "..ppppp...",
        [(10.001, "other", ""), (10.051, "pickle", ""), (10.127, "other", "")],
        end=10.2, thread_cpu=((10.0, 5.0), (10.1, 5.08), (10.2, 5.1)),
    )  # fmt: skip
    (ep,) = episodes_of([r])
    assert (ep.start, ep.end) == (10.051, 10.127)
    assert ep.wall_s == pytest.approx(0.076)
    assert ep.timed_by == "stack changes" and ep.timing_period_s == PT
    assert ep.resolution_s == pytest.approx(math.log(20) * PT) == CHANGE_EDGES_95 * PT
    assert ep.samples == 3  # the counted run's samples inside it (10.07, 10.09, 10.11)
    # the thread's measured CPU between the edges (interpolated polls), not the samples'
    assert ep.cpu_s == pytest.approx((5.08 + 0.27 * 0.02) - (5.0 + 0.51 * 0.08))


def test_other_time_within_2_5_counted_periods_is_inside_and_a_tail_makes_it_durable() -> None:
    r = report(
        0.0, "p" * 20,
        [(0.01, "pickle", ""), (0.10, "other", ""), (0.13, "pickle", ""),  # 30 ms: inside
         (0.20, "other", "sync"), (0.26, "other", ""), (0.32, "pickle", "")],  # 60 ms: out
        end=0.4,
    )  # fmt: skip
    first, second = episodes_of([r])
    assert (first.start, first.end, first.durable) == (0.01, 0.26, True)
    assert first.durability_s == pytest.approx(0.06)
    assert (second.start, second.end) == (0.32, 0.4)


def test_an_episode_across_windows_adds_both_runs_clock_uncertainty() -> None:
    a = report(0.0, "...ppp", [(0.001, "other", ""), (0.071, "pickle", "")], end=0.125,
               clock_s=0.004)  # fmt: skip
    b = report(0.3, "pp....", [(0.305, "pickle", ""), (0.342, "other", "")], end=0.42,
               clock_s=0.003)  # fmt: skip
    (ep,) = episodes_of([a, b])
    assert (ep.start, ep.end) == (0.071, 0.342)
    assert ep.clock_s == pytest.approx(0.007)
    assert ep.resolution_s == pytest.approx(CHANGE_EDGES_95 * PT + 0.007)
    # unobserved: from the first run's end to the second's first change
    assert ep.unknown_s == pytest.approx(0.305 - 0.125)


def test_a_window_without_the_run_times_the_episode_by_its_counts() -> None:
    a = report(0.0, "...ppp", [(0.001, "other", ""), (0.071, "pickle", "")], end=0.125)
    b = dataclasses.replace(
        report(0.13, "pp....", [], end=0.25), changes=None, changes_period_s=0.0
    )
    tracker = EpisodeTracker()
    (ep,) = tracker.add(a) + tracker.add(b) + tracker.finish()
    assert ep.timed_by == "sample counts" and ep.timing_period_s is None


# ------------------------------------------------------------------ real py-spy

TARGET = textwrap.dedent(
    """
    import pickle, sys, time
    state = {i: list(range(50)) for i in range(60000)}
    print("ready", flush=True)
    time.sleep(0.3)
    t0 = time.perf_counter()
    blob = pickle.dumps(state)
    t1 = time.perf_counter()
    time.sleep(0.4)
    print(t1 - t0, flush=True)
    time.sleep(5)
    """
)


@pytest.mark.serial  # times a real blocking call: alone, on a quiet machine
def test_a_real_stack_change_run_times_a_blocking_call(tmp_path: Path) -> None:
    """py-spy's chrometrace of a real target: the one pickle.dumps call shows as one
    stretch at that line, as long as the target measured it (within 6 stack-change
    periods: exceeded with probability exp(-6) when the run keeps its rate)."""
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        rate = 200.0
        window = PySpy().record_window(
            proc.pid, duration_s=1.5, plan=SamplingPlan(rate_hz=50.0, timing_rate_hz=rate)
        )
        assert window.changes is None and window.changes_raw is not None  # read, not parsed
        window = resolve_changes(window)
        measured = float(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
    assert window.changes is not None and window.changes_rate_hz == rate
    main = [s for s in window.changes if s.tid == proc.pid]
    line = TARGET.splitlines().index("blob = pickle.dumps(state)") + 1
    inside = [
        (s.t, nxt.t)
        for s, nxt in zip(main, main[1:], strict=False)
        if s.frames and s.frames[0].filename == str(script) and s.frames[0].line == line
    ]
    assert len(inside) == 1, [(round(s.t, 3), s.frames[:1]) for s in main]
    (t0, t1) = inside[0]
    assert t1 - t0 == pytest.approx(measured, abs=6 / rate), (t1 - t0, measured)
    # the host times lie inside the window, within the run's stated clock uncertainty
    slack = window.changes_clock_s + 0.05
    assert window.started_at - slack <= t0 < t1 <= window.changes_end + slack
    assert time.time() > window.changes_end
    json.dumps([s.t for s in main])  # plain floats
