"""Issue 43, item 2: a process tree's profile keeps one set of joules. Its processes'
windows overlap in time, each attributed against its own span, so together they can
claim more than the node's dynamic joules; the fit to the node's joules is applied
before any sink reads a window, so the run record keeps the figures the profile's JSON
shows. Before, the record kept every window's unfitted joules while the document
scaled its sums once at the end."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from serwatt.profiler.attribution.pipeline import WindowPipeline
from serwatt.profiler.classify.classifier import Classifier
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.profile.energy_sink import EnergySink
from serwatt.profiler.profile.record_sink import RecordSink
from serwatt.profiler.profile.session import SessionInfo
from serwatt.profiler.records.reader import WindowRecord
from serwatt.profiler.records.store import Recorder
from serwatt.profiler.sampling.collect import finish_window
from tests.replay import raw, world


def test_a_trees_record_keeps_the_joules_its_document_shows(tmp_path: Path) -> None:
    recs = raw.load()
    parent = recs[0]["pid"]
    tree = [parent + k for k in range(8)]
    tr = world.tracker(tmp_path / "node", parent)
    pipeline = WindowPipeline(tr)
    energy = EnergySink()
    db = tmp_path / "runs.sqlite"
    record = RecordSink(db, tracker=tr, run_id="tree", target="trainer", clock=lambda: t)
    info = SessionInfo(parent, "workload.py", world.T0, raw.PLAN.rate_hz, 2.0, tmp_path)
    for sink in (energy, record):
        sink.on_start(info)
    classifier = Classifier.default()
    t = world.T0
    # the parent and its children replay the same recorded windows over the same spans:
    # more CPU between them than the node's /proc/stat sees busy (one CPU)
    for rec in recs:
        for pid in tree:
            got = raw.raw_window(rec, pid=pid, t0=t, procfs=tmp_path / "no-proc", exited=False)
            # as the profile session hands them: held until no process's next window
            # can overlap them, then fitted together
            for window in pipeline.attribute_held(finish_window(got, classifier), tree):
                assert pipeline.deliver(window, (energy, record)).failures == []
        t += raw.duration_s(rec)
    for window in pipeline.flush():
        assert pipeline.deliver(window, (energy, record)).failures == []
    pipeline.finish((energy, record))
    summary = energy.finish()
    record.finish()

    node = summary.energy
    assert node["source"] == "rapl" and node["package_j"] > 0
    reader = Recorder(db, readonly=True)
    try:
        run = reader.run("tree")
    finally:
        reader.close()
    recorded = {cp: run.codepaths[cp].energy_j or 0.0 for cp in CODEPATHS}
    shown = {cp: summary.codepaths[cp].energy_j or 0.0 for cp in CODEPATHS}
    for cp in CODEPATHS:
        assert recorded[cp] == pytest.approx(shown[cp], abs=1e-6), cp
    # each round's windows together hold no more than the node's dynamic joules over
    # their joint span, and the overlap was there to fit: some rounds reach it
    rounds: dict[float, list[WindowRecord]] = {}
    for w in run.windows:
        rounds.setdefault(w.started_at, []).append(w)
    assert len(rounds) == len(recs) and all(len(ws) == len(tree) for ws in rounds.values())
    at_bound = 0
    for ws in rounds.values():
        span = tr.window(min(w.started_at for w in ws), max(w.ended_at for w in ws))
        assert span.dynamic_j is not None and span.dynamic_j > 0
        held = math.fsum(j for w in ws if w.energy for j in w.energy["codepaths_j"].values())
        assert held <= span.dynamic_j * (1 + 1e-9)
        at_bound += math.isclose(held, span.dynamic_j, rel_tol=1e-9)
    assert at_bound >= 1
    assert node["attributed_j"] == pytest.approx(math.fsum(shown.values()), abs=1e-5)
