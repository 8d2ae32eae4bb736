"""Ledger: monotonic counters, bounded labels, immutable snapshots."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.classify.direction import CODEPATH_DIRECTIONS
from serwatt.profiler.service.ledger import Ledger, TargetProcess


def _ledger(*targets: str) -> Ledger:
    ledger = Ledger()
    ledger.set_targets(targets or ("trainer",))
    return ledger


def test_every_codepath_and_direction_starts_at_zero_for_every_target():
    ledger = _ledger("trainer", "loader")
    ledger.declare_energy_source("model")
    ledger.declare_gpu(0)
    snap = ledger.publish()
    # 9 serializers x encode / decode / unknown, and `other` x unknown alone
    pairs = {(cp, d) for cp in CODEPATHS if cp != "other" for d in ("encode", "decode", "unknown")}
    assert set(CODEPATH_DIRECTIONS) == pairs | {("other", "unknown")}
    for target in ("trainer", "loader"):
        assert {(cp, d) for (t, cp, d) in snap.samples if t == target} == set(CODEPATH_DIRECTIONS)
        for cp, d in CODEPATH_DIRECTIONS:
            assert snap.samples[(target, cp, d)] == 0
            assert snap.cpu_s[(target, cp, d)] == 0.0
            assert snap.energy_j[(target, cp, d, "model")] == 0.0
            assert snap.gpu_wait_s[(target, cp, d, "0")] == 0.0
            assert snap.gpu_wait_energy_j[(target, cp, d, "0")] == 0.0
    assert snap.node_cpu_energy_j == {"model": 0.0}
    assert snap.gpu_idle_s == {"0": 0.0}


def test_windows_accumulate_and_snapshots_do_not_change_afterwards():
    ledger = _ledger()
    ledger.add_window(
        "trainer",
        samples={("pickle", "encode"): 10, ("other", "unknown"): 5},
        cpu_s={("pickle", "encode"): 0.2},
    )
    first = ledger.publish()
    ledger.add_window(
        "trainer",
        samples={("pickle", "encode"): 1, ("pickle", "decode"): 4},
        cpu_s={("pickle", "encode"): 0.05},
        energy_j={("pickle", "encode"): 3.0},
        energy_source="rapl",
        gpu_wait_s={("pickle", "decode", 1): 0.5},
        gpu_wait_energy_j={("pickle", "decode", 1): 20.0},
    )
    # Not published yet: readers still see the first snapshot.
    assert ledger.snapshot() is first
    second = ledger.publish()
    assert first.samples[("trainer", "pickle", "encode")] == 10
    assert second.samples[("trainer", "pickle", "encode")] == 11
    assert second.samples[("trainer", "pickle", "decode")] == 4
    assert second.cpu_s[("trainer", "pickle", "encode")] == pytest.approx(0.25)
    assert second.energy_j[("trainer", "pickle", "encode", "rapl")] == 3.0
    # A new source is zero-filled for every codepath and direction at once.
    assert second.energy_j[("trainer", "json", "decode", "rapl")] == 0.0
    assert second.gpu_wait_s[("trainer", "pickle", "decode", "1")] == 0.5
    assert second.gpu_wait_energy_j[("trainer", "pickle", "decode", "1")] == 20.0
    assert second.windows == 2
    with pytest.raises(TypeError):
        second.samples[("trainer", "pickle", "encode")] = 0  # type: ignore[index]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"samples": {("pickles", "encode"): 1}, "cpu_s": {}}, "closed set"),
        ({"samples": {"pickle": 1}, "cpu_s": {}}, r"must be \(codepath, direction\)"),
        ({"samples": {("pickle", "write"): 1}, "cpu_s": {}}, "direction 'write'"),
        ({"samples": {("other", "encode"): 1}, "cpu_s": {}}, "direction 'encode'"),
        ({"samples": {("pickle", "encode"): -1}, "cpu_s": {}}, ">= 0"),
        ({"samples": {}, "cpu_s": {("json", "decode"): float("nan")}}, ">= 0"),
        ({"samples": {}, "cpu_s": {}, "energy_j": {("json", "decode"): 1.0}}, "source"),
        ({"samples": {}, "cpu_s": {}, "energy_j": {}, "energy_source": "RAPL!"}, "source"),
        ({"samples": {}, "cpu_s": {}, "gpu_wait_s": {("json", "decode", "gpu0"): 1.0}}, "index"),
        ({"samples": {}, "cpu_s": {}, "gpu_wait_s": {("json", 0): 1.0}}, "gpu"),
    ],
)
def test_bad_window_is_rejected_and_changes_nothing(kwargs, message):
    ledger = _ledger()
    before = ledger.publish()
    with pytest.raises(ValueError, match=message):
        ledger.add_window("trainer", **kwargs)
    after = ledger.publish()
    assert dict(after.samples) == dict(before.samples)
    assert dict(after.cpu_s) == dict(before.cpu_s)
    assert dict(after.gpu_wait_s) == dict(before.gpu_wait_s)
    assert after.windows == 0


def test_unknown_target_cannot_become_a_label():
    ledger = _ledger()
    with pytest.raises(ValueError, match="unknown target 'python3 train.py'"):
        ledger.add_window("python3 train.py", samples={("other", "unknown"): 1}, cpu_s={})
    with pytest.raises(ValueError, match="unknown target"):
        ledger.add_sampler_error("12345", "target_gone")


def test_removed_target_keeps_totals_and_goes_down():
    ledger = _ledger("a", "b")
    ledger.add_window("a", samples={("json", "decode"): 4}, cpu_s={("json", "decode"): 1.0})
    ledger.set_target_processes("a", [TargetProcess(42, "3.12.1")])
    ledger.set_targets(["b"])
    snap = ledger.publish()
    state = {t.name: t for t in snap.targets}
    assert not state["a"].configured and not state["a"].up and state["a"].processes == ()
    assert snap.samples[("a", "json", "decode")] == 4
    assert state["b"].configured


def test_node_energy_cannot_attribute_more_than_measured():
    ledger = _ledger()
    ledger.add_node_energy("rapl", node_j=10.0, unattributed_j=10.0)
    with pytest.raises(ValueError, match="exceeds node energy"):
        ledger.add_node_energy("rapl", node_j=1.0, unattributed_j=2.0)
    snap = ledger.publish()
    assert snap.node_cpu_energy_j["rapl"] == 10.0
    assert snap.unattributed_energy_j["rapl"] == 10.0


def test_sampler_errors_and_collectors():
    ledger = _ledger()
    ledger.add_sampler_error("trainer", "not_python")
    ledger.add_sampler_error("trainer", "not_python")
    with pytest.raises(ValueError, match="kind"):
        ledger.add_sampler_error("trainer", "No such process: 123")
    ledger.set_collector("rapl", up=False, duration_s=0.002, detail="unavailable: permission")
    snap = ledger.publish()
    assert snap.sampler_errors[("trainer", "not_python")] == 2
    assert snap.collectors["rapl"].up is False
    assert snap.collectors["rapl"].detail == "unavailable: permission"


def test_own_cpu_and_sampling_rate():
    ledger = _ledger()
    assert ledger.publish().self_cpu_s == {} and ledger.snapshot().cpu_budget_cores is None
    ledger.add_self_cpu("daemon", 0.5)
    ledger.add_self_cpu("daemon", 0.25)
    ledger.add_self_cpu("samplers", 2.0)
    ledger.set_sampling(rate_hz=27.0, budget_cores=0.1)
    with pytest.raises(ValueError, match=">= 0"):
        ledger.add_self_cpu("daemon", -0.1)  # a counter never goes down
    with pytest.raises(ValueError, match="part"):
        ledger.add_self_cpu("py-spy 1234", 1.0)  # label values are identifiers
    with pytest.raises(ValueError, match="rate"):
        ledger.set_sampling(rate_hz=float("nan"), budget_cores=None)
    snap = ledger.publish()
    assert dict(snap.self_cpu_s) == {"daemon": 0.75, "samplers": 2.0}
    assert (snap.sample_rate_hz, snap.cpu_budget_cores) == (27.0, 0.1)


def test_snapshot_reads_never_wait_for_writers():
    ledger = _ledger()
    published = ledger.publish()
    with ledger._lock:  # a writer holding the lock for as long as it likes
        result: list = []
        reader = threading.Thread(target=lambda: result.append(ledger.snapshot()))
        reader.start()
        reader.join(timeout=10)
        assert result == [published]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(CODEPATH_DIRECTIONS),
            st.integers(min_value=0, max_value=10_000),
            st.floats(min_value=0, max_value=1e4, allow_nan=False),
        ),
        max_size=40,
    )
)
def test_counters_never_decrease(windows):
    ledger = _ledger()
    previous = ledger.publish()
    for key, n, s in windows:
        ledger.add_window(
            "trainer", samples={key: n}, cpu_s={key: s}, energy_j={key: s}, energy_source="model"
        )
        snap = ledger.publish()
        for key, value in previous.samples.items():
            assert snap.samples[key] >= value
        for key, value in previous.cpu_s.items():
            assert snap.cpu_s[key] >= value
        for key, value in previous.energy_j.items():
            assert snap.energy_j[key] >= value
        previous = snap
    assert sum(previous.samples.values()) == sum(n for _, n, _ in windows)
