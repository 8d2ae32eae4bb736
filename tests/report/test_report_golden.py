"""The report's text (the first screen and --full) and its JSON, compared whole with golden
files built from a fixed synthetic record. A change to what the report says shows here as
a diff; `pytest --update-golden tests/report/test_report_golden.py` rewrites the files
after a reviewed change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serwatt.profiler.report import build_report, render_text
from serwatt.profiler.report.render_text import WIDTH
from tests.report_synth import make_run

GOLDEN = Path(__file__).parent / "golden"
SCREEN = 40  # issue 46: the first screen fits a terminal


def _report() -> dict:
    # 6 runs a side (the fewest with an interval of each side's median); the candidate's
    # checkpoints stall a quarter as long and cost a quarter of the CPU
    base = [make_run(f"torch-{i}", seed=i, stall_s=0.8) for i in range(6)]
    cand = [
        make_run(f"many-{i}", seed=10 + i, codepath="many", ckpt_cpu_s=0.25, stall_s=0.2)
        for i in range(6)
    ]
    return build_report(base, cand)


def _check(request: pytest.FixtureRequest, name: str, text: str) -> None:
    path = GOLDEN / name
    if request.config.getoption("--update-golden"):
        path.write_text(text)
        return
    assert path.exists(), f"{path} missing: run pytest --update-golden {__file__}"
    assert text == path.read_text(), f"{name} differs from its golden file"


@pytest.mark.parametrize("full", [False, True], ids=["default", "full"])
def test_the_report_text_matches_its_golden_file(
    request: pytest.FixtureRequest, full: bool
) -> None:
    text = render_text(_report(), full=full)
    _check(request, f"report_{'full' if full else 'default'}.txt", text)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    if not full:
        assert len(lines) <= SCREEN, len(lines)
        assert "CHECKPOINT COST" not in text and "method" not in text


def test_the_report_json_matches_its_golden_file(request: pytest.FixtureRequest) -> None:
    _check(request, "report.json", json.dumps(_report(), indent=2, allow_nan=False) + "\n")
