"""Golden files: an output compared whole against its checked-in copy under
tests/replay/golden/, which a reviewer reads like any other file. `pytest
--update-golden` rewrites them from the run (as benchstat's and node_exporter's tests
do); the diff is then part of the change under review.

Fields that differ by host or by run, and only those, are replaced by `<volatile>`
before the comparison (VOLATILE_KEYS, VOLATILE_METRICS): the host's fingerprint, the
version, serwatt's own CPU and wall-clock self-measurements."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

import pytest

DIR = Path(__file__).with_name("golden")
MARK = "<volatile>"

# JSON keys whose values are this host's or this run's (anywhere in a document); paths
# under the run's temporary directory are replaced by TMP in any string
VOLATILE_KEYS = frozenset(
    {
        "host",  # the daemon's fingerprint of the machine it ran on
        "serwatt_version",
        "load_1min",  # the host's load average at each window's end
        "receipt",  # a hash over the records, the host's fingerprint included
    }
)
TMP = "<tmp>"
# /metrics families measured from the real process (the daemon's own CPU); the collectors'
# read times are on the daemon's clock (service/clock.py), fake here, so they stay in
VOLATILE_METRICS = ("serwatt_self_cpu_seconds_total",)


def normalize(value: Any, tmp: str) -> Any:
    if isinstance(value, dict):
        return {k: MARK if k in VOLATILE_KEYS else normalize(v, tmp) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize(v, tmp) for v in value]
    if isinstance(value, str):
        return value.replace(tmp, TMP)
    return value


def json_text(value: Any, tmp: Path) -> str:
    return json.dumps(normalize(value, str(tmp)), indent=1, sort_keys=True) + "\n"


def metrics_text(exposition: str) -> str:
    """The exposition with the volatile families' sample values and the version replaced."""
    out = []
    for line in exposition.splitlines():
        if not line.startswith("#") and line.startswith(VOLATILE_METRICS):
            line = re.sub(r" \S+$", f" {MARK}", line)
        line = re.sub(
            r'^serwatt_build_info\{version="[^"]*"\}',
            f'serwatt_build_info{{version="{MARK}"}}',
            line,
        )
        out.append(line)
    return "\n".join(out) + "\n"


# report text lines whose content is the host's or the run's: the receipt (a hash over
# the records, the host's fingerprint and paths included), the record's path, the host
VOLATILE_REPORT_LINES = ("receipt ", "input ", "host ")


def report_text(text: str) -> str:
    out = []
    for line in text.splitlines():
        if line.startswith(VOLATILE_REPORT_LINES):
            line = line.split(" ", 1)[0] + " " + MARK
        out.append(line)
    return "\n".join(out) + "\n"


def check(request: pytest.FixtureRequest, name: str, text: str) -> None:
    """`text` must equal golden/<name> whole; with --update-golden it becomes it."""
    path = DIR / name
    if request.config.getoption("--update-golden"):
        DIR.mkdir(exist_ok=True)
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"no golden file {path}: run pytest with --update-golden and review it")
    want = path.read_text()
    if text != want:
        diff = "".join(
            difflib.unified_diff(
                want.splitlines(keepends=True),
                text.splitlines(keepends=True),
                f"golden/{name}",
                "this run",
                n=2,
            )
        )
        pytest.fail(f"{name} differs from its golden file (--update-golden to accept):\n{diff}")
