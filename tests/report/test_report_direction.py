"""The report's encode / decode breakdown: from records and from synthetic runs, in the
JSON, the text and the HTML, and a side recorded without directions said so."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from serwatt.collectors.samples import SamplerErrors
from serwatt.profiler.classify.codepaths import CODEPATHS
from serwatt.profiler.records.store import Recorder
from serwatt.profiler.report import build_report, render_text
from serwatt.profiler.report.from_records import load_runs
from serwatt.profiler.report.inputs import DirectionFigures, RunInput
from serwatt.profiler.report.render_html import render_html
from serwatt.profiler.sampling.window import CodepathWindow, DirectionWindow, WindowReport
from tests.report_synth import make_run


def _with(run: RunInput, encode_s: float, decode_s: float) -> RunInput:
    return dataclasses.replace(
        run,
        directions={
            "torch": {
                "encode": DirectionFigures(int(encode_s * 50), encode_s),
                "decode": DirectionFigures(int(decode_s * 50), decode_s),
                "unknown": DirectionFigures(0, 0.0),
            }
        },
    )


def test_each_side_sums_its_runs_and_gives_the_share_of_the_codepath() -> None:
    base = [_with(make_run("b1", seed=1), 3.0, 1.0), _with(make_run("b2", seed=2), 1.0, 1.0)]
    cand = [_with(make_run("c1", seed=3), 0.5, 1.5), _with(make_run("c2", seed=4), 0.5, 1.5)]
    ways = build_report(base, cand)["direction"]
    assert ways["sides"] == {"baseline": "measured", "candidate": "measured"}
    assert set(ways["codepaths"]) == {"torch"}  # no other codepath had CPU by direction
    torch = ways["codepaths"]["torch"]
    assert torch["encode"]["baseline"] == {"samples": 200, "cpu_s": 4.0, "cpu_share": 0.666667}
    assert torch["decode"]["candidate"] == {"samples": 150, "cpu_s": 3.0, "cpu_share": 0.75}
    assert torch["unknown"]["baseline"]["cpu_s"] == 0.0


def test_a_side_recorded_without_directions_is_unavailable_not_unknown() -> None:
    base = [_with(make_run("b1", seed=1), 3.0, 1.0)]
    cand = [make_run("c1", seed=3)]  # directions None: an older record
    report = build_report(base, cand)
    ways = report["direction"]
    assert ways["sides"]["candidate"].startswith("unavailable: c1 recorded no directions")
    assert ways["codepaths"]["torch"]["encode"]["candidate"] is None
    text = render_text(report, full=True)
    assert "ENCODE / DECODE" in text
    row = next(ln for ln in text.splitlines() if ln.strip().startswith("torch") and "encode" in ln)
    assert row.split()[-4:] == ["3", "75%", "-", "-"], row
    assert "candidate: unavailable: c1 recorded no directions" in " ".join(text.split())
    html = render_html(report)
    assert "<h2>Encode and decode per codepath</h2>" in html
    assert '<td class="num">75%</td><td class="num">-</td>' in html


def _window(t0: float, encode: tuple[int, float], decode: tuple[int, float]) -> WindowReport:
    cps = {cp: CodepathWindow() for cp in CODEPATHS}
    (ne, ce), (nd, cd) = encode, decode
    cps["pickle"] = CodepathWindow(
        samples=ne + nd,
        cpu_s=ce + cd,
        wall_s=ce + cd,
        direction={"encode": DirectionWindow(ne, ce), "decode": DirectionWindow(nd, cd)},
    )
    cps["other"] = CodepathWindow(samples=50, cpu_s=1.0, wall_s=1.0)
    return WindowReport(
        pid=9, started_at=t0, ended_at=t0 + 10.0, rate_hz=50.0, cpu_s=ce + cd + 1.0,
        codepaths=cps, python="3.11.7",
        errors=SamplerErrors(pyspy_samples=100, pyspy_errors=0, partial_stacks=0, behind_s=0.0),
    )  # fmt: skip


@pytest.mark.parametrize("encode_share", [0.25, 0.8])
def test_a_recorded_split_reaches_the_report(tmp_path: Path, encode_share: float) -> None:
    rec = Recorder(tmp_path / "runs.sqlite")
    for run_id in ("a", "b"):
        rec.start_run(run_id, "t", host={"hostname": "n"}, config={"rate_hz": 50}, sources={})
        for k in range(8):
            e = round(2.0 * encode_share, 6)
            rec.append_window(run_id, _window(1e9 + 10 * k, (int(e * 50), e), (10, 2.0 - e)))
    base, cand = load_runs(rec, ["a"]), load_runs(rec, ["b"])
    pickle = build_report(base, cand)["direction"]["codepaths"]["pickle"]
    for side in ("baseline", "candidate"):
        assert pickle["encode"][side]["cpu_share"] == pytest.approx(encode_share, abs=1e-6)
        assert pickle["encode"][side]["cpu_s"] == pytest.approx(16 * encode_share, abs=1e-5)
        assert pickle["decode"][side]["samples"] == 80
