"""serwatt's one import name (issue 48): nothing imports or runs `profiler` or `collectors`
as top-level modules. In a checkout they still resolve (the folders sit on sys.path beside
serwatt/), so a stray `from profiler...` would pass every other test here and fail only in
an installed wheel, where those names do not exist."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OLD = ("profiler", "collectors")


def old_names(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, (ast.List, ast.Tuple)):
            # [python, "-m", "profiler", ...]: `python -m` of an old name
            consts = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            names = [
                b
                for a, b in zip(consts, consts[1:], strict=False)
                if a == "-m" and isinstance(b, str)
            ]
        found += [(node.lineno, n) for n in names if n.split(".")[0] in OLD]  # type: ignore[attr-defined]
    return found


def test_nothing_imports_the_old_top_level_names() -> None:
    # serwatt/'s own files; the folders it links to are read where they are
    sources = sorted((REPO / "serwatt").glob("*.py"))
    for top in ("profiler", "collectors", "tests", "bench"):
        sources += [f for f in sorted((REPO / top).rglob("*.py")) if "fixtures" not in f.parts]
    assert len(sources) > 100
    stray = [
        f"{f.relative_to(REPO)}:{line}: {name}"
        for f in sources
        for line, name in old_names(ast.parse(f.read_text(encoding="utf-8")))
    ]
    assert not stray, "use serwatt.profiler / serwatt.collectors:\n" + "\n".join(stray)


def test_the_check_sees_each_form() -> None:
    code = (
        "import profiler.many\nfrom collectors import rapl\nfrom serwatt.profiler import x\n"
        "argv = [python, '-m', 'profiler', 'profile']\nok = [python, '-m', 'serwatt']\n"
    )
    assert [n for _, n in old_names(ast.parse(code))] == ["profiler.many", "collectors", "profiler"]
