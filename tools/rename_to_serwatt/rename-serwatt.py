"""The serwatt rename (issue 48 ask 5), mechanical part. Run by rename-serwatt.sh; idempotent.

Rewrites a serwatt checkout so that its import name is `serwatt` (`serwatt.profiler`,
`serwatt.collectors`) while the folders stay where they are. Every rewrite matches only the
old spelling, so a second run changes nothing.
"""

from __future__ import annotations

import io
import os
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(sys.argv[1]).resolve()
WARN: list[str] = []
CHANGED: list[str] = []

TOP = ("profiler", "collectors")
# the guard test's own examples of the old names must stay old
SKIP = {"tests/test_import_name.py"}


def subs(pkg: str) -> list[str]:
    d = ROOT / pkg
    out = []
    for p in d.iterdir():
        if p.is_dir() and (p / "__init__.py").exists():
            out.append(p.name)
        elif p.suffix == ".py" and p.stem != "__init__":
            out.append(p.stem)
    return sorted(out, key=len, reverse=True)


SUBS = {pkg: subs(pkg) for pkg in TOP}
ALT = {pkg: "|".join(map(re.escape, SUBS[pkg])) for pkg in TOP}
# a module path inside a string: `profiler.<a real submodule>`, not a file path, not already
# under serwatt., not a config key (collectors.* only where the string runs code, below)
MOD_IN_STR = {
    pkg: re.compile(rf"(?<![\w./`\-]){pkg}\.(?=(?:{ALT[pkg]})\b)(?![\w.]*/)") for pkg in TOP
}
DASH_M = re.compile(r"(-m\s+)(profiler|collectors)(?=[.\s'\"]|$)")
FROM_IN_STR = re.compile(r"(\bfrom\s+)(profiler|collectors)(?=\.\w|\s+import\b)")
IMPORT_IN_STR = re.compile(r"(\bimport\s+)(profiler|collectors)(?=\.\w|[\s;,]|$)")


def rewrite_string_text(s: str, module_context: bool) -> str:
    s = DASH_M.sub(
        lambda m: m.group(1)
        + (
            "serwatt"
            if m.group(2) == "profiler" and m.string[m.end() : m.end() + 1] != "."
            else "serwatt." + m.group(2)
        ),
        s,
    )
    code_like = "import" in s
    if code_like:
        s = FROM_IN_STR.sub(r"\1serwatt.\2", s)
        s = IMPORT_IN_STR.sub(r"\1serwatt.\2", s)
    s = MOD_IN_STR["profiler"].sub("serwatt.profiler.", s)
    if code_like or module_context:
        s = MOD_IN_STR["collectors"].sub("serwatt.collectors.", s)
    return s


def split_prefix(tok: str) -> tuple[str, str, str]:
    m = re.match(r"(?is)^([rbuf]*)('''|\"\"\"|'|\")(.*)\2$", tok)
    if not m:
        return "", "", tok
    return m.group(1), m.group(2), m.group(3)


GRIMP = re.compile(
    r"""build_graph\(\s*(["'])(?:profiler|collectors)\1(?:\s*,\s*(["'])(?:profiler|collectors)\2)?\s*\)"""
)


def rewrite_python(path: Path) -> None:
    orig = path.read_text(encoding="utf-8")
    # grimp.build_graph of the old roots: the one root package now
    src = GRIMP.sub('build_graph("serwatt")', orig)
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (tokenize.TokenError, SyntaxError) as exc:
        WARN.append(f"{path}: not tokenized ({exc}); not rewritten")
        return
    lines = src.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))

    def pos(rc: tuple[int, int]) -> int:
        return offsets[rc[0] - 1] + rc[1]

    edits: list[tuple[int, int, str]] = []
    sig = [t for t in toks if t.type not in (tokenize.NL, tokenize.COMMENT)]
    in_import = None  # "from" | "import" while inside an import statement
    for i, t in enumerate(sig):
        prev = sig[i - 1] if i else None
        if t.type == tokenize.NEWLINE or (t.type == tokenize.OP and t.string == ";"):
            in_import = None
            continue
        if t.type == tokenize.NAME and t.string in ("from", "import") and (
            prev is None or prev.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
            or (prev.type == tokenize.OP and prev.string in (";", ":"))
        ):
            in_import = t.string
            continue
        if (
            t.type == tokenize.NAME
            and t.string in TOP
            and in_import is not None
            and prev is not None
            and (prev.string in ("from", "import", ",") or (prev.string == "(" and in_import == "import"))
        ):
            if in_import == "from" and prev.string != "from":
                continue  # `from x import profiler`: a name, not a module path
            edits.append((pos(t.start), pos(t.end), "serwatt." + t.string))
            if in_import == "import":
                # `import profiler.x` binds `profiler`; later uses must be checked by hand
                nxt = sig[i + 1 : i + 12]
                if not any(n.string == "as" for n in nxt[: next((k for k, n in enumerate(nxt) if n.string in (",", ";") or n.type == tokenize.NEWLINE), len(nxt))]):
                    WARN.append(f"{path}:{t.start[0]}: `import {t.string}...` without `as`: check uses of the name `{t.string}`")
            continue
        if t.type != tokenize.STRING:
            continue
        is_doc = (prev is None or prev.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)) and (
            i + 1 < len(sig) and sig[i + 1].type == tokenize.NEWLINE
        )
        if is_doc:
            new_doc = t.string
            for rx, rep in TEXT_RULES[:4]:
                new_doc = rx.sub(rep, new_doc)
            if new_doc != t.string:
                edits.append((pos(t.start), pos(t.end), new_doc))
            continue
        pre, q, body = split_prefix(t.string)
        if not q:
            continue
        module_context = (
            i >= 2 and sig[i - 1].string == "," and split_prefix(sig[i - 2].string)[2] == "-m"
        )
        if module_context and body == "profiler":
            new_body = "serwatt"
        elif body in ("profiler", "collectors") and prev is not None and prev.string == "(" and i >= 2 and sig[i - 2].string == "files":
            new_body = "serwatt." + body  # importlib.resources.files("profiler")
        elif module_context and re.fullmatch(rf"collectors\.(?:{ALT['collectors']})(\.\w+)*", body):
            new_body = "serwatt." + body
        else:
            new_body = rewrite_string_text(body, module_context)
        if new_body != body:
            edits.append((pos(t.start), pos(t.end), pre + q + new_body + q))
    if not edits:
        if src != orig:
            path.write_text(src, encoding="utf-8")
            CHANGED.append(str(path.relative_to(ROOT)))
        return
    out = src
    for a, b, new in sorted(edits, reverse=True):
        out = out[:a] + new + out[b:]
    path.write_text(out, encoding="utf-8")
    CHANGED.append(str(path.relative_to(ROOT)))


TEXT_RULES = [
    # `python -m profiler ...` -> `python -m serwatt ...`; `-m profiler.x` -> `-m serwatt.profiler.x`
    (re.compile(r"(-m\s+)profiler(?=\s|$|[`'\")])", re.M), r"\1serwatt"),
    (re.compile(r"(-m\s+)(profiler|collectors)\.(?=\w)"), r"\1serwatt.\2."),
    # import lines in docs' code blocks
    (re.compile(r"^(\s*(?:>>>\s*)?from\s+)(profiler|collectors)(?=\.\w|\s+import\b)", re.M), r"\1serwatt.\2"),
    (re.compile(r"^(\s*(?:>>>\s*)?import\s+)(profiler|collectors)(?=\.\w)", re.M), r"\1serwatt.\2"),
    (re.compile(r"(?<![\w.])profiler\.cli\.main:main"), "serwatt.profiler.cli.main:main"),
    (re.compile(r"runpy\.run_module\((['\"])profiler\."), r"runpy.run_module(\1serwatt.profiler."),
]


def rewrite_text(path: Path) -> None:
    src = path.read_text(encoding="utf-8")
    out = src
    for rx, rep in TEXT_RULES:
        out = rx.sub(rep, out)
    if out != src:
        path.write_text(out, encoding="utf-8")
        CHANGED.append(str(path.relative_to(ROOT)))


def _squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def replace_once(rel: str, olds: list[str], new: str, why: str) -> None:
    """A targeted semantic fix: any of olds -> new; new already there (whitespace aside):
    nothing; neither: a warning for the lead. `new` is written as ruff formats it."""
    p = ROOT / rel
    if not p.exists():
        WARN.append(f"{rel}: missing; by hand: {why}")
        return
    s = p.read_text(encoding="utf-8")
    if _squeeze(new) in _squeeze(s):
        return
    for old in olds:
        if old in s:
            p.write_text(s.replace(old, new, 1), encoding="utf-8")
            CHANGED.append(rel)
            return
    WARN.append(f"{rel}: expected text not found; by hand: {why}")


def semantic_fixes() -> None:
    """After the generic pass (the olds are the original and the rewritten spelling)."""
    # serwatt's own processes are never targets (run from a checkout or the wheel); its
    # workloads (-m serwatt.profiler.workloads.*) are
    replace_once(
        "profiler/sampling/eligible.py",
        [
            'a == "-m" and (b in ("profiler", "profiler.cli") or b.startswith("collectors."))',
            'a == "-m" and (b in ("profiler", "serwatt.profiler.cli") or b.startswith("collectors."))',
        ],
        'a == "-m"\n'
        "        and (\n"
        '            b in ("serwatt", "serwatt.profiler", "serwatt.profiler.cli")\n'
        '            or b.startswith("serwatt.collectors.")\n'
        "        )",
        "serwatt's own `python -m serwatt` / `-m serwatt.collectors.fsevents` are not targets",
    )
    # the checkpoint watch child finds serwatt where this process found it: the directory
    # that holds the `serwatt` package (a checkout's root, or site-packages)
    replace_once(
        "collectors/fsevents.py",
        ["here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))"],
        "here = os.path.dirname(\n"
        '            os.path.dirname(os.path.abspath(sys.modules["serwatt"].__file__ or ""))\n'
        "        )",
        "the PYTHONPATH of the fsevents child must name the directory holding `serwatt`",
    )
    # the swap's fallback path: the directory that holds the `serwatt` package. From a
    # checkout that is the root above profiler/; installed, the folder above serwatt/
    replace_once(
        "profiler/profile/swap/sitecustomize.py",
        ["SERWATT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))\n"],
        "SERWATT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))\n"
        'if os.path.isfile(os.path.join(SERWATT_ROOT, "__init__.py")):  # installed: .../serwatt/\n'
        "    SERWATT_ROOT = os.path.dirname(SERWATT_ROOT)\n",
        "SERWATT_ROOT must be the directory that holds `serwatt`",
    )
    replace_once(
        "profiler/profile/swap/sitecustomize.py",
        ['find_spec("profiler.many") is None', 'find_spec("serwatt.profiler.many") is None'],
        'find_spec("serwatt") is None',
        "find_spec of a dotted name raises when its parent is missing: ask for `serwatt`",
    )


SETUPTOOLS_BLOCK = """[tool.setuptools]
# One import name, `serwatt`, so installing into a job's environment adds no generic
# top-level names. The repository keeps its folders: package-dir maps them under
# `serwatt`; serwatt/ holds the package's own __init__/__main__ and links to the folders,
# so a checkout on PYTHONPATH imports `serwatt` too (subprocess targets, mypy, lint-imports).
package-dir = {"serwatt" = "serwatt", "serwatt.profiler" = "profiler", "serwatt.collectors" = "collectors", "serwatt.configs" = "configs", "serwatt.dashboards" = "dashboards"}

[tool.setuptools.packages.find]
include = ["serwatt", "serwatt.*"]
# configs/ and dashboards/ hold data only (no __init__.py): found as namespace packages
namespaces = true
"""


def rewrite_pyproject() -> None:
    p = ROOT / "pyproject.toml"
    s = p.read_text(encoding="utf-8")
    o = s
    s = re.sub(r'(?<![\w.])profiler\.cli\.main:main', "serwatt.profiler.cli.main:main", s)
    s = re.sub(
        r'\[tool\.setuptools\.packages\.find\]\ninclude = \["profiler\*", "collectors\*"\]\n',
        SETUPTOOLS_BLOCK,
        s,
    )
    if "[tool.setuptools]\n" not in s:
        WARN.append("pyproject.toml: [tool.setuptools] block not written (find block changed?)")
    s = re.sub(r'(?m)^profiler = \[("\*\.yaml")', r'"serwatt.profiler" = [\1', s)
    if '"serwatt.dashboards" = [' not in s:
        s = re.sub(
            r'(?m)^("serwatt\.profiler" = \[.*\]\n)',
            r'\1# the operator files (example config, unit, Prometheus rules and scrape config,\n'
            r'# Grafana provisioning, dashboards): `serwatt daemon --example-config` prints one\n'
            r'"serwatt.configs" = ["*.yaml", "*.yml", "*.service", "*.json"]\n'
            r'"serwatt.configs.grafana" = ["**/*.yaml", "**/*.yml", "**/*.json"]\n'
            r'"serwatt.configs.prometheus" = ["*.yml", "*.yaml"]\n'
            r'"serwatt.configs.systemd" = ["*.service"]\n'
            r'"serwatt.dashboards" = ["*.json"]\n',
            s,
        )
    # import-linter: the root package and every module named in a contract
    s = s.replace('root_packages = ["profiler", "collectors"]', 'root_packages = ["serwatt"]')
    lines = s.split("\n")
    section = ""
    for k, line in enumerate(lines):
        if line.startswith("["):
            section = line
            continue
        if "importlinter" in section and not line.lstrip().startswith(("name", "#", "type")):
            lines[k] = re.sub(r'(?<=["|\s])(profiler|collectors)(?=[."\s|])', r"serwatt.\1", line)
    s = "\n".join(lines)
    if "[tool.ruff.lint.isort]" not in s:
        s = s.replace(
            '[tool.ruff.lint]\nselect = ["E", "F", "W", "I", "B", "UP"]\n',
            '[tool.ruff.lint]\nselect = ["E", "F", "W", "I", "B", "UP"]\n\n'
            '[tool.ruff.lint.isort]\nknown-first-party = ["serwatt"]\n',
        )
    if re.search(r"(?m)^\[tool\.mypy\]", s) and not re.search(r"(?m)^packages = \[\"serwatt\"\]", s):
        s = re.sub(
            r"(?m)^(\[tool\.mypy\]\n)",
            r'\1# `mypy` alone checks the one package (through the links in serwatt/: module names\n'
            r'# serwatt.profiler.*, as imported); listing the folders would name them twice\n'
            r'packages = ["serwatt"]\n',
            s,
        )
    if s != o:
        p.write_text(s, encoding="utf-8")
        CHANGED.append("pyproject.toml")


def rewrite_makefile() -> None:
    p = ROOT / "Makefile"
    if not p.exists():
        return
    s = p.read_text(encoding="utf-8")
    o = s
    s = re.sub(r"(\$\(BIN\)/mypy) profiler collectors\b", r"\1", s)
    if s != o:
        p.write_text(s, encoding="utf-8")
        CHANGED.append("Makefile")


LIMIT = 100


def wrap_long_lines(path: Path) -> None:
    """Lines the longer names pushed past the line limit, broken where a person would: after
    a comma inside brackets, between two parts of a string, or at a space in a docstring."""
    src = path.read_text(encoding="utf-8")
    lines = src.splitlines(keepends=True)
    if all(len(line.rstrip("\n")) <= LIMIT for line in lines):
        return
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    except (tokenize.TokenError, SyntaxError):
        return
    depth_at: dict[tuple[int, int], int] = {}
    depth = 0
    strings: list[tokenize.TokenInfo] = []
    for t in toks:
        if t.type == tokenize.OP and t.string in "([{":
            depth += 1
        elif t.type == tokenize.OP and t.string in ")]}":
            depth -= 1
        elif t.type == tokenize.OP and t.string == ",":
            depth_at[t.start] = depth
        elif t.type == tokenize.STRING:
            strings.append(t)
            depth_at[t.start] = depth
    changed = False
    for n in range(len(lines) - 1, -1, -1):
        line = lines[n].rstrip("\n")
        if len(line) <= LIMIT:
            continue
        row = n + 1
        indent = len(line) - len(line.lstrip())
        commas = [
            c
            for (r, c), d in depth_at.items()
            if r == row and d > 0 and c < LIMIT - 1 and line[c] == ","
            and len(line) - c - 2 + indent <= LIMIT
        ]
        if commas:
            c = max(commas)
            lines[n] = line[: c + 1] + "\n" + " " * indent + line[c + 1 :].lstrip() + "\n"
            changed = True
            continue
        for t in strings:
            if t.start[0] < row <= t.end[0] and t.string.startswith(('"""', "'''")):
                # a docstring line: break at the last space before the limit
                cut = line.rfind(" [", indent + 1, LIMIT)  # a usage line: before an option
                if cut <= indent:
                    cut = line.rfind(" ", indent + 1, LIMIT)
                if cut > indent:
                    lines[n] = line[:cut] + "\n" + " " * (indent + 4) + line[cut + 1 :] + "\n"
                    changed = True
                break
            if t.start[0] != row or t.end[0] != row:
                continue
            alone = line[: t.start[1]].rstrip().endswith("=") and not line[t.end[1] :].strip()
            if (depth_at.get(t.start, 0) == 0 and not alone) or t.string[:1] not in ("'", '"'):
                continue
            if t.start[1] >= LIMIT or t.end[1] <= LIMIT:
                continue
            q = t.string[0]
            body = t.string[1:-1]
            room = LIMIT - t.start[1] - 2
            nl = body.rfind("\\n", 0, room - 1)
            sp = body.rfind(" ", 0, room)
            cut = max(nl + 2 if nl >= 0 else -1, sp + 1 if sp > 0 else -1)
            if cut <= 0:
                continue
            a, b = body[:cut], body[cut:]
            if depth_at.get(t.start, 0) == 0:  # `x = "..."`: the parts go in parentheses
                lines[n] = (
                    line[: t.start[1]] + "(\n" + " " * (indent + 4) + q + a + q + "\n"
                    + " " * (indent + 4) + q + b + q + "\n" + " " * indent + ")\n"
                )
                changed = True
                break
            lines[n] = (
                line[: t.start[1]] + q + a + q + "\n" + " " * t.start[1] + q + b + q
                + line[t.end[1] :] + "\n"
            )
            changed = True
            break
    if changed:
        path.write_text("".join(lines), encoding="utf-8")
        CHANGED.append(str(path.relative_to(ROOT)))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[2] == "--wrap":
        for f in sys.argv[3:]:
            wrap_long_lines(ROOT / f)
        for c in sorted(set(CHANGED)):
            print("wrapped", c)
        return
    py_roots = ["profiler", "collectors", "tests", "bench", "serwatt"]
    for r in py_roots:
        for f in sorted((ROOT / r).rglob("*.py")):
            rel = f.relative_to(ROOT).as_posix()
            if (
                rel.startswith(("tests/fixtures/", "serwatt/profiler/", "serwatt/collectors/"))
                or rel in SKIP
                or f.is_symlink()
            ):
                continue
            rewrite_python(f)
    text_files = [ROOT / "README.md", ROOT / "Makefile", ROOT / ".ci" / "run"]
    text_files += sorted((ROOT / "docs").rglob("*.md"))
    text_files += sorted((ROOT / "bench").rglob("*.sh"))
    text_files += sorted((ROOT / "profiler").rglob("*.md"))
    text_files += [f for f in sorted((ROOT / "configs").rglob("*")) if f.is_file() and not f.is_symlink()]
    for f in text_files:
        if f.exists():
            rewrite_text(f)
    rewrite_pyproject()
    rewrite_makefile()
    semantic_fixes()
    for c in sorted(set(CHANGED)):
        print("rewrote", c)
    for w in WARN:
        print("WARNING:", w)


main()
