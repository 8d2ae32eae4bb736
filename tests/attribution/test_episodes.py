"""Serialization episodes (profiler/attribution/episodes.py) and the durability tags
they use (profiler/classify/durability.py).

Pure tests build windows tick by tick from strings; the real tests profile
tests/workloads/blocking_dumps.py (known blocking pickle.dump calls, timed inside the
workload) with real py-spy through the sampling path the profile session runs, alone
(`make check`'s serial pass): at any load of other processes, the episode count, the
durable flags and that each episode's stated resolution covers its true duration and CPU;
on a quiet node, the quiet node's figures.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import pathlib
import queue
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from serwatt.collectors.pyspy import SamplingPlan, StopEvent
from serwatt.collectors.samples import Frame, SamplerErrors
from serwatt.profiler.attribution.episodes import (
    Episode,
    EpisodeTracker,
    episodes_of,
    error_quantile_s,
    period_s,
)
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.codepaths import CODEPATHS, SERIALIZATION_CODEPATHS
from serwatt.profiler.classify.durability import RENAME, SYNC, DurabilityReader
from serwatt.profiler.sampling.collect import (
    RawWindow,
    collect_window,
    default_timing_rate_hz,
    finish_window,
)
from serwatt.profiler.sampling.window import CodepathWindow, TimedLabel, WindowReport
from tests.node_load import OthersCpu

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = REPO / "tests" / "workloads" / "blocking_dumps.py"
PID = 4242
P = 0.01  # tick period of the built windows

# one character per tick: the sample's codepath, durability tag and save function call
# (profiler/classify/saver.py; "A" and "B": two calls); " " = no sample
CODES: dict[str, tuple[str, str] | tuple[str, str, str]] = {
    "a": ("other", "", "A"),
    "b": ("other", "", "B"),
    "J": ("json", "", "A"),
    "p": ("pickle", ""),
    "t": ("torch", ""),
    "j": ("json", ""),
    "m": ("many", ""),
    "M": ("many", SYNC),
    ".": ("other", ""),
    "s": ("other", SYNC),
    "r": ("other", RENAME),
}


def window(
    start: float,
    threads: dict[int | None, str],
    *,
    period: float = P,
    cpu: dict[tuple[int | None, int], float] | None = None,
    exited: bool = False,
    behind_s: float = 0.0,
    with_cpu_timeline: bool = True,
) -> WindowReport:
    """A window of len(ticks) ticks from `start`; threads: tid (None: no kernel tid,
    thread_id 7) -> ticks. cpu: (tid, tick) -> that sample's cpu_s."""
    ticks = max(len(s) for s in threads.values())
    labels = []
    for tid, codes in threads.items():
        for k, ch in enumerate(codes):
            if ch == " ":
                continue
            codepath, durability, *saver = CODES[ch]
            labels.append(
                TimedLabel(
                    t=start + (k + 0.5) * period,
                    tid=tid,
                    thread_id=7 if tid is None else tid * 10,
                    codepath=codepath,
                    cpu_s=(cpu or {}).get((tid, k), 0.0),
                    durability=durability,
                    saver=saver[0] if saver else "",
                )
            )
    labels.sort(key=lambda lab: lab.t)
    timeline = tuple(labels)
    return WindowReport(
        pid=PID,
        started_at=start,
        ended_at=start + ticks * period,
        rate_hz=1 / period,
        cpu_s=0.0,
        codepaths={c: CodepathWindow() for c in CODEPATHS},
        timeline=timeline,
        errors=SamplerErrors(behind_s=behind_s),
        exited=exited,
        cpu_timeline=timeline if with_cpu_timeline else (),
        timeline_period_s=period,
    )


def one(reports: list[WindowReport], **kw: float) -> Episode:
    eps = episodes_of(reports, **kw)
    assert len(eps) == 1, eps
    return eps[0]


# ------------------------------------------------------------------ pure: episodes


def test_one_run_of_samples_is_one_episode_with_cell_edges() -> None:
    ep = one([window(100.0, {PID: "..ppppp..."})])
    assert ep.codepath == "pickle" and ep.pid == PID and ep.thread == PID
    assert ep.main_thread is True
    assert ep.start == pytest.approx(100.02) and ep.end == pytest.approx(100.07)
    assert ep.wall_s == pytest.approx(0.05) and ep.samples == 5
    assert ep.period_s == pytest.approx(P)
    assert ep.resolution_s == pytest.approx(P * (1 + 2 * math.sqrt(5)))
    assert (ep.unknown_s, ep.edge_unknown_s, ep.truncated, ep.durable) == (0.0, 0.0, False, False)
    assert ep.gpu_wait_s is None and ep.gpu_idle_j is None


def test_gaps_up_to_two_ticks_are_tolerated_three_end_it() -> None:
    assert one([window(0.0, {PID: ".ppp..ppp."})]).wall_s == pytest.approx(0.08)
    assert one([window(0.0, {PID: ".ppp  ppp."})]).wall_s == pytest.approx(0.08)  # missing
    assert one([window(0.0, {PID: ".ppp. ppp."})]).samples == 6
    eps = episodes_of([window(0.0, {PID: ".ppp...ppp."})])
    assert [(e.start, e.wall_s) for e in eps] == [
        (pytest.approx(0.01), pytest.approx(0.03)),
        (pytest.approx(0.07), pytest.approx(0.03)),
    ]
    assert len(episodes_of([window(0.0, {PID: ".ppp   ppp."})])) == 2


def test_a_codepath_change_ends_an_episode() -> None:
    eps = episodes_of([window(0.0, {PID: "pppjjj.pp"})])
    assert [(e.codepath, e.samples) for e in eps] == [("pickle", 3), ("json", 3), ("pickle", 2)]
    assert eps[0].end == pytest.approx(eps[1].start)
    # an interruption by another serializer is not tolerated like `other` is
    assert len(episodes_of([window(0.0, {PID: "pppjppp"})])) == 3


def test_threads_have_their_own_episodes() -> None:
    reports = [window(0.0, {PID: "..pppp....", 99: "pppppppp..", None: ".tt......."})]
    eps = {(e.thread, e.codepath): e for e in episodes_of(reports)}
    assert set(eps) == {(PID, "pickle"), (99, "pickle"), (7, "torch")}
    assert eps[(PID, "pickle")].wall_s == pytest.approx(0.04)
    assert eps[(99, "pickle")].wall_s == pytest.approx(0.08)
    assert eps[(99, "pickle")].main_thread is False
    assert eps[(7, "torch")].main_thread is None  # no kernel tid: cannot say


def test_an_episode_cut_by_a_window_boundary_is_joined_and_the_gap_is_unknown() -> None:
    tracker = EpisodeTracker()
    assert tracker.add(window(0.0, {PID: "..pppp"})) == []
    assert tracker.open_episodes(PID) == 1  # it may go on in the next window
    done = tracker.add(window(0.06 + 0.1, {PID: "ppp..."}))
    assert len(done) == 1 and tracker.open_episodes() == 0
    ep = done[0]
    assert ep.start == pytest.approx(0.02) and ep.end == pytest.approx(0.19)
    assert ep.wall_s == pytest.approx(0.04 + 0.1 + 0.03)
    assert ep.unknown_s == pytest.approx(0.1) and ep.edge_unknown_s == 0.0
    assert ep.samples == 7


def test_the_gap_tolerance_spans_the_window_boundary() -> None:
    # one `other` tick before a 2 ms gap and one after: two ticks and the gap, tolerated
    assert one([window(0.0, {PID: "ppp."}), window(0.042, {PID: ".pp."})]).unknown_s == (
        pytest.approx(0.002)
    )
    # it had left its codepath before a 60 ms gap: the gap is missing ticks, it ended
    left = episodes_of([window(0.0, {PID: "ppp."}), window(0.1, {PID: ".pp."})])
    assert [(e.start, e.end) for e in left] == [
        (pytest.approx(0.0), pytest.approx(0.03)),
        (pytest.approx(0.11), pytest.approx(0.13)),
    ]
    assert all(e.unknown_s == 0 and e.edge_unknown_s == 0 for e in left)
    # three observed ticks: two episodes, neither touching the gap
    eps = episodes_of([window(0.0, {PID: "ppp.."}), window(0.1, {PID: ".pp."})])
    assert len(eps) == 2 and all(e.unknown_s == 0 and e.edge_unknown_s == 0 for e in eps)


def test_an_episode_ending_or_starting_at_a_gap_may_extend_into_it() -> None:
    ends = episodes_of([window(0.0, {PID: "..pppp"}), window(0.16, {PID: "......"})])
    assert len(ends) == 1
    assert ends[0].wall_s == pytest.approx(0.04) and ends[0].unknown_s == 0.0
    assert ends[0].edge_unknown_s == pytest.approx(0.1)
    starts = one([window(0.0, {PID: "......"}), window(0.16, {PID: "ppp..."})])
    assert starts.edge_unknown_s == pytest.approx(0.1) and starts.unknown_s == 0.0


def test_no_join_across_a_gap_longer_than_max_join_gap() -> None:
    reports = [window(0.0, {PID: "..pppp"}), window(2.06, {PID: "ppp..."})]
    eps = episodes_of(reports, max_join_gap_s=1.0)
    assert [e.wall_s for e in eps] == [pytest.approx(0.04), pytest.approx(0.03)]
    assert [e.edge_unknown_s for e in eps] == [pytest.approx(2.0), pytest.approx(2.0)]
    assert len(episodes_of(reports, max_join_gap_s=3.0)) == 1


def test_a_thread_missing_from_the_next_window_ends_its_episode() -> None:
    eps = episodes_of([window(0.0, {PID: "..pppp"}), window(0.1, {99: "......"})])
    assert len(eps) == 1 and eps[0].thread == PID and eps[0].wall_s == pytest.approx(0.04)


def test_sampling_start_and_stop_during_an_episode_mark_it_truncated() -> None:
    first = one([window(0.0, {PID: "ppp..."})])
    assert first.truncated  # it may have begun before sampling did
    tracker = EpisodeTracker()
    assert tracker.add(window(0.0, {PID: "...ppp"})) == []
    last = tracker.finish()
    assert len(last) == 1 and last[0].truncated and tracker.open_episodes() == 0
    tracker.add(window(0.0, {PID: "..pp.."}))
    assert [e.truncated for e in tracker.finish()] == [False]  # ended, within tolerance


def test_a_target_that_exits_closes_its_episodes() -> None:
    tracker = EpisodeTracker()
    done = tracker.add(window(0.0, {PID: "..pppp"}, exited=True))
    assert len(done) == 1 and not done[0].truncated and tracker.open_episodes() == 0


def test_windows_out_of_order_are_refused() -> None:
    tracker = EpisodeTracker()
    tracker.add(window(1.0, {PID: "...."}))
    with pytest.raises(ValueError, match="in time order"):
        tracker.add(window(0.5, {PID: "...."}))


def test_cpu_is_the_threads_cpu_inside_the_span() -> None:
    cpu = {(PID, 1): 0.5, (PID, 3): 0.25, (PID, 8): 4.0, (99, 3): 8.0}
    ep = one([window(0.0, {PID: "..ppp.p...", 99: ".........."}, cpu=cpu)])
    assert ep.cpu_s == pytest.approx(0.25)  # tick 3 only: 1 is before it, 8 after
    # from the timeline when there is no cpu_timeline
    bare = window(0.0, {PID: "..ppp....."}, cpu=cpu, with_cpu_timeline=False)
    assert one([bare]).cpu_s == pytest.approx(0.25)


def test_cpu_joined_across_windows_counts_the_gap_side_samples_once() -> None:
    w1 = window(0.0, {PID: "..ppp"}, cpu={(PID, 2): 1.0, (PID, 4): 2.0})
    w2 = window(0.1, {PID: ".pp..."}, cpu={(PID, 0): 4.0, (PID, 2): 8.0, (PID, 4): 16.0})
    ep = one([w1, w2])
    assert ep.cpu_s == pytest.approx(1.0 + 2.0 + 4.0 + 8.0)
    # not joined: the samples after its end are not its
    w3 = window(0.1, {PID: "....pp"}, cpu={(PID, 0): 4.0})
    first = episodes_of([w1, w3])[0]
    assert first.cpu_s == pytest.approx(1.0 + 2.0)


def test_resolution_takes_the_coarsest_period_and_pyspy_lag() -> None:
    w1 = window(0.0, {PID: "..pp"}, period=0.01)
    w2 = window(0.05, {PID: "pp.."}, period=0.1, behind_s=0.3)
    ep = one([w1, w2])
    assert ep.period_s == pytest.approx(0.1)
    assert ep.resolution_s == pytest.approx(0.1 * (1 + 2 * 2) + 0.3)


# ------------------------------------------------------------ pure: durability tail


def test_a_durability_tail_within_two_ticks_joins_the_checkpoint_and_makes_it_durable() -> None:
    ep = one([window(0.0, {PID: ".pppp.sss.r..."})])
    assert ep.codepath == "pickle" and ep.durable
    assert ep.wall_s == pytest.approx(0.10)  # ticks 1..10: the rename too
    assert ep.durability_s == pytest.approx(0.04)
    assert one([window(0.0, {PID: ".pppp..sss...."})]).durable  # two ticks after


def test_a_tail_starting_more_than_tail_gap_s_after_is_not_the_checkpoints() -> None:
    # 10 ms ticks: 6 ticks (60 ms) of other work before the fsync, over TAIL_GAP_S (50 ms)
    ep = one([window(0.0, {PID: ".pppp......sss..."})])
    assert not ep.durable and ep.wall_s == pytest.approx(0.04) and ep.durability_s == 0.0
    # 4 ticks (40 ms): the file's close and reopen before its fsync, the checkpoint's
    ep = one([window(0.0, {PID: ".pppp....sss..."})])
    assert ep.durable and ep.wall_s == pytest.approx(0.11)


def test_after_a_long_save_the_tail_may_start_later_in_proportion() -> None:
    # 5 s of dump (500 ticks): 2% of it, 100 ms, for what the save frees as it returns
    ep = one([window(0.0, {PID: "." + "j" * 500 + "." * 8 + "sss..."})])
    assert ep.durable and ep.wall_s == pytest.approx(5.11)  # 80 ms freeing, 30 ms fsync
    ep = one([window(0.0, {PID: "." + "j" * 500 + "." * 12 + "sss..."})])
    assert not ep.durable and ep.wall_s == pytest.approx(5.0)
    # the same codepath after a gap is still a new episode: only a tail bridges it
    eps = episodes_of([window(0.0, {PID: "." + "j" * 500 + "." * 8 + "jj..."})])
    assert [round(e.wall_s / P) for e in eps] == [500, 2]


def test_at_a_fast_stack_change_rate_a_tail_gap_is_time_not_two_ticks() -> None:
    # 2.5 ms ticks (a 400 Hz stack-change run): a 10 ms close-and-reopen is 4 ticks
    ep = one([window(0.0, {PID: ".pppp....sss..."}, period=0.0025)])
    assert ep.durable and ep.wall_s == pytest.approx(11 * 0.0025)
    # the same codepath after those 4 ticks is a new episode: only a tail bridges them
    eps = episodes_of([window(0.0, {PID: ".pppp....ppp..."}, period=0.0025)])
    assert [round(e.wall_s / 0.0025) for e in eps] == [4, 3]


def test_a_rename_alone_is_not_durable_and_a_tail_alone_is_no_episode() -> None:
    ep = one([window(0.0, {PID: ".pppprr...."})])
    assert not ep.durable and ep.wall_s == pytest.approx(0.06)
    assert episodes_of([window(0.0, {PID: "..sss..rr.."})]) == []


def test_a_tail_across_a_window_boundary_joins() -> None:
    ep = one([window(0.0, {PID: "..pppp"}), window(0.1, {PID: "sss..."})])
    assert ep.durable and ep.unknown_s == pytest.approx(0.04)


def test_a_save_functions_preparation_right_before_its_episode_is_prepared_s() -> None:
    # 5 ticks in save call A calling no serializer, then its json.dump: not in wall_s
    ep = one([window(0.0, {PID: "...aaaaaJJJJ..."})])
    assert ep.codepath == "json" and ep.wall_s == pytest.approx(0.04)
    assert ep.start == pytest.approx(0.08) and ep.prepared_s == pytest.approx(0.05)
    # up to two missing ticks inside it or before the episode do not end it
    assert one([window(0.0, {PID: "...aa  aa  JJJJ..."})]).prepared_s == pytest.approx(0.08)
    # three do; so does a sample of training (no save call) or of another call (B)
    assert one([window(0.0, {PID: "...aaa   JJJJ..."})]).prepared_s == 0.0
    assert one([window(0.0, {PID: "...aa.aaJJJJ..."})]).prepared_s == pytest.approx(0.02)
    assert one([window(0.0, {PID: "...aabaaJJJJ..."})]).prepared_s == pytest.approx(0.02)
    # an episode outside the call (`j`: a log line's json.dumps in training) takes none
    assert one([window(0.0, {PID: "...aaaajjj..."})]).prepared_s == 0.0
    # a preparation that starts at a window's first tick may have begun in the gap before
    w1, w2 = window(0.0, {PID: "....."}), window(0.06, {PID: "aaaJJJ..."})
    ep = one([w1, w2])
    assert ep.prepared_s == pytest.approx(0.03) and ep.edge_unknown_s == pytest.approx(0.01)
    # one that runs to a window's end is joined across the gap, which counts in it
    w1, w2 = window(0.0, {PID: "...aa"}), window(0.06, {PID: "aaaJJJ..."})
    ep = one([w1, w2])
    assert ep.prepared_s == pytest.approx(0.02 + 0.01 + 0.03)  # 2 ticks, the gap, 3 ticks
    assert ep.edge_unknown_s == 0.0
    # ... but not past a window in which the thread did something else
    w3 = window(0.2, {PID: "aaaJJJ..."})
    eps = episodes_of([window(0.0, {PID: "...aa"}), window(0.06, {PID: "....."}), w3])
    assert [e.prepared_s for e in eps] == [pytest.approx(0.03)]


def test_many_fsyncs_inside_its_own_frames() -> None:
    assert one([window(0.0, {PID: ".mmMMmm.."})]).durable
    assert not one([window(0.0, {PID: ".mmmm...."})]).durable


def test_codepaths_without_a_tail_take_none() -> None:
    tracker = EpisodeTracker(tail_codepaths=())
    eps = tracker.add(window(0.0, {PID: ".pppss...."}))
    assert len(eps) == 1 and not eps[0].durable and eps[0].wall_s == pytest.approx(0.03)
    assert set(EpisodeTracker().tail_codepaths) == set(SERIALIZATION_CODEPATHS)


def test_period_falls_back_to_the_rate() -> None:
    w = window(0.0, {PID: ".pp."}, period=0.02)
    bare = WindowReport(**{**w.__dict__, "timeline_period_s": 0.0})
    assert period_s(bare) == pytest.approx(0.02)


# ------------------------------------------------------------ durability tags


def test_durability_reader_finds_fsync_replace_and_their_aliases(tmp_path: Path) -> None:
    src = tmp_path / "writer.py"
    src.write_text(
        textwrap.dedent(
            """\
            import os
            from os import replace as move_into_place
            def save(f, tmp, path, text):
                os.fsync(f.fileno())
                move_into_place(tmp, path)
                os.rename(tmp, path)
                s = text.replace("a", "b")
                os.fdatasync(f.fileno())
            """
        )
    )
    reader = DurabilityReader()
    kinds = [reader.kind([Frame("save", str(src), line)], None) for line in range(1, 9)]
    assert kinds == ["", "", "", SYNC, RENAME, RENAME, "", SYNC]
    # the innermost Python frame decides; native frames below it are skipped
    native = Frame("fsync", "", 0, module="/lib/libc.so.6")
    assert reader.kind([native, Frame("save", str(src), 4)], None) == SYNC
    assert reader.kind([Frame("save", "<string>", 4)], None) == ""


def test_pathlib_replace_is_os_replace_on_pathlibs_own_line() -> None:
    source, first = inspect.getsourcelines(pathlib.Path.replace)
    line = first + next(i for i, text in enumerate(source) if "os.replace(" in text)
    frames = [Frame("replace", pathlib.__file__, line), Frame("save", "/app/x.py", 3)]
    assert DurabilityReader().kind(frames, None) == RENAME


def test_prepare_loads_the_jobs_own_files_ahead_of_stdlib_and_packages(tmp_path: Path) -> None:
    # in time order a torch job's stacks name its packages' files first; the script whose
    # fsync makes each checkpoint durable must not wait behind them for the deadline
    paths = {
        "package": tmp_path / "venv/lib/python3.11/site-packages/torch/serialization.py",
        "stdlib": tmp_path / "py/lib/python3.11/shutil.py",
        "job": tmp_path / "app/train.py",
    }
    for p in paths.values():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("import os\n\ndef save(fd):\n    os.fsync(fd)\n")
    reader = DurabilityReader()
    asked: list[str] = []
    get = reader._sources.get

    def recording(path: str, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        asked.append(path)
        return get(path, *args, **kwargs)  # type: ignore[arg-type]

    reader._sources.get = recording  # type: ignore[method-assign]
    stacks = [[Frame("save", str(paths[k]), 4)] for k in ("package", "stdlib", "job")]
    reader.prepare([*stacks, stacks[0]], None, time.monotonic() + 30.0)
    assert asked == [str(paths["job"])]  # the others wait for the window's time order
    assert reader.kind(stacks[2], None) == SYNC and len(asked) == 1  # known: no new load


def test_files_that_cannot_call_a_durability_call_are_not_parsed(tmp_path: Path) -> None:
    no_os = tmp_path / "plain.py"
    no_os.write_text("def fsync(x):\n    return x.fsync()\n")
    str_replace = tmp_path / "text.py"
    str_replace.write_text("import os\ndef f(s):\n    return s.replace('a', os.sep)\n")
    reader = DurabilityReader()
    assert reader.kind([Frame("fsync", str(no_os), 2)], None) == ""
    assert reader.kind([Frame("f", str(str_replace), 3)], None) == ""
    assert reader._sources.parses == 0 and reader._sources.filtered == 2


# ------------------------------------------------------------ real py-spy

PLAN = {
    "pause_s": 0.25,
    "sync_mb": 96,
    "checkpoints": [
        {"seconds": 0.3, "durable": False},
        {"seconds": 0.6, "durable": True},
        {"seconds": 1.0, "durable": False},
        {"seconds": 0.4, "durable": True},
        {"seconds": 0.7, "durable": False},
        {"seconds": 0.45, "durable": True},
    ],
}
RATE_HZ = 50.0
# the stack-change run that times the edges: serwatt profile's default, 4x RATE_HZ
TIMING_HZ = default_timing_rate_hz(RATE_HZ)
WINDOW_S = 2.0
# A tail this many stack-change periods long gets no tick with probability exp(-10) =
# 5e-5 (py-spy's ticks are Poisson): shorter fsyncs may go unseen.
SURE_TAIL_PERIODS = 10
# The claim: each duration within 1.5 sampling periods (1 / RATE_HZ). Timed by stack
# changes at 4x the rate, the error is Laplace with scale 1/TIMING_HZ: beyond 1.5
# periods (6 stack-change periods) with probability exp(-6) = 0.25% per episode.
PERIODS = 1.5
# An episode whose edges are in two windows is timed on two py-spy runs' clocks. Each
# run's host times may be late by its clock offset (README: "milliseconds on a quiet
# node, tenths of a second on an overloaded one"); both late by [0, CLOCK_S], their
# difference is within +-CLOCK_S. A fixed allowance: the test does not take serwatt's own
# clock_s as its bound.
CLOCK_S = 0.1
# The CPU-time tolerance. An episode's cpu_s is the thread's CPU clock (polled every
# POLL_S, the collect_window default) interpolated at its two edges. (a) An edge placed
# dt off moves cpu_s by at most dt (a thread runs at most 1 CPU-s per s), so the edges'
# timing error (the duration bound above) bounds it. (b) Between two polls the clock is
# interpolated linearly; an edge where the thread goes from sleeping to running (or
# back) inside a poll interval of length P is off by (t - a)(b - t)/P <= P/4: POLL_S/4
# per edge, two edges.
POLL_S = 0.1
CPU_INTERPOLATION_S = 2 * POLL_S / 4
# What serwatt claims at any load: wall_s within resolution_s of the truth (95%), under
# the error model of how it was timed; resolution_s takes in py-spy's reported lag, so a
# loaded node widens the claim instead of breaking it. Held at serwatt's own quantile
# for this tail probability a side (error_quantile_s): 0.1% an episode, 0.6% a run of six.
CLAIM_P = 0.0005
# Other processes' CPU over the run, in cores, above which the node is too loaded for
# the quiet figures (as the DataLoader truth test's: one busy loop takes 0.8)
QUIET_CORES = 0.15


@dataclasses.dataclass(frozen=True)
class Profiled:
    reports: list[WindowReport]
    episodes: list[Episode]
    truth: list[dict[str, float]]  # the workload's own times, one per checkpoint
    others_cores: float  # the node's other processes' CPU over the run


def _episodes(tmp_path: Path, *, quiet: bool = False) -> Profiled:
    """The workload profiled, its episodes, and the checks that hold at any load: one
    pickle episode of the main thread per checkpoint, each whole and timed by stack
    changes, and no durable flag where nothing was fsynced. quiet: skip, saying the
    load, when other processes used more than QUIET_CORES over the run."""
    with OthersCpu() as load:
        reports, truth = _profile(tmp_path)
    load_said = f"other processes used {load.cores:.2f} cores over the run"
    if quiet and load.cores > QUIET_CORES:
        pytest.skip(
            f"the quiet node's figures need a quiet node: {load_said} (over {QUIET_CORES}); "
            "the stated resolution's coverage of the truth is held at any load by "
            "test_known_blocking_dumps_give_their_episodes_within_their_stated_resolution"
        )
    assert len(reports) >= 3, f"the checkpoints should span several windows; {load_said}"
    tracker = EpisodeTracker()
    eps = [e for r in reports for e in tracker.add(r)] + tracker.finish()
    pid = reports[0].pid
    # (beside tens of busy processes py-spy can miss more than GAP_TICKS ticks in a row
    # and cut one dump in two: seen here at load 30-40 on 2 CPUs)
    assert [(e.pid, e.thread, e.codepath, e.main_thread) for e in eps] == [
        (pid, pid, "pickle", True)
    ] * len(PLAN["checkpoints"]), (load_said, eps)
    for k, (ep, cp) in enumerate(zip(eps, truth, strict=True)):
        assert not ep.truncated, (k, load_said, ep)
        assert ep.timed_by == "stack changes", (k, load_said, ep)
        assert ep.timing_period_s == pytest.approx(1 / TIMING_HZ), (k, load_said, ep)
        if not cp["durable"]:
            assert not ep.durable, (k, ep)  # nothing fsynced: no tail to see
    return Profiled(reports, eps, truth, load.cores)


def _expected(ep: Episode, cp: dict[str, float]) -> tuple[float, float]:
    """The true duration and CPU the episode stands for: a tail that was seen is the
    checkpoint's; one that was not, is not in wall_s."""
    if ep.durable:
        return cp["total_s"], cp["total_cpu_s"]
    return cp["dump_s"], cp["dump_cpu_s"]


def _profile(tmp_path: Path) -> tuple[list[WindowReport], list[dict[str, float]]]:
    """Run the workload under the profile session's sampling path (back-to-back windows:
    py-spy --idle at RATE_HZ plus the on-CPU run), return its windows and its own times."""
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    result = tmp_path / "result.json"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(WORKLOAD), str(tmp_path), str(tmp_path / "plan.json"), str(result)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    stop = StopEvent()
    raws: queue.Queue[RawWindow | BaseException | None] = queue.Queue()

    def sample() -> None:
        try:
            while not stop.is_set():
                raw = collect_window(
                    proc.pid,
                    duration_s=WINDOW_S,
                    plan=SamplingPlan(
                        rate_hz=RATE_HZ, on_cpu_run=True, poll_s=POLL_S, timing_rate_hz=TIMING_HZ
                    ),
                    stop_event=stop,
                )
                raws.put(raw)
                if raw.exited:
                    break
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test thread
            raws.put(exc)
        raws.put(None)

    sampler = threading.Thread(target=sample, name="episode-test-sampler")
    try:
        assert proc.stdout.readline().strip() == "ready"
        sampler.start()
        time.sleep(0.5)  # the first window is sampling before the first checkpoint
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done"
        stop.set()
        sampler.join(timeout=30)
        proc.stdin.write("write\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()
    # classified after sampling, so the classifier does not compete with py-spy for CPU
    classifier = Classifier.default()
    reports = []
    while (item := raws.get()) is not None:
        if isinstance(item, BaseException):
            raise item
        reports.append(finish_window(item, classifier))
    return reports, json.loads(result.read_text())["checkpoints"]


def two_windows(reports: list[WindowReport], ep: Episode) -> bool:
    """Whether the episode's start and end fall in different windows (or in a gap)."""

    def window_of(t: float) -> int | None:
        return next((i for i, r in enumerate(reports) if r.started_at <= t <= r.ended_at), None)

    first = window_of(ep.start)
    return first is None or first != window_of(ep.end)


# real py-spy timing real dumps: alone (make check), but at any load of other processes
@pytest.mark.serial
def test_known_blocking_dumps_give_their_episodes_within_their_stated_resolution(
    tmp_path: Path,
) -> None:
    """At any load: each episode's stated resolution covers the checkpoint's true
    duration and CPU. Beside busy processes py-spy falls behind and serwatt says so by a
    wider resolution (2.66 s in one run at load 4-9); that is the claim, and it holds."""
    run = _episodes(tmp_path)
    for k, (ep, cp) in enumerate(zip(run.episodes, run.truth, strict=True)):
        wall, cpu = _expected(ep, cp)
        half = error_quantile_s(ep.resolution_s, ep.timed_by, CLAIM_P)
        err, cpu_err = ep.wall_s - wall, ep.cpu_s - cpu
        said = (
            f"episode {k}: wall {ep.wall_s:.3f} s, cpu {ep.cpu_s:.3f} s against the job's "
            f"{wall:.3f} s and {cpu:.3f} s; resolution {ep.resolution_s:.3f} s "
            f"(clock {ep.clock_s:.3f} s, host lag {ep.host_lag_s:.3f} s), its "
            f"{1 - CLAIM_P:.2%} quantile {half:.3f} s; "
            f"other processes used {run.others_cores:.2f} cores; {ep}"
        )
        # an episode that began or ended in a gap between windows may be longer than seen
        assert -half - ep.edge_unknown_s <= err <= half, said
        # an edge placed dt off moves cpu_s by at most dt, plus the CPU clock's interpolation;
        # the CPU clock is polled on the host's clock, which the edges' may be up to
        # host_lag_s behind (py-spy started late: 3.6 s at load 38, where cpu_s read 0.000
        # s against 0.178 s with wall_s right to 2 ms)
        cpu_half = half + ep.host_lag_s + CPU_INTERPOLATION_S
        assert -cpu_half - ep.edge_unknown_s <= cpu_err <= cpu_half, said


@pytest.mark.serial  # the quiet node's figures: the load is measured, and said
def test_known_blocking_dumps_give_their_episodes_on_a_quiet_node(tmp_path: Path) -> None:
    run = _episodes(tmp_path, quiet=True)
    sure_tails = 0
    errors_ms = []
    for k, (ep, cp) in enumerate(zip(run.episodes, run.truth, strict=True)):
        # a tail is sure to be seen when the fsync is long and the episode did not end in a
        # gap between windows (there the tail is unobserved: edge_unknown_s)
        sure = cp["sync_s"] >= SURE_TAIL_PERIODS * ep.timing_period_s and ep.edge_unknown_s == 0
        if cp["durable"] and sure:
            assert ep.durable, (k, ep, cp)
            sure_tails += 1
        expected, expected_cpu = _expected(ep, cp)
        err = ep.wall_s - expected
        cpu_err = ep.cpu_s - expected_cpu
        errors_ms.append((round(err * 1000, 1), round(cpu_err * 1000, 1)))
        # edges in two windows are on two py-spy clocks (which windows: the test's own
        # reading of the windows' spans, not serwatt's clock_s)
        bound = PERIODS / RATE_HZ + (CLOCK_S if two_windows(run.reports, ep) else 0.0)
        said = (k, errors_ms, f"other processes used {run.others_cores:.2f} cores", ep, cp)
        # an episode that began or ended in a gap between windows may be longer than seen
        assert -bound - ep.edge_unknown_s <= err <= bound, said
        # the stated resolution is no wider than the claim plus its own clock term
        assert ep.resolution_s <= PERIODS / RATE_HZ + ep.clock_s, said
        # the episode's CPU against the thread's own CPU clock over the same span; the
        # CPU of a part a gap hid is not in cpu_s, as its time is not in wall_s
        cpu_bound = bound + CPU_INTERPOLATION_S
        assert -cpu_bound - ep.edge_unknown_s <= cpu_err <= cpu_bound, said
    syncs = [round(cp["sync_s"] * 1000) for cp in run.truth if cp["durable"]]
    assert sure_tails >= 1, (
        f"every fsync of {PLAN['sync_mb']} MiB took under {SURE_TAIL_PERIODS} ticks "
        f"({syncs} ms) on {tmp_path}: too short to be sampled for sure; raise sync_mb"
    )


# ------------------------------------------------------------------ pure: GPU per episode


def _gpu_window(pids: frozenset[int], *, energy: bool = True, up: bool = True):  # type: ignore[no-untyped-def]
    from serwatt.collectors.nvml import GpuWindow, UtilInterval

    # busy 100-101, idle 101-103 (a stall), half busy 103-104; 100 W + 300 W x busy
    intervals = (
        UtilInterval(100.0, 101.0, 1.0),
        UtilInterval(101.0, 103.0, 0.0),
        UtilInterval(103.0, 104.0, 0.5),
    )
    points = ((100.0, 0.0), (101.0, 400.0), (103.0, 600.0), (104.0, 850.0)) if energy else ()
    return GpuWindow(
        index=0, uuid=None, name="replay", up=up, reason=None, start=100.0, end=104.0,
        intervals=intervals, energy_points=points, pids=pids,
    )  # fmt: skip


def _episode(start: float, end: float) -> Episode:
    return Episode(
        pid=PID, thread=PID, codepath="torch", start=start, end=end, wall_s=end - start,
        period_s=P, resolution_s=P, cpu_s=0.0, main_thread=True, durable=False,
    )  # fmt: skip


def test_an_episode_gets_the_gpu_idle_seconds_and_idle_joules_of_its_span() -> None:
    from serwatt.profiler.attribution.window import episode_with_gpu

    # 100.5-103.5: busy 0.5 s (no wait), idle 2 s at 100 J/s, half busy 0.5 s
    ep = episode_with_gpu(_episode(100.5, 103.5), [_gpu_window(frozenset({PID}))])
    assert ep.gpu_wait_s == pytest.approx(2.0 + 0.5 * 0.5)
    # idle joules: 200 J over the stall, plus half of 103-103.5's interpolated 125 J
    assert ep.gpu_idle_j == pytest.approx(200.0 + 0.5 * 125.0)


def test_an_episode_without_its_gpu_or_energy_says_unknown_not_zero() -> None:
    from serwatt.collectors.nvml import UtilInterval
    from serwatt.profiler.attribution.window import episode_with_gpu

    ep = _episode(101.0, 102.0)
    other_pid = episode_with_gpu(ep, [_gpu_window(frozenset({PID + 1}))])
    assert other_pid.gpu_wait_s is None and other_pid.gpu_idle_j is None
    down = episode_with_gpu(ep, [_gpu_window(frozenset({PID}), up=False)])
    assert down.gpu_wait_s is None and down.gpu_idle_j is None
    no_energy = episode_with_gpu(ep, [_gpu_window(frozenset({PID}), energy=False)])
    assert no_energy.gpu_wait_s == pytest.approx(1.0) and no_energy.gpu_idle_j is None
    # NVML samples that stop 1 s before the episode ends (a poll not yet made) would read
    # as 1 s of wait where the span had more: unknown, not short. Within two sample
    # periods of each edge (the default 1/6 s here) the span counts as covered.
    short = _gpu_window(frozenset({PID}))
    short = dataclasses.replace(short, intervals=short.intervals[:2])  # ends at 103
    assert episode_with_gpu(_episode(101.0, 104.0), [short]).gpu_wait_s is None
    assert episode_with_gpu(_episode(99.0, 102.0), [short]).gpu_wait_s is None  # begins late
    edge = episode_with_gpu(_episode(101.0, 103.3), [short])
    assert edge.gpu_wait_s == pytest.approx(2.0)
    # a hole inside (a sample stamped 0 and dropped) is neither idle nor busy
    holed = dataclasses.replace(short, intervals=short.intervals[:1] + (
        UtilInterval(101.5, 103.0, 0.0),
    ))  # fmt: skip
    assert episode_with_gpu(_episode(100.5, 103.0), [holed]).gpu_wait_s == pytest.approx(1.5)
