"""yaml, numpy, safetensors and `.many` classification of live processes.

tests/test_classify_fixtures.py covers these codepaths on recorded py-spy output; here each
workload (tests/workloads/serializers.py) runs as a real process and one real window of
the sampler (`sample_window`: py-spy record on-CPU and --idle runs, per-thread CPU) is
classified with the built-in rules through /proc/<pid>/root, as the daemon does. yaml runs
on CPython 3.10 (bare frame names) and 3.12 (qualnames) from the target venvs; numpy,
safetensors and `.many` on the project venv (3.11), which has them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from profiler.classify.classifier import Classifier
from profiler.sampling.collect import sample_window
from tests.workloads import harness, targets
from tests.workloads.serializers import EXPECT

# The loop's own lines (and, for numpy, the BytesIO seek) may take a few samples: the
# serializer must take most of the samples and of the CPU, and nothing may land in
# another serializer's codepath.
MIN_SHARE = 0.8


def _window(python: Path | str, kind: str) -> dict[str, tuple[int, float]]:
    with harness.running(python, kind) as pid:
        report = sample_window(pid, duration_s=1.0, rate_hz=50, classifier=Classifier.default())
    return {cp: (w.samples, w.cpu_s) for cp, w in report.codepaths.items()}


def _check(got: dict[str, tuple[int, float]], expect: str) -> None:
    samples = sum(n for n, _ in got.values())
    cpu = sum(c for _, c in got.values())
    assert samples >= 25, got
    assert {cp for cp, (n, _) in got.items() if n} <= {expect, "other"}, got
    assert got[expect][0] >= MIN_SHARE * samples, got
    assert got[expect][1] >= MIN_SHARE * cpu, got


@pytest.mark.parametrize("venv", ["py310", "py312"])
@pytest.mark.parametrize("kind", ["yaml_dump", "yaml_load"])
def test_yaml_on_both_name_styles(venv: str, kind: str) -> None:
    try:
        python = targets.ensure_target(venv)
    except targets.TargetUnavailable as exc:
        pytest.fail(f"target interpreter {venv} unavailable: {exc}")
    _check(_window(python, kind), EXPECT[kind])


@pytest.mark.parametrize(
    "kind",
    ["numpy_save", "numpy_load", "safetensors_save", "safetensors_load", "many_save", "many_load"],
)
def test_project_venv_serializers(kind: str) -> None:
    assert EXPECT[kind] in ("numpy", "safetensors", "many")
    _check(_window(sys.executable, kind), EXPECT[kind])
