"""The A/B report: compare baseline runs with candidate runs and say what the change is worth.

The report's whole input is the frozen dataclasses of inputs.py. Two adapters make them:
from_records.py from run records (the package's one import of profiler.records) and
from_prometheus.py from PromQL range queries (prom_client.py over deadline_http.py, the
answers parsed by prom_matrix.py, the arguments checked by prom_args.py). From the inputs on,
statistics (stats.py), power warnings (power.py), comparability (comparability.py),
checkpoints and restores (checkpoints.py), the encode / decode breakdown (direction.py),
the cluster file (cluster.py) and projection (projection.py, its checkpoint model
checkpoint_model.py), the document (build.py),
receipts (receipt.py) and rendering (render_text.py, render_html.py) are pure functions.
Beyond those two adapters the package imports only profiler.classify.codepaths (the
closed codepath set), profiler.yamlcheck (the cluster file's checker),
profiler.terminal_escape (escaping text for the terminal), numpy, scipy, yaml and blake3;
never the daemon, the profile session or hardware.
"""

from serwatt.profiler.report.build import REPORT_SCHEMA, build_report
from serwatt.profiler.report.cluster import (
    ClusterConfig,
    default_cluster,
    load_cluster,
    projection_cluster,
)
from serwatt.profiler.report.comparability import Mismatch, ReportRefused
from serwatt.profiler.report.inputs import (
    CodepathFigures,
    EpisodeInput,
    InputError,
    RunInput,
    WindowInput,
)
from serwatt.profiler.report.receipt import receipt, verify_receipt
from serwatt.profiler.report.render_html import render_html
from serwatt.profiler.report.render_text import render_text

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
    "projection_cluster",
    "receipt",
    "render_html",
    "render_text",
    "verify_receipt",
]
