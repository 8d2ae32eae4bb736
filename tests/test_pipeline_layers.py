"""Both drivers run the one window pipeline (profiler/attribution/pipeline.py), and
neither imports the other: the second half is an import-linter contract in pyproject.toml
(`make lint`); the first is checked here on the same import graph (grimp, import-linter's)."""

from __future__ import annotations

from pathlib import Path

import grimp

PIPELINE = "profiler.attribution.pipeline"
DRIVERS = ("profiler.profile.session", "profiler.service.daemon")


def test_both_drivers_deliver_windows_through_the_pipeline() -> None:
    graph = grimp.build_graph("profiler", "collectors")
    for driver in DRIVERS:
        assert graph.direct_import_exists(importer=driver, imported=PIPELINE), driver
    # the pipeline alone follows episodes and attributes a window against its own span
    for driver in DRIVERS:
        source = Path(driver.replace(".", "/") + ".py").read_text()
        assert "EpisodeTracker(" not in source and "episode_gpu_reading" not in source, driver


def test_the_drivers_independence_is_a_contract() -> None:
    contract = 'type = "independence"\nmodules = ["profiler.profile", "profiler.service"]\n'
    assert contract in Path("pyproject.toml").read_text()
