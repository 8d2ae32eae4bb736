"""bench/ scripts as modules, for the tests that run their parts (they are scripts, not a
package)."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"


@functools.cache
def load_bench(name: str) -> ModuleType:
    """bench/<name>.py, loaded once, as module `bench_<name>`."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # their dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod
