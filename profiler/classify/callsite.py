"""Call-site reading: which calls a target's source line makes, with imports resolved.

A C serializer (`_pickle`, upb protobuf, orjson, msgpack's Cython unpacker) pushes no
Python frame, so while it runs the innermost Python frame is its caller, at the line
of the call. This module reads that caller's source file (through `/proc/<pid>/root`
so container targets work), parses it once per (path, mtime, size) with `ast`, and
answers: which calls span line L, resolved through import aliases and simple local
bindings (`import pickle as pk`, `from pickle import loads as thaw`,
`p = pickle.Pickler(f)`, `class P(pickle.Pickler)`), and whether the line does other
work too (a comprehension, a generator).

Names: a call's `name` is a dotted path with `()` marking a call result, e.g.
`pickle.dumps`, `pickle.Pickler().dump`, `msg.SerializeToString`; `imported` says
its root name is bound by an import (so `pickle.dumps` really is the module's).
"""

from __future__ import annotations

import ast
import io
import os
import re
import threading
import time
import tokenize
import unicodedata
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

MAX_SOURCE_BYTES = 8 * 1024 * 1024

_SCOPE_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@dataclass(frozen=True)
class CallSite:
    name: str  # resolved dotted name, "()" marks a call result
    method: str | None  # attribute name for `x.m(...)`, else None
    imported: bool  # the name's root is bound by an import
    lineno: int
    end_lineno: int
    receiver: bool = False  # the object another call is made on: `Pickler(f)` in `.dump(x)`
    nested: bool = False  # inside a comprehension/generator/lambda (its own frame <3.12)


@dataclass(frozen=True)
class LineCalls:
    """Every call whose source span includes one line, innermost scope's bindings applied."""

    calls: tuple[CallSite, ...]
    comprehension: bool  # a comprehension/generator also runs on this line


_Binding = tuple[str, bool]  # (dotted name, imported)


def _resolve(expr: ast.expr, env: dict[str, _Binding]) -> _Binding | None:
    if isinstance(expr, ast.Name):
        return env.get(expr.id, (expr.id, False))
    if isinstance(expr, ast.Attribute):
        base = _resolve(expr.value, env)
        if base is None:
            return ("?." + expr.attr, False)
        return (f"{base[0]}.{expr.attr}", base[1])
    if isinstance(expr, ast.Call):
        base = _resolve(expr.func, env)
        if base is None:
            return None
        return (base[0] + "()", base[1])
    return None


def _scope_body(node: ast.AST) -> list[ast.AST]:
    """Nodes in `node`'s own scope, in source order, not descending into nested scopes."""
    out: list[ast.AST] = []
    stack = list(reversed(list(ast.iter_child_nodes(node))))
    while stack:
        child = stack.pop()
        out.append(child)
        if isinstance(child, _SCOPE_NODES):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(child))))
    return out


@dataclass
class _Scope:
    node: ast.AST
    start: int
    end: int
    bindings: dict[str, _Binding]
    parent: _Scope | None


# ast.parse holds the GIL for the whole file (0.2-1 s for a large library file on a
# loaded node, stalling every sampling and energy thread): large files are parsed in
# pieces of about this many lines, each a run of whole top-level statements.
PARSE_CHUNK_LINES = 300
# A line that may begin a top-level statement: column 0, not a comment, not a
# clause that continues the statement before it.
_TOP_START = re.compile(r"(?!(?:else|elif|except|finally)\b)[A-Za-z_@]")
_MAX_MERGES = 16


def parse_source(text: str, filename: str = "<source>") -> ast.Module:
    """`ast.parse(text)`, holding the GIL for at most one piece of a large file at a time.

    The file is cut before lines that may start a top-level statement; a piece is
    accepted only if it parses on its own. A piece that parses is a prefix of the rest
    of the file that ends where the tokenizer is outside any string, bracket or
    continuation, and the next line starts at column 0 with no continuing clause, so
    its statements are exactly the ones the whole file's parse has there. A piece that
    does not parse (a cut inside a string) is joined with the next; past a few joins,
    or on any error at the end, the whole file is parsed at once (which also raises
    the genuine error). tests/test_callsite_prefilter.py compares the trees.
    """
    if (
        text.count("\n") <= PARSE_CHUNK_LINES
        or "__future__" in text  # future imports can change how the rest parses
        or text.count("\r") != text.count("\r\n")  # lone CR newlines: lines miscounted
    ):
        return ast.parse(text, filename=filename)
    lines = text.split("\n")
    cuts = [
        k
        for k in range(1, len(lines))
        if _TOP_START.match(lines[k]) and not lines[k - 1].startswith("@")
    ]
    body: list[ast.stmt] = []
    ignores: list[ast.TypeIgnore] = []
    start, c = 0, 0
    while start < len(lines):
        while c < len(cuts) and cuts[c] < start + PARSE_CHUNK_LINES:
            c += 1
        merges = 0
        while True:
            end = cuts[c] if c < len(cuts) else len(lines)
            # leading blank lines put the piece's statements at their own line numbers
            piece = "\n" * start + "\n".join(lines[start:end]) + ("\n" if end < len(lines) else "")
            try:
                mod = ast.parse(piece, filename=filename)
                break
            except Exception:  # noqa: BLE001 - any failure: the whole-file parse decides
                merges += 1
                if end >= len(lines) or merges > _MAX_MERGES:
                    return ast.parse(text, filename=filename)
                c += 1  # join the next piece
        body.extend(mod.body)
        ignores.extend(mod.type_ignores)
        start = end
    return ast.Module(body=body, type_ignores=ignores)


class SourceIndex:
    """One parsed source file; `calls_at(line)` is memoized per line."""

    def __init__(self, text: str, filename: str = "<source>", package: str | None = None) -> None:
        self.tree = parse_source(text, filename)
        # The file's package ("multiprocessing" for multiprocessing/queues.py), used to
        # resolve relative imports; None when unknown (relative imports stay unresolved).
        self.package = package
        self._calls: list[ast.Call] = []
        self._comps: list[ast.expr] = []
        self._scopes: list[_Scope] = []
        self._memo: dict[int, LineCalls] = {}
        self._by_line: dict[int, list[ast.Call]] | None = None
        self._comp_lines: set[int] = set()
        module_scope = _Scope(self.tree, 0, 1 << 30, {}, None)
        self._scopes.append(module_scope)
        self._build(self.tree, module_scope)
        self._receivers: set[int] = set()
        self._nested: set[int] = set()
        # One pass; `inner` = below a comprehension or lambda (its own frame <3.12).
        stack: list[tuple[ast.AST, bool]] = [(self.tree, False)]
        while stack:
            node, inner = stack.pop()
            if isinstance(node, ast.Call):
                self._calls.append(node)
                if inner:
                    self._nested.add(id(node))
                func = node.func
                while isinstance(func, (ast.Attribute, ast.Call)):
                    if isinstance(func, ast.Call):
                        self._receivers.add(id(func))
                        func = func.func
                    else:
                        func = func.value
            elif isinstance(node, _COMPREHENSIONS):
                self._comps.append(node)
            child_inner = inner or isinstance(node, (*_COMPREHENSIONS, ast.Lambda))
            stack.extend((child, child_inner) for child in ast.iter_child_nodes(node))

    def _env(self, scope: _Scope) -> dict[str, _Binding]:
        chain = []
        s: _Scope | None = scope
        while s is not None:
            # Class bodies do not enclose their methods' names (Python scoping).
            if not isinstance(s.node, ast.ClassDef) or s is scope:
                chain.append(s.bindings)
            s = s.parent
        env: dict[str, _Binding] = {}
        for b in reversed(chain):
            env.update(b)
        return env

    def _build(self, node: ast.AST, scope: _Scope) -> None:
        nested: list[ast.AST] = []
        body = _scope_body(node)
        env = self._env(scope.parent) if scope.parent is not None else {}
        # Imports bind first (anywhere in the scope), then assignments in source order.
        for child in body:
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.asname:
                        scope.bindings[alias.asname] = (alias.name, True)
                    else:
                        root = alias.name.split(".", 1)[0]
                        scope.bindings[root] = (root, True)
            elif isinstance(child, ast.ImportFrom):
                base = self._absolute(child.module, child.level)
                if base is None:
                    continue
                for alias in child.names:
                    if alias.name == "*":
                        continue
                    scope.bindings[alias.asname or alias.name] = (f"{base}.{alias.name}", True)
        for child in body:
            if isinstance(child, _SCOPE_NODES):
                nested.append(child)
            if not isinstance(child, (ast.Assign, ast.AnnAssign, ast.withitem, ast.ClassDef)):
                continue
            local_env = {**env, **scope.bindings}
            if isinstance(child, ast.Assign) and len(child.targets) == 1:
                target = child.targets[0]
                if isinstance(target, ast.Name):
                    value = _resolve(child.value, local_env)
                    if value is not None and value[1]:
                        scope.bindings[target.id] = value
            elif isinstance(child, ast.AnnAssign) and child.value is not None:
                if isinstance(child.target, ast.Name):
                    value = _resolve(child.value, local_env)
                    if value is not None and value[1]:
                        scope.bindings[child.target.id] = value
            elif isinstance(child, ast.withitem) and child.optional_vars is not None:
                if isinstance(child.optional_vars, ast.Name):
                    value = _resolve(child.context_expr, local_env)
                    if value is not None and value[1]:
                        scope.bindings[child.optional_vars.id] = value
            elif isinstance(child, ast.ClassDef):
                # `class P(pickle.Pickler)`: `P(f).dump(x)` is `pickle.Pickler().dump`.
                for base_expr in child.bases:
                    value = _resolve(base_expr, local_env)
                    if value is not None and value[1]:
                        scope.bindings[child.name] = value
                        break
        for child in nested:
            start = getattr(child, "lineno", 0)
            decorators = getattr(child, "decorator_list", [])
            if decorators:
                start = min(start, *(d.lineno for d in decorators))
            end = getattr(child, "end_lineno", None) or start
            sub = _Scope(child, start, end, {}, scope)
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                for arg in _arg_names(child.args):
                    # A parameter shadows a module-level import of the same name.
                    sub.bindings[arg] = (arg, False)
            self._scopes.append(sub)
            self._build(child, sub)

    def _absolute(self, module: str | None, level: int) -> str | None:
        """`from ..x import y` -> the absolute module the names come from, if known."""
        if not level:
            return module
        if not self.package:
            return None
        parts = self.package.split(".")
        if level - 1 >= len(parts):
            return None
        base = ".".join(parts[: len(parts) - (level - 1)])
        return f"{base}.{module}" if module else base

    def _scope_at(self, line: int) -> _Scope:
        best = self._scopes[0]
        for s in self._scopes[1:]:
            if s.start <= line <= s.end and (s.end - s.start) <= (best.end - best.start):
                best = s
        return best

    def _index_lines(self) -> None:
        # Built on the first query: line -> calls whose span covers it, in walk order.
        by_line: dict[int, list[ast.Call]] = {}
        for node in self._calls:
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                by_line.setdefault(line, []).append(node)
        for c in self._comps:
            self._comp_lines.update(range(c.lineno, (c.end_lineno or c.lineno) + 1))
        self._by_line = by_line

    def calls_at(self, line: int) -> LineCalls:
        hit = self._memo.get(line)
        if hit is not None:
            return hit
        scope = self._scope_at(line)
        env = self._env(scope)
        calls = []
        if self._by_line is None:
            self._index_lines()
            assert self._by_line is not None
        for node in self._by_line.get(line, ()):
            end = node.end_lineno or node.lineno
            resolved = _resolve(node.func, env)
            name, imported = resolved if resolved is not None else ("?", False)
            method = node.func.attr if isinstance(node.func, ast.Attribute) else None
            calls.append(
                CallSite(
                    name,
                    method,
                    imported,
                    node.lineno,
                    end,
                    receiver=id(node) in self._receivers,
                    nested=id(node) in self._nested,
                )
            )
        result = LineCalls(tuple(calls), line in self._comp_lines)
        self._memo[line] = result
        return result


def _arg_names(args: ast.arguments) -> list[str]:
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    if args.vararg:
        names.append(args.vararg.arg)
    if args.kwarg:
        names.append(args.kwarg.arg)
    return names


def read_source(path: Path) -> str:
    """A Python source file's text, honouring its coding cookie; raises OSError/ValueError."""
    with open(path, "rb") as fh:
        data = fh.read(MAX_SOURCE_BYTES + 1)
    if len(data) > MAX_SOURCE_BYTES:
        raise ValueError(f"larger than {MAX_SOURCE_BYTES} bytes")
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding)


_WORD = re.compile(r"\w+")
_GLOB_CHARS = ("*", "?", "[")


def required_words(pattern: str) -> tuple[str | None, frozenset[str]] | None:
    """What a resolved call name must hold to match the `calls` glob `pattern`: (the
    name's first segment when the glob fixes it, identifiers that must be whole
    segments); None when nothing can be said (a `re:` pattern, a bracket glob, or no
    literal segment).

    A resolved name is dotted segments (each an identifier, `()` marking a call
    result), and every segment is an identifier written in the file itself (the call
    text, an import, an assignment) or a part of the file's package (relative
    imports). A glob segment with no wildcard lies between literal dots (or an end
    of the pattern), so it must be a whole segment of any name the glob matches.
    """
    if pattern.startswith("re:") or "[" in pattern:
        return None
    words = set()
    pieces = pattern.split(".")
    for piece in pieces:
        if any(c in piece for c in _GLOB_CHARS):
            continue
        while piece.endswith("()"):
            piece = piece[:-2]
        if piece.isidentifier():
            words.add(piece)
    if not words:
        return None
    first = pieces[0]
    root = first if first.isidentifier() else None
    return root, frozenset(words)


# The roots an import statement can bind (`import a.b as c` -> a; `from a.b import c`
# -> a; `from . import c` -> the package's root), read loosely: matches inside strings
# or comments only add roots, which keeps the test conservative.
_LINE_JOIN = r"(?:[ \t\f]|\\\r?\n)+"
_FROM_ROOT = re.compile(r"\bfrom" + _LINE_JOIN + r"(\.*)(\w*)")
_IMPORT_TAIL = re.compile(r"\bimport" + _LINE_JOIN + r"((?:[^\n;#\\]|\\\r?\n)*)")


def import_roots(text: str, package: str | None) -> set[str]:
    roots: set[str] = set()
    for dots, name in _FROM_ROOT.findall(text):
        if dots:
            if package:
                roots.add(package.split(".", 1)[0])
        elif name:
            roots.add(name)
    for tail in _IMPORT_TAIL.findall(text):
        for part in tail.replace("(", ",").split(","):
            m = _WORD.search(part)
            if m:
                roots.add(m.group())
    if not text.isascii():
        roots.update([unicodedata.normalize("NFKC", r) for r in roots])
    return roots


class CallsitePrefilter:
    """Says, from a file's text alone, whether any line of it can match a call-site rule.

    A call matches a rule by its resolved name (`calls`; only when the name's root is
    bound by an import) or by its method name (`methods`). Both are made of identifiers
    that appear in the file's text (or its package's name): a file whose words cannot
    form any rule's name has no call-site match on any line, so it need not be parsed
    (`ast.parse` of a large library file costs 0.1-0.5 s of CPU with the GIL held).
    The test is conservative: any `re:` calls pattern, or a glob with no literal
    segment, makes every file a "maybe".
    """

    def __init__(self, calls: Iterable[str], methods: Callable[[str], bool]) -> None:
        self.method_match = methods
        self.always = False
        need: list[tuple[str | None, frozenset[str]]] = []
        for pattern in calls:
            req = required_words(pattern)
            if req is None:
                self.always = True
            else:
                need.append(req)
        self.need = tuple(need)

    def may_match(self, text: str, package: str | None) -> bool:
        if self.always:
            return True
        words = set(_WORD.findall(text))
        if not text.isascii():
            # ast normalizes identifiers (NFKC); the text may hold other spellings
            words.update([unicodedata.normalize("NFKC", w) for w in words])
        if any(self.method_match(w) for w in words):
            return True
        if "import" not in words:
            return False  # a `calls` match needs a name bound by an import
        if package:
            words.update(package.split("."))
        roots: set[str] | None = None
        for root, need in self.need:
            if not need <= words:
                continue
            if root is None:
                return True
            if roots is None:
                roots = import_roots(text, package)
            # the name's root is bound by an import (assignments only pass it on)
            if root in roots:
                return True
        return False


@dataclass
class _Entry:
    key: tuple[int, int] | None  # (mtime_ns, size); None when the file could not be stat'ed
    index: SourceIndex | None
    error: str | None
    checked_at: float
    # the prefilter read the text and found no possible call-site match: not parsed
    filtered: bool = False


# Parsed files shared by every SourceCache in the process, keyed by the file's identity
# and version (st_dev, st_ino, mtime_ns, size). Targets' frames name their files through
# /proc/<pid>/root, so each process of a job, and each restart, is a new path to the same
# inode, and the daemon keeps one classifier (one SourceCache) per concurrent window:
# without this, one file would be parsed once per (process, classifier) pair and the
# daemon's RSS would grow as processes come and go (docs/daemon.md). Weak values: an index
# lives as long as some cache holds it.
_SHARED: weakref.WeakValueDictionary[tuple[int, int, int, int], SourceIndex] = (
    weakref.WeakValueDictionary()
)
_SHARED_LOCK = threading.Lock()


class SourceCache:
    """Parsed sources keyed by path, revalidated by (mtime, size) at most every `stat_ttl_s`.

    A file already parsed by any cache in the process (same inode and version) is
    reused, not parsed again (`shared_hits`).

    `generation` increases whenever a cached file changes, so callers that memoize
    results derived from sources know to drop them.
    """

    def __init__(self, *, max_files: int = 2048, stat_ttl_s: float = 2.0) -> None:
        self.max_files = max_files
        self.stat_ttl_s = stat_ttl_s
        self.generation = 0
        self.sweeps = 0
        self.parses = 0
        self.filtered = 0  # files the prefilter read and did not parse
        self.shared_hits = 0  # files another path or cache had parsed already
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._last_sweep = time.monotonic()

    @staticmethod
    def _stat(path: str) -> os.stat_result | None:
        try:
            return os.stat(path)
        except OSError:
            return None

    @classmethod
    def _stat_key(cls, path: str) -> tuple[int, int] | None:
        st = cls._stat(path)
        return (st.st_mtime_ns, st.st_size) if st is not None else None

    def revalidate(self, now: float | None = None) -> bool:
        """Re-stat every cached file if the TTL passed; True when something changed."""
        now = time.monotonic() if now is None else now
        if now - self._last_sweep < self.stat_ttl_s:
            return False
        self._last_sweep = now
        self.sweeps += 1
        changed = False
        for path in list(self._entries):
            entry = self._entries[path]
            if self._stat_key(path) != entry.key:
                del self._entries[path]
                changed = True
            else:
                entry.checked_at = now
        if changed:
            self.generation += 1
        return changed

    def forget(self, prefix: str) -> None:
        """Drop every cached file under `prefix` (a target's root that now is another)."""
        gone = [p for p in self._entries if p.startswith(prefix)]
        for p in gone:
            del self._entries[p]
        if gone:
            self.generation += 1

    def get(
        self, path: str, prefilter: CallsitePrefilter | None = None
    ) -> tuple[SourceIndex | None, str | None, int | None]:
        """(index, error, mtime_ns) for one path; the error says why there is no index.

        With `prefilter`, a file whose text cannot hold a call-site match is not parsed:
        (None, None, mtime_ns). Without it, such a file is parsed now.
        """
        entry = self._entries.get(path)
        if entry is not None and not (entry.filtered and prefilter is None):
            self._entries.move_to_end(path)
            return entry.index, entry.error, entry.key[0] if entry.key else None
        st = self._stat(path)
        key = (st.st_mtime_ns, st.st_size) if st is not None else None
        index: SourceIndex | None = None
        error: str | None = None
        filtered = False
        if st is None:
            error = "source not readable"
        else:
            ident = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            with _SHARED_LOCK:
                index = _SHARED.get(ident)
            if index is not None:
                self.shared_hits += 1
            else:
                try:
                    text = read_source(Path(path))
                    package = package_of(Path(path))
                    if prefilter is not None and not prefilter.may_match(text, package):
                        filtered = True
                        self.filtered += 1
                    else:
                        index = SourceIndex(text, path, package)
                        self.parses += 1
                        with _SHARED_LOCK:
                            index = _SHARED.setdefault(ident, index)
                except (OSError, ValueError, SyntaxError, RecursionError, MemoryError) as exc:
                    error = f"source not parsed: {type(exc).__name__}: {exc}"
        self._entries[path] = _Entry(key, index, error, time.monotonic(), filtered)
        self._entries.move_to_end(path)
        if len(self._entries) > self.max_files:
            self._entries.popitem(last=False)
        return index, error, key[0] if key else None


def package_of(path: Path) -> str | None:
    """The dotted package a source file belongs to, from `__init__.py` files above it."""
    parts: list[str] = []
    d = path.parent
    while (d / "__init__.py").exists() and d.name and len(parts) < 32:
        parts.insert(0, d.name)
        d = d.parent
    return ".".join(parts) or None


def source_path(filename: str, proc_root: Path | None) -> str | None:
    """Where to read a frame's file: through the target's root, or None if not a file."""
    if not filename or filename.startswith("<") or not filename.endswith((".py", ".pyw")):
        return None
    if proc_root is None:
        return filename
    if not filename.startswith("/"):
        return None  # relative to the target's cwd, which we do not know
    return str(proc_root) + filename
