"""The HTML report in a real browser: Debian's chromium, headless, loads the file; the
dumped DOM has the expected bars and points, nothing that reaches the network, and
hostile strings from the inputs stay text. A screenshot is kept in .artifacts/.

Chromium is a system dependency (Debian package `chromium`): in CI (CI=true) a missing
browser fails the test; elsewhere it skips with the reason.
"""

from __future__ import annotations

import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from serwatt.profiler.report import build_report, default_cluster, render_html
from serwatt.profiler.report.render_text import fmt
from tests import headless_chromium
from tests.report_synth import HOST, make_run

ARTIFACTS = Path(__file__).resolve().parents[2] / ".artifacts"
HOSTILE_RUN = "<script>alert(1)</script>"
HOSTILE_HOST = '"><img src="http://evil.example/x.png">'


class _Dom(HTMLParser):
    """Elements as (tag, attrs, enclosing chart name) plus all text."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None], str | None]] = []
        self.chart: str | None = None
        self.charts: list[tuple[str, str | None]] = []
        self.text: list[str] = []
        self.style: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "svg" and a.get("data-chart"):
            self.chart = f"{a['data-chart']}:{a.get('data-metric') or ''}"
            self.charts.append((str(a["data-chart"]), a.get("data-metric")))
        self._in_style = tag == "style"
        self.elements.append((tag, a, self.chart))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs), self.chart))

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self.chart = None
        if tag == "style":
            self._in_style = False

    def handle_data(self, data: str) -> None:
        (self.style if self._in_style else self.text).append(data)

    def count(self, tag: str, cls: str, chart: str, **attrs: str) -> int:
        return sum(
            1
            for t, a, c in self.elements
            if t == tag
            and cls in (a.get("class") or "").split()
            and c == chart
            and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())
        )


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    hostile = dict(HOST, hostname=HOSTILE_HOST)
    # four runs a side: the run is the test's unit, and 4 + 4 can give the stall an interval
    base = [make_run(HOSTILE_RUN, seed=1, host=hostile)]
    base += [make_run(f"torch-{k}", seed=k) for k in (2, 5, 6)]
    cand = [
        make_run("many-1", seed=3, codepath="many", ckpt_cpu_s=0.25, stall_s=0.2, windows=20),
        *(
            make_run(f"many-{k}", seed=k + 5, codepath="many", ckpt_cpu_s=0.25, stall_s=0.2)
            for k in (2, 3, 4)
        ),
    ]
    return build_report(base, cand, cluster=default_cluster())


def test_the_browser_renders_every_chart_with_the_expected_marks(
    report: dict[str, Any], tmp_path: Path
) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_html(report), encoding="utf-8")
    dom_text = headless_chromium.run(tmp_path, "--dump-dom", page.as_uri())
    dom = _Dom()
    dom.feed(dom_text)

    bar_charts = [str(m) for c, m in dom.charts if c == "codepath-bars"]
    assert bar_charts == ["cpu_s", "energy_j"]  # no GPU data: no GPU-wait chart
    for metric in bar_charts:
        chart = f"codepath-bars:{metric}"
        bars = {
            (a["data-codepath"], a["data-side"]): float(a["width"] or "nan")
            for t, a, c in dom.elements
            if t == "rect" and c == chart and "bar" in (a.get("class") or "").split()
        }
        # The inputs' checkpoint codepaths, in the table's order: torch on the baseline
        # runs, `.many` on the candidate runs (`other` is no serialization: no bar).
        assert sorted(bars) == sorted(
            (cp, side) for cp in ("torch", "many") for side in ("baseline", "candidate")
        ), bars
        assert dom.count("rect", "bar", chart) == 4
        order = [a["data-codepath"] for t, a, c in dom.elements if c == chart and t == "rect"]
        assert order[::2] == ["torch", "many"], order
        # Each bar's length is its side's figure in the report, on one scale: torch is only
        # on the baseline, many only on the candidate.
        assert bars[("torch", "candidate")] == bars[("many", "baseline")] == 0.0, bars
        figures = report["codepaths"]
        want = figures["many"][metric]["candidate"] / figures["torch"][metric]["baseline"]
        got = bars[("many", "candidate")] / bars[("torch", "baseline")]
        assert abs(got - want) < 0.01 / bars[("many", "candidate")], (got, want)
        # a whisker per side and codepath that has an interval in the JSON (none where
        # the counts give no interval of proven coverage: docs/report.md)
        with_ci = [
            (cp, side)
            for cp in ("torch", "many")
            for side in ("baseline", "candidate")
            if figures[cp][metric][f"{side}_ci95"] is not None
        ]
        assert dom.count("line", "whisker", chart) == len(with_ci)

    ck = report["checkpoint"]
    for side in ("baseline", "candidate"):
        n = ck[side]["episodes"]
        assert n > 10
        assert dom.count("circle", "point", "episode-durations:", data_side=side) == n
        assert dom.count("line", "median", "episode-durations:", data_side=side) == 1
        windows = report[side]["windows"]
        assert dom.count("circle", "point", "window-timeline:", data_side=side) == windows
        assert dom.count("polyline", "series", "window-timeline:", data_side=side) == 4  # per run
    assert report["candidate"]["windows"] == 92  # 20 + 3 x 24: the counts above are not equal

    # the projection: the tornado has a bar per ranged input and end, each as long as its
    # swing from the central saved figure on one scale, in the report's order (largest
    # swing on top)
    proj = report["projection"]
    sens = proj["sensitivity"]
    assert {x["input"] for x in sens} >= {"mtbf_h", "restart_s", "pue", "storage_write_gb_s"}
    assert dom.count("rect", "bar", "tornado:") == 2 * len(sens)
    swing = {
        (a["data-input"], a["data-end"]): (float(a["y"] or "nan"), float(a["width"] or "nan"))
        for t, a, c in dom.elements
        if t == "rect" and c == "tornado:"
    }
    widest = max(w for _y, w in swing.values())
    biggest = max(
        abs(x[f"saved_at_{end}"] / x["saved_at_central"] - 1)
        for x in sens
        for end in ("low", "high")
    )
    assert biggest > 0, sens
    for x in sens:
        for end in ("low", "high"):
            rel = abs(x[f"saved_at_{end}"] / x["saved_at_central"] - 1)
            assert abs(swing[(x["input"], end)][1] / widest - rel / biggest) < 0.01, (x, end)
    tops = [swing[(x["input"], "low")][0] for x in sens]
    assert tops == sorted(tops), "tornado rows out of the report's order"

    # numbers are text, with their sources
    text = " ".join(dom.text)
    flat = re.sub(r"\s+", " ", text)
    saved = proj["saved"]
    for key in ("gpu_h", "it_mwh", "facility_mwh", "water_l"):
        lo, hi = saved[key]["ci95"]
        assert f"{fmt(saved[key]['value'])} [{fmt(lo)}, {fmt(hi)}]" in flat, key
    for side in ("baseline", "candidate"):
        p_side = proj[side]
        lost = " / ".join(fmt(p_side["lost_parts"][k]) for k in ("stall", "rework", "restart"))
        assert lost in flat, (side, lost)
        assert fmt(p_side["delta_node_s"]) in flat and fmt(p_side["delta_s"]) in flat, side
        assert f"bandwidth bound {fmt(p_side['scaling']['bandwidth_bound_s'])} s" in flat
    assert f"δ set by {proj['baseline']['bound']} {proj['candidate']['bound']}" in flat
    assert re.search(r"~ \[[^]]*\] no significant change", re.sub(r"\s+", " ", text))
    assert report["receipt"] in text
    assert "measured: py-spy samples weighted by procfs thread CPU" in text
    assert "assumed default: Llama 3 405B" in text


def test_nothing_in_the_page_reaches_the_network_and_hostile_strings_stay_text(
    report: dict[str, Any], tmp_path: Path
) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_html(report), encoding="utf-8")
    dom = _Dom()
    dom.feed(headless_chromium.run(tmp_path, "--dump-dom", page.as_uri()))
    tags = {t for t, _a, _c in dom.elements}
    assert not tags & {"script", "link", "img", "iframe", "object", "embed", "base", "image"}
    for tag, attrs, _c in dom.elements:
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            if name in ("src", "href", "xlink:href", "action", "srcset", "style"):
                assert not re.search(r"(https?:)?//|url\(", value or ""), (tag, name, value)
    css = "".join(dom.style)
    assert "@import" not in css and "url(" not in css and "@font-face" not in css
    text = " ".join(dom.text)
    assert HOSTILE_RUN in text and HOSTILE_HOST in text  # shown, as text


def test_screenshot_is_saved_as_an_artifact(report: dict[str, Any], tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_html(report), encoding="utf-8")
    shot = tmp_path / "report.png"
    headless_chromium.run(
        tmp_path, "--hide-scrollbars", f"--screenshot={shot}", "--window-size=1200,3200",
        page.as_uri(),
    )  # fmt: skip
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000  # a drawn page, not blank
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copyfile(shot, ARTIFACTS / "report.png")
