"""How the scheduler timeline pairs switches, on lines written as the kernel writes them:
a missing switch-in or switch-out leaves no interval and one `unknown` span that covers
where the thread may have run."""

from __future__ import annotations

from serwatt.collectors import sched_timeline as st


def _switch(ts: float, prev: int, state: str, nxt: int) -> bytes:
    return (
        f"  python-{prev} [000] d..2. {ts:.6f}: sched_switch: prev_comm=python prev_pid={prev} "
        f"prev_prio=120 prev_state={state} ==> next_comm=python next_pid={nxt} next_prio=120"
    ).encode()


def _timeline(lines: list[bytes]) -> st.SchedTimeline:
    tl = st.SchedTimeline([])
    tl.started_s = 100.0
    tl._track(7, "python", 1, 100.0)  # born under the trace: its first switch is known
    tl._feed(b"\n".join(lines) + b"\n")
    return tl


def test_paired_switches_make_intervals_and_no_unknown_span() -> None:
    tl = _timeline([_switch(100.1, 0, "R", 7), _switch(100.3, 7, "S", 0)])
    th = tl.threads()[7]
    assert th.intervals == [st.OnCpu(100.1, 100.3, st.BLOCKED)] and th.unknown == []
    assert tl.counters().unpaired_switches == 0


def test_a_missing_switch_in_is_an_unknown_span_from_the_last_known_switch() -> None:
    # preempted at 100.2; the switch-in before the blocked switch-out at 100.6 is missing
    lines = [_switch(100.1, 0, "R", 7), _switch(100.2, 7, "R", 0), _switch(100.6, 7, "S", 0)]
    lines += [_switch(100.9, 0, "R", 7), _switch(101.0, 7, "S", 0)]
    tl = _timeline(lines)
    th = tl.threads()[7]
    assert th.intervals == [
        st.OnCpu(100.1, 100.2, st.PREEMPTED),
        st.OnCpu(100.9, 101.0, st.BLOCKED),
    ]
    assert th.unknown == [(100.2, 100.6)]
    assert tl.counters().unpaired_switches == 1


def test_a_missing_switch_out_is_an_unknown_span_from_the_open_switch_in() -> None:
    lines = [_switch(100.1, 0, "R", 7), _switch(100.5, 0, "R", 7), _switch(100.7, 7, "S", 0)]
    tl = _timeline(lines)
    th = tl.threads()[7]
    assert th.intervals == [st.OnCpu(100.5, 100.7, st.BLOCKED)]
    assert th.unknown == [(100.1, 100.5)]
    assert tl.counters().unpaired_switches == 1


def test_back_to_back_unpaired_switches_are_one_span() -> None:
    # two switch-outs in a row with no switch-in between, then a third
    lines = [_switch(100.1, 0, "R", 7), _switch(100.2, 7, "R", 0), _switch(100.4, 7, "R", 0)]
    lines += [_switch(100.5, 7, "S", 0)]
    tl = _timeline(lines)
    th = tl.threads()[7]
    assert th.unknown == [(100.2, 100.5)]
    assert tl.counters().unpaired_switches == 2
