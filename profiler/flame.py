"""Flame graphs in serwatt's pages: the vendored renderer, the codepath colours, a frame's
label, and the trees it draws. Both `serwatt profile --html` (profiler/profile/
flamegraph.py: one run's stacks) and the A/B page (profiler/report/render_html.py: the
differential flame graph of two sides) use it, so it sits below both drivers.

The renderer is d3-flame-graph with d3 (npm packages, vendored unmodified under
profiler/vendor/flamegraph/, see SOURCES.md there), inlined into the page. A frame is a
function at a line, so each serialization call site is a frame of its own.

Frame names and file names are the target's text: they go into a page only as JSON
inside `<script type="application/json">` with `<`, `>` and `&` escaped (script_json),
and the renderer writes them with textContent, so none of them is markup. A page that
inlines the renderer sets CSP, which allows no network at all; it allows inline scripts
(the inlined renderer) and eval, which the bundled d3 needs to render."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from typing import Any, Protocol

from serwatt.profiler.sampling.stacks import FrameKey, StackKey

VENDOR = ("vendor", "flamegraph")
MIXED = "(mixed)"

# one colour per codepath (Tableau 10, colour-blind-safer order), `other` grey
COLOURS = {
    "pickle": "#4e79a7",
    "torch": "#f28e2b",
    "protobuf": "#e15759",
    "json": "#76b7b2",
    "msgpack": "#59a14f",
    "yaml": "#edc948",
    "safetensors": "#b07aa1",
    "numpy": "#ff9da7",
    "many": "#9c755f",
    "other": "#bab0ac",
    MIXED: "#e8e4e0",
}

CSP = "default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'"


class _HasCpu(Protocol):
    cpu_s: float


def vendor_text(name: str) -> str:
    return (
        resources.files("serwatt.profiler")
        .joinpath("/".join((*VENDOR, name)))
        .read_text(encoding="utf-8")
    )


def renderer_scripts() -> str:
    """d3 and d3-flame-graph, inlined, and the renderer's stylesheet."""
    return (
        f"<style>{vendor_text('d3-flamegraph.css')}</style>"
        f"<script>{vendor_text('d3.min.js')}</script>"
        f"<script>{vendor_text('d3-flamegraph.umd.min.js')}</script>"
    )


def script_json(data: Any) -> str:
    """JSON for a `<script type="application/json">`: no `<`, `>` or `&` in it, so no
    text in the data can close the element."""
    text = json.dumps(data, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def frame_label(frame: FrameKey) -> str:
    name, filename, line = frame
    if not filename:
        return name
    short = "/".join(filename.split("/")[-2:])
    return f"{name} ({short}:{line})"


def build_tree(stacks: Iterable[tuple[StackKey, _HasCpu]]) -> dict[str, Any]:
    """The d3-flame-graph tree (name, value, children) of the stacks' CPU, root first;
    each node with the codepath of all of its CPU (MIXED when several)."""
    root: dict[str, Any] = {"name": "all", "value": 0.0, "children": {}, "cps": {}}
    for (frames, codepath, _direction), fig in stacks:
        if fig.cpu_s <= 0:
            continue
        node = root
        node["value"] += fig.cpu_s
        node["cps"][codepath] = node["cps"].get(codepath, 0.0) + fig.cpu_s
        for frame in reversed(frames):  # stored leaf first
            label = frame_label(frame)
            child = node["children"].get(label)
            if child is None:
                child = node["children"][label] = {
                    "name": label, "value": 0.0, "children": {}, "cps": {},
                    "file": frame[1], "line": frame[2],
                }  # fmt: skip
            child["value"] += fig.cpu_s
            child["cps"][codepath] = child["cps"].get(codepath, 0.0) + fig.cpu_s
            node = child
    return _finish(root)


def _finish(node: dict[str, Any]) -> dict[str, Any]:
    cps = node.pop("cps")
    node["codepath"] = next(iter(cps)) if len(cps) == 1 else MIXED
    node["value"] = round(node["value"], 6)
    node["children"] = [_finish(c) for c in node["children"].values()]
    return node


def diff_tree(stacks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The differential tree of the report's `stacks` section (profiler/report/
    stack_diff.py: each {frames: labels root first, codepath, baseline, candidate} in
    CPU-s per run): a node's width (`value`) is baseline + candidate, its `delta`
    candidate - baseline, as d3-flame-graph's differentialColorMapper reads them: red
    where the candidate takes more, blue where it takes less, grey unchanged, and its
    own colour where the candidate alone has the frame (delta == value)."""
    root: dict[str, Any] = {"name": "all", "b": 0.0, "c": 0.0, "children": {}, "cps": {}}
    for s in stacks:
        b, c, cp = float(s["baseline"]), float(s["candidate"]), str(s["codepath"])
        node = root
        for label in (None, *s["frames"]):
            if label is not None:
                child = node["children"].get(label)
                if child is None:
                    child = node["children"][label] = {
                        "name": str(label), "b": 0.0, "c": 0.0, "children": {}, "cps": {}
                    }  # fmt: skip
                node = child
            node["b"] += b
            node["c"] += c
            node["cps"][cp] = None
    return _finish_diff(root)


def _finish_diff(node: dict[str, Any]) -> dict[str, Any]:
    cps = node.pop("cps")
    node["codepath"] = next(iter(cps)) if len(cps) == 1 else MIXED
    b, c = round(node.pop("b"), 6), round(node.pop("c"), 6)
    node.update(baseline=b, candidate=c, value=round(b + c, 6), delta=round(c - b, 6))
    if b == 0:  # exactly as value, so the renderer shows it as only the candidate's
        node["delta"] = node["value"]
    node["children"] = [_finish_diff(ch) for ch in node["children"].values()]
    return node
