"""Parser tests on py-spy 0.4.3 outputs recorded from real processes (tests/fixtures/sampling).

ss-py3.10.json / ss-py3.12.json: `record --nonblocking --idle --threads --full-filenames
-f speedscope -r 50 -d 1` against a process with a busy MainThread (pickle.dumps +
json.dumps) and an idle thread "idler" (time.sleep) on CPython 3.10.13 and 3.12.1.
ss-errors.json: a deep `json.dumps(indent=1)` loop at 100 Hz (nonblocking errors and
truncated stacks). ss-exited.json: a target that exited 0.3 s into a 3 s window.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serwatt.collectors.pyspy.speedscope import (
    assemble_samples,
    parse_speedscope,
    parse_status,
    partial_flags,
    tick_indices,
    tick_times,
)
from serwatt.collectors.pyspy.threads import ThreadMapping
from serwatt.collectors.samples import Frame

FIX = Path(__file__).parents[1] / "fixtures" / "sampling"


def load(name: str) -> dict:
    return json.loads((FIX / name).read_text())


def test_py312_tracks_have_kernel_tids_and_leaf_first_frames() -> None:
    tracks = {t.name: t for t in parse_speedscope(load("ss-py3.12.json"))}
    assert set(tracks) == {"MainThread", "idler"}
    main, idler = tracks["MainThread"], tracks["idler"]
    assert main.os_tid is not None and main.pthread_id is None
    assert idler.os_tid is not None and idler.os_tid != main.os_tid
    # --idle: every thread sampled on every tick
    assert len(main.stacks) == len(idler.stacks) == 49
    for stack in main.stacks:
        assert stack[-1].name == "<module>"  # root last
        assert not any(f.name.startswith("thread (") for f in stack)  # pseudo-frame dropped
        assert all(f.line > 0 for f in stack)
    assert {s[0].name for s in idler.stacks} == {"idle"}
    leaves = {s[0].filename.rsplit("/", 1)[-1] for s in main.stacks}
    assert "encoder.py" in leaves  # json.dumps shows stdlib frames
    assert "mix.py" in leaves  # pickle.dumps shows only the caller line


def test_py310_tracks_carry_pthread_ids_not_tids() -> None:
    tracks = parse_speedscope(load("ss-py3.10.json"))
    assert {t.name for t in tracks} == {"MainThread", "idler"}
    for t in tracks:
        assert t.os_tid is None
        assert t.pthread_id is not None and t.pthread_id > 2**32  # a pointer, not a tid
    # <3.11 reports bare function names, 3.11+ qualnames
    names = {f.name for t in tracks for s in t.stacks for f in s}
    assert "_bootstrap_inner" in names and "Thread._bootstrap_inner" not in names


def test_status_lines() -> None:
    ok = parse_status((FIX / "stdout-py3.12.txt").read_text())
    assert (ok.samples, ok.errors, ok.target_exited, ok.behind_s) == (98, 0, False, 0.0)
    exited = parse_status((FIX / "stdout-exited.txt").read_text())
    assert exited.target_exited and exited.samples == 14
    errs = parse_status((FIX / "stdout-errors.txt").read_text())
    assert errs.samples == 178 and errs.errors == 21
    # format string from the py-spy 0.4.3 binary: "{:.2?} behind in sampling, ..."
    lag = parse_status(
        "py-spy> 1.52s behind in sampling, results may be inaccurate. Try reducing the "
        "sampling rate.\npy-spy> 850.00ms behind in sampling, results may be inaccurate.\n"
    )
    assert lag.behind_s == pytest.approx(1.52) and lag.behind_events == 2
    assert parse_status("").samples is None


def test_partial_stacks_found_in_nonblocking_errors_fixture() -> None:
    (track,) = parse_speedscope(load("ss-errors.json"))
    flags = partial_flags(track.stacks)
    partial = [s for s, f in zip(track.stacks, flags, strict=True) if f]
    whole = [s for s, f in zip(track.stacks, flags, strict=True) if not f]
    assert partial and whole
    assert all(s[-1].name == "<module>" for s in whole)
    assert all(not s or s[-1].name != "<module>" for s in partial)


def test_exited_fixture_yields_samples_so_far() -> None:
    (track,) = parse_speedscope(load("ss-exited.json"))
    assert 0 < len(track.stacks) < 50  # 0.3 s of a 3 s window


def test_assemble_times_and_mapping() -> None:
    tracks = parse_speedscope(load("ss-py3.12.json"))
    mapping = ThreadMapping(tid_of={t.label: int(t.label) for t in tracks}, method={}, unmapped=())
    status = parse_status((FIX / "stdout-py3.12.txt").read_text())
    w = assemble_samples(
        100,
        tracks,
        status,
        mapping,
        started_at=1000.0,
        ended_at=1001.0,
        rate_hz=50,
        alive_tids={t.os_tid for t in tracks if t.os_tid},
    )
    assert w.ticks == 49 and len(w.samples) == 98
    assert all(1000.0 < s.t < 1001.0 for s in w.samples)
    assert [s.t for s in w.samples] == sorted(s.t for s in w.samples)
    assert w.errors.pyspy_samples == 98 and w.errors.partial_stacks == 0


def test_assemble_counts_unmapped_threads() -> None:
    tracks = parse_speedscope(load("ss-py3.10.json"))
    w = assemble_samples(
        1,
        tracks,
        parse_status(""),
        ThreadMapping({}, {}, tuple(t.label for t in tracks)),
        started_at=0.0,
        ended_at=1.0,
        rate_hz=50,
        alive_tids=set(),
    )
    assert all(s.tid is None for s in w.samples)
    assert any("2 thread(s) not mapped" in n for n in w.errors.notes)
    assert any("no 'Samples: N" in n for n in w.errors.notes)


def test_bad_documents_are_rejected_clearly() -> None:
    with pytest.raises(ValueError, match="not a py-spy speedscope document"):
        parse_speedscope({"profiles": []})
    with pytest.raises(ValueError, match="unexpected speedscope profile name"):
        parse_speedscope({"shared": {"frames": []}, "profiles": [{"name": "Proc 1"}]})


@given(st.integers(0, 500), st.integers(1, 500), st.booleans())
def test_tick_indices_in_range_and_ordered(n: int, ticks: int, alive: bool) -> None:
    n = min(n, ticks)
    idx = tick_indices(n, ticks, alive_at_end=alive)
    assert len(idx) == n and idx == sorted(set(idx))
    assert all(0 <= i < ticks for i in idx)
    if alive and n:
        assert idx[-1] == ticks - 1
    elif n:
        assert idx[0] == 0


@given(st.integers(1, 1000), st.floats(0, 1e9), st.floats(0.01, 600))
def test_tick_times_inside_span(n: int, start: float, span: float) -> None:
    times = tick_times(n, start, start + span)
    assert len(times) == n
    assert all(start <= t <= start + span for t in times)
    assert times == sorted(times)


def test_partial_flags_empty_stacks() -> None:
    f = Frame("<module>", "/a.py", 1)
    assert partial_flags([(), (f,)]) == [True, False]
    assert partial_flags([(), ()]) == [True, True]
