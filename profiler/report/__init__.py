"""The A/B report: compare baseline runs with candidate runs and say what the change is worth.

Statistics, comparability, cluster projection, receipts and rendering are pure functions
of the input dataclasses in `profiler.report.inputs`; this package imports only those,
`profiler.codepaths` (the closed codepath set), `profiler.config` (the line-tracking YAML
checker for the cluster file), numpy, scipy, yaml and blake3 — never records or hardware.
"""

from profiler.report.build import REPORT_SCHEMA, build_report
from profiler.report.comparability import Mismatch, ReportRefused
from profiler.report.inputs import (
    CodepathFigures,
    EpisodeInput,
    InputError,
    RunInput,
    WindowInput,
)
from profiler.report.projection import ClusterConfig, default_cluster, load_cluster
from profiler.report.receipt import receipt, verify_receipt
from profiler.report.render_html import render_html
from profiler.report.render_text import render_text

__all__ = [
    "REPORT_SCHEMA",
    "ClusterConfig",
    "CodepathFigures",
    "EpisodeInput",
    "InputError",
    "Mismatch",
    "ReportRefused",
    "RunInput",
    "WindowInput",
    "build_report",
    "default_cluster",
    "load_cluster",
    "receipt",
    "render_html",
    "render_text",
    "verify_receipt",
]
