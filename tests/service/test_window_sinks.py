"""The daemon's sinks of the window pipeline (profiler/service/window_sinks.py)."""

from __future__ import annotations

import pytest

from serwatt.profiler.attribution.pipeline import WindowRejected
from serwatt.profiler.attribution.window import AttributedWindow
from serwatt.profiler.service.ledger import Ledger
from serwatt.profiler.service.window_sinks import LedgerSink
from tests.attribution.test_pipeline import _report


def test_the_ledger_refuses_a_malformed_window_and_counts_none_of_it() -> None:
    ledger = Ledger()
    ledger.set_targets(["train"])
    sink = LedgerSink(ledger, "train")
    sink.on_window(AttributedWindow(_report(0.0, "pp..", {"pickle": 0.02, "other": 0.02})))
    before = ledger.publish()
    bad = AttributedWindow(_report(1.0, "pp..", {"pickle": -1.0}))
    with pytest.raises(WindowRejected):
        sink.on_window(bad)
    after = ledger.publish()
    assert after.cpu_s == before.cpu_s and after.windows == before.windows
    assert before.cpu_s[("train", "pickle", "unknown")] == pytest.approx(0.02)
