"""docs/architecture.md's claims that can be checked, checked (issue 43, ask 5): what
the classify package imports (the import contract in pyproject.toml, and here the whole
set), and that the daemon reads time only through its clock (a scan of its sources)."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "architecture.md").read_text()
WORDS = " ".join(DOC.split())  # the doc with its line breaks as spaces

# docs/architecture.md, profiler/classify: "Of serwatt, the package imports only ..."
CLASSIFY_IMPORTS = {
    "collectors.samples",
    "collectors.procstat",
    "collectors.mounts",
    "profiler.safeio",
    "profiler.owned_io",
    "profiler.yamlcheck",
}
CLASSIFY_EXTERNAL = {"yaml", "blake3"}
# the service modules that read the time module themselves: the clock, and the HTTP
# server's and the Pyroscope push's connection deadlines (real time by nature: sockets
# time out on the kernel's)
TIME_READERS = {"clock.py", "exporter.py", "pyroscope_push.py"}


def _imports_of(package: str) -> set[str]:
    """What serwatt's `package` (named as the doc names it, without `serwatt.`) imports
    from outside itself, serwatt's own modules named the same way."""
    graph = grimp.build_graph("serwatt", include_external_packages=True)
    package = f"serwatt.{package}"
    out: set[str] = set()
    for m in graph.find_children(package) | {package}:
        for sub in {m} | graph.find_descendants(m):
            out |= graph.find_modules_directly_imported_by(sub)
    return {i.removeprefix("serwatt.") for i in out if not i.startswith(package)}


def test_classify_imports_what_the_doc_says() -> None:
    imported = _imports_of("profiler.classify")
    ours = {i for i in imported if i.split(".")[0] in ("profiler", "collectors")}
    assert ours == CLASSIFY_IMPORTS
    external = {i.split(".")[0] for i in imported} - {"profiler", "collectors"}
    stdlib = {e for e in external if e in __import__("sys").stdlib_module_names}
    assert external - stdlib == CLASSIFY_EXTERNAL
    # the doc names the same
    claim = DOC[DOC.index("**`profiler/classify/`**") :]
    claim = claim[: claim.index("Details: [classification.md]")]
    for name in sorted(CLASSIFY_IMPORTS | CLASSIFY_EXTERNAL):
        assert f"`{name}`" in claim, name


def _time_calls(path: Path) -> list[str]:
    """Calls of the time module's functions (time.time(), time.monotonic(), ...) and
    `from time import`s in one source file."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "time":
            found.append(f"{path.name}:{node.lineno}: from time import")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "time"
        ):
            found.append(f"{path.name}:{node.lineno}: time.{node.func.attr}()")
    return found


def test_the_daemon_reads_time_only_through_its_clock() -> None:
    service = REPO / "profiler" / "service"
    readers = {p.name for p in service.glob("*.py") if _time_calls(p)}
    assert readers == TIME_READERS, [c for p in service.glob("*.py") for c in _time_calls(p)]
    assert "`clock.py` is the one place the daemon reads time and waits" in WORDS
