"""The daemon's schedule in fake time, exactly (tests/daemon_fakes.py): the real Daemon,
pools, ledger and recorder over fake processes, with its clock and its sampler replaced.

docs/daemon.md: slots are back to back and a slot waits for all its windows; an idle slot
lasts `window_s` or ends as soon as a re-scan brings a process to sample; at most
`max_concurrent_samplers` windows at once, least recently sampled first; a window 15 s
past its end is told to stop, one still running 15 s later is abandoned (`window_timeout`)
and keeps its place in the limit until it ends; serwatt's own sampling failures are
retried after window_s x (2^(n-1) - 1), at most 60 s, a refusal by the target after 60 s;
SIGHUP applies at once to the windows it starts, not to those in flight.

The daemon's main thread wakes every 0.5 s while it waits (WAKE_S), and at once when a
window ends; the times below follow from that and the documented rules.
"""

from __future__ import annotations

from pathlib import Path

from serwatt.collectors.pyspy import NotPython, SamplingError
from tests.daemon_fakes import FakeTimeDaemon, Scripted

WAKE_S = 0.5
OVERRUN_S = 15.0  # docs/daemon.md, "Bounded work"
ABANDON_AFTER_S = 15.0
RETRY_REFUSED_S = 60.0  # docs/daemon.md, sampler error kinds


def documented_delay_s(failures_in_a_row: int, window_s: float) -> float:
    return min(60.0, window_s * (2 ** (failures_in_a_row - 1) - 1))


def errors(d: FakeTimeDaemon) -> dict[tuple[str, str], int]:
    return dict(d.daemon.ledger.snapshot().sampler_errors)


def test_sampler_failures_are_retried_on_the_documented_schedule(tmp_path: Path) -> None:
    # Window 1 works, 2-6 fail 2.5 s in (py-spy crashed), 7 works, 8 fails, 9 works.
    failing = {2, 3, 4, 5, 6, 8}

    def script(pid: int, n: int) -> Scripted:
        return Scripted(2.5, SamplingError("py-spy crashed")) if n in failing else Scripted()

    d = FakeTimeDaemon(tmp_path, {"a": "alpha"}, {101: "alpha"}, window_s=10, script=script)
    assert d.run_until(200.0) == 0
    expected, t, in_a_row = [], 0.0, 0
    for n in range(1, 10):
        expected.append(t)
        if n in failing:
            in_a_row += 1
            t += 2.5 + documented_delay_s(in_a_row, 10)
        else:
            in_a_row, t = 0, t + 10
    # 0, 10, 12.5 (retried at once), 25 (+10), 57.5 (+30), 120 (+60 cap), 182.5, ...
    assert expected[:6] == [0, 10, 12.5, 25, 57.5, 120]
    assert d.started() == expected
    assert errors(d) == {("a", "sampler_failed"): len(failing)}


def test_a_target_refusal_is_retried_after_60_s(tmp_path: Path) -> None:
    def script(pid: int, n: int) -> Scripted:
        return Scripted(0.25, NotPython("not python")) if n == 1 else Scripted()

    d = FakeTimeDaemon(tmp_path, {"a": "alpha"}, {101: "alpha"}, window_s=1, script=script)
    assert d.run_until(62.0) == 0
    assert d.started() == [0.0, 0.25 + RETRY_REFUSED_S, 1.25 + RETRY_REFUSED_S]
    assert errors(d) == {("a", "not_python"): 1}


def test_an_overrunning_window_is_stopped_and_its_samples_kept(tmp_path: Path) -> None:
    # The first window would run 100 s; it honours its stop request.
    d = FakeTimeDaemon(
        tmp_path,
        {"a": "alpha"},
        {101: "alpha"},
        script=lambda pid, n: Scripted(100.0) if n == 1 else Scripted(),
    )
    assert d.run_until(18.0) == 0
    first = d.sampler.attempts[0]
    # told to stop at the first wake strictly after window end + 15 s
    assert first.stop_seen is not None and first.stop_seen - 1000 == 1 + OVERRUN_S + WAKE_S
    assert d.started() == [0.0, 16.5, 17.5]
    assert errors(d) == {}
    assert d.daemon.ledger.snapshot().windows == 3


def test_an_abandoned_window_keeps_its_slot_until_it_ends(tmp_path: Path) -> None:
    # max_concurrent_samplers 1: a's first window hangs (ignores its stop) until t = 40,
    # when the sampler's own kill bound would end it.
    d = FakeTimeDaemon(
        tmp_path,
        {"a": "alpha", "b": "beta"},
        {101: "alpha", 102: "beta"},
        max_concurrent_samplers=1,
        script=lambda pid, n: (
            Scripted(40.0, SamplingError("killed"), ignores_stop=True)
            if (pid, n) == (101, 1)
            else Scripted()
        ),
    )
    seen: dict[float, dict] = {}
    for t in (31.25, 31.75):
        d.at(t, lambda t=t: seen.setdefault(t, errors(d)))
    assert d.run_until(43.0) == 0
    hung = d.sampler.attempts[0]
    assert hung.stop_seen is not None and hung.stop_seen - 1000 == 1 + OVERRUN_S + WAKE_S
    # abandoned at the first wake after end + 15 s + 15 s (31.5): counted then ...
    assert seen == {31.25: {}, 31.75: {("a", "window_timeout"): 1}}
    # ... but no other window starts until its thread has ended, at 40
    assert [(a.pid, a.started - 1000) for a in d.sampler.attempts] == [
        (101, 0.0),
        (102, 40.0),
        (101, 41.0),
        (102, 42.0),
    ]
    # its late error is not counted: the window was already given up
    assert errors(d) == {("a", "window_timeout"): 1}


def test_a_slot_waits_for_its_longest_window_and_the_next_starts_at_its_end(
    tmp_path: Path,
) -> None:
    d = FakeTimeDaemon(
        tmp_path,
        {"a": "alpha", "b": "beta"},
        {101: "alpha", 102: "beta"},
        script=lambda pid, n: Scripted(1.25 if pid == 101 else 2.75) if n == 1 else Scripted(),
    )
    assert d.run_until(4.0) == 0
    assert d.started(101) == [0.0, 2.75, 3.75] and d.started(102) == [0.0, 2.75, 3.75]


def test_an_idle_slot_ends_when_a_rescan_finds_a_process(tmp_path: Path) -> None:
    # Nothing to sample at first; a process appears at 0.3; rescan_s is 0.5, so the
    # re-scan at 0.5 finds it and the idle slot (which would last to 10) ends then.
    d = FakeTimeDaemon(tmp_path, {"a": "alpha"}, {}, window_s=10)
    d.at(0.3, lambda: d.add_proc(101, "alpha"))
    assert d.run_until(11.0) == 0
    assert d.started() == [0.5, 10.5]


def test_at_most_max_concurrent_windows_least_recently_sampled_first(tmp_path: Path) -> None:
    procs = {100 + i: f"proc{i}x" for i in range(1, 6)}
    d = FakeTimeDaemon(
        tmp_path,
        {f"t{i}": f"proc{i}x" for i in range(1, 6)},
        procs,
        max_concurrent_samplers=2,
        # uneven windows: the bound holds however they end
        script=lambda pid, n: Scripted(0.5 + 0.25 * ((pid + n) % 3)),
    )
    assert d.run_until(6.0) == 0
    attempts = d.sampler.attempts
    # each slot takes the two least recently sampled (ties in discovery order, by pid)
    last = dict.fromkeys(sorted(procs), -1)
    model = []
    for slot in range(8):
        pair = sorted(last, key=lambda p: (last[p], p))[:2]
        model += pair
        last.update(dict.fromkeys(pair, slot))
    assert model[:10] == [101, 102, 103, 104, 105, 101, 102, 103, 104, 101]
    pids = [a.pid for a in attempts]
    assert len(pids) == 14 and pids == model[:14]
    edges = sorted({a.started for a in attempts} | {a.ended for a in attempts if a.ended})
    live = [sum(1 for a in attempts if a.started <= t < (a.ended or 1e9)) for t in edges]
    assert max(live) == 2
    # and a slot's pair starts together, when the previous pair has ended
    for first, second in zip(attempts[0:-1:2], attempts[1::2], strict=False):
        assert first.started == second.started


def test_sighup_applies_to_the_next_windows_not_those_in_flight(tmp_path: Path) -> None:
    d = FakeTimeDaemon(
        tmp_path,
        {"a": "alpha", "b": "beta"},
        {101: "alpha", 102: "beta", 103: "gamma"},
    )
    # mid-window: b is removed, c added, windows 2 s at 20 Hz
    d.at(2.25, lambda: d.reload({"a": "alpha", "c": "gamma"}, window_s=2, sample_rate_hz=20))
    samples_b: list[int] = []
    d.at(2.75, lambda: samples_b.append(_samples(d, "b")))
    assert d.run_until(9.0) == 0
    got = [
        (a.pid, a.started - 1000, a.ended - 1000, a.window_s, a.rate_hz) for a in d.sampler.attempts
    ]
    before = [(p, t, t + 1, 1.0, 10.0) for t in (0.0, 1.0, 2.0) for p in (101, 102)]
    # the windows in flight at the reload run as they started; the next slot starts
    # when they end, with the new keys, c included and b never again
    after = [(p, t, t + 2, 2.0, 20.0) for t in (3.0, 5.0, 7.0) for p in (101, 103)]
    assert sorted(got) == sorted(before + after)
    # b's window in flight at the reload is counted
    assert samples_b == [2] and _samples(d, "b") == 3


def _samples(d: FakeTimeDaemon, target: str) -> int:
    snap = d.daemon.ledger.snapshot()
    return sum(n for (t, _cp, _d), n in snap.samples.items() if t == target)
