"""The AST source index: one parsed file's calls per line, its names resolved.

A SourceIndex parses a file once (in pieces, so the GIL is not held for a large file
at once: parse_source), keeps what each call on each line needs (its name chain, its
arguments, the scope it is in) and drops the syntax tree; `calls_at(line)` answers a
LineCalls (callsite.py). A target's file is hostile: indexing is linear in the file's
size and stops past a CPU budget (SOURCE_CPU_BUDGET_S) or a nesting depth
(MAX_SCOPE_DEPTH). docs/classification.md "Hostile sources".
"""

from __future__ import annotations

import ast
import re
import time
from array import array
from collections.abc import Callable

from serwatt.profiler.classify.callsite import (
    TOO_DEEP,
    Binding,
    CallSite,
    Chain,
    LineCalls,
    argument_chains,
    is_plain,
    name_chain,
    resolve,
)

# CPU seconds (the loader thread's own) reading, parsing and indexing one file may
# take; past it the file is given up (its lines classify `other`, low confidence) and
# never tried again in this process. The 1.4 MB torch file (target_files.MAX_SOURCE_BYTES)
# takes about 1 s.
SOURCE_CPU_BUDGET_S = 5.0
# Function/class/lambda nesting deeper than this: the file is given up as too costly
# (name lookups walk the enclosing scopes; real code nests a handful deep).
MAX_SCOPE_DEPTH = 100

_SCOPE_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)

# The start of the error a file given up as too costly reports (SourceCache.get's `error`).
TOO_COSTLY = "source too costly to index"


class SourceTooCostly(Exception):
    """Indexing a file went past SOURCE_CPU_BUDGET_S or MAX_SCOPE_DEPTH."""


class _Scope:
    __slots__ = ("start", "end", "bindings", "parent", "depth", "klass")

    def __init__(self, node: ast.AST | None, start: int, end: int, parent: _Scope | None) -> None:
        self.start = start
        self.end = end
        self.bindings: dict[str, Binding] = {}
        self.parent = parent
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.klass = isinstance(node, ast.ClassDef)


class _LineCover:
    """Which of a set of line spans cover a line, in time linear in their number and
    the lines (an index per line would cost spans x lines: the blow-up a file of
    nested multi-line calls caused).

    A span covers line L if it starts or ends on L (found by line, each span listed
    twice at most), or strictly contains L. Spans that strictly contain a line both
    contain all of it, so (being syntax-tree nodes) they nest: they form a chain,
    found from the innermost one (precomputed per line by one sweep) by following
    each span's enclosing one."""

    def __init__(self, spans: list[tuple[int, int]], count: Callable[[int], None]) -> None:
        self.spans = spans
        n_lines = max((e for _, e in spans), default=0) + 2
        self.by_start = _bucket(spans, [s for s, _ in spans], n_lines)
        multi = [i for i, (s, e) in enumerate(spans) if e > s]
        self.by_end = _bucket(spans, [spans[i][1] for i in multi], n_lines, multi)
        # innermost span strictly containing each line; each span's enclosing one
        self.inner = array("i", [-1]) * n_lines
        self.up = array("i", [-1]) * len(spans)
        opening = _bucket(
            spans,
            [s + 1 for s, e in spans if e - s >= 2],
            n_lines,
            [i for i, (s, e) in enumerate(spans) if e - s >= 2],
        )
        stack: list[int] = []
        for line in range(n_lines):
            while stack and spans[stack[-1]][1] <= line:
                stack.pop()
            lo, hi = opening[0][line], opening[0][line + 1]
            if hi > lo:
                # outer spans first: longer ones among those opening here
                for i in sorted(opening[1][lo:hi], key=lambda k: -spans[k][1]):
                    self.up[i] = stack[-1] if stack else -1
                    stack.append(i)
            if stack:
                self.inner[line] = stack[-1]
        count(3 * len(spans) + 3 * n_lines)

    def at(self, line: int) -> list[int]:
        if line < 0 or line >= len(self.inner):
            return []
        off, ids = self.by_start
        found = list(ids[off[line] : off[line + 1]])
        off, ids = self.by_end
        found.extend(ids[off[line] : off[line + 1]])
        i = self.inner[line]
        while i >= 0:
            s, e = self.spans[i]
            if s < line < e:
                found.append(i)
            i = self.up[i]
        return found


def _bucket(
    spans: list[tuple[int, int]],
    keys: list[int],
    n_lines: int,
    ids: list[int] | None = None,
) -> tuple[array, array]:
    """Counting sort of item ids by line: (offsets per line, ids), ids[off[L]:off[L+1]]
    being the items keyed L, in id order."""
    if ids is None:
        ids = list(range(len(keys)))
    off = array("i", [0]) * (n_lines + 1)
    for k in keys:
        off[k + 1] += 1
    for line in range(n_lines):
        off[line + 1] += off[line]
    out = array("i", [0]) * len(keys)
    fill = array("i", off)
    for k, i in zip(keys, ids, strict=True):
        out[fill[k]] = i
        fill[k] += 1
    return off, out


# ast.parse holds the GIL for the whole file (0.2-1 s for a large library file on a
# loaded node, stalling every sampling and energy thread): large files are parsed in
# pieces of about this many lines, each a run of whole top-level statements.
PARSE_CHUNK_LINES = 300
# A line that may begin a top-level statement: column 0, not a comment, not a
# clause that continues the statement before it.
_TOP_START = re.compile(r"(?!(?:else|elif|except|finally)\b)[A-Za-z_@]")
_MAX_MERGES = 16


def parse_source(
    text: str, filename: str = "<source>", check: Callable[[], None] | None = None
) -> ast.Module:
    """`ast.parse(text)`, holding the GIL for at most one piece of a large file at a time.

    The file is cut before lines that may start a top-level statement; a piece is
    accepted only if it parses on its own. A piece that parses is a prefix of the rest
    of the file that ends where the tokenizer is outside any string, bracket or
    continuation, and the next line starts at column 0 with no continuing clause, so
    its statements are exactly the ones the whole file's parse has there. A piece that
    does not parse (a cut inside a string) is joined with the next; past a few joins,
    or on any error at the end, the whole file is parsed at once (which also raises
    the genuine error). tests/classify/test_callsite_prefilter.py compares the trees.
    `check` runs after each piece (the CPU budget: it raises to stop).
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
                if check is not None:
                    check()
                merges += 1
                if end >= len(lines) or merges > _MAX_MERGES:
                    return ast.parse(text, filename=filename)
                c += 1  # join the next piece
        body.extend(mod.body)
        ignores.extend(mod.type_ignores)
        start = end
        if check is not None:
            check()
    return ast.Module(body=body, type_ignores=ignores)


class _Budget:
    """Counts the index's work; past SOURCE_CPU_BUDGET_S of this thread's CPU since
    `started` (time.thread_time()), raises SourceTooCostly."""

    def __init__(self, started: float | None) -> None:
        self.started = time.thread_time() if started is None else started
        self.limit = SOURCE_CPU_BUDGET_S
        self.work = 0
        self._next_check = 0

    def count(self, n: int) -> None:
        self.work += n
        if self.work >= self._next_check:
            self._next_check = self.work + 4096
            self.check()

    def check(self) -> None:
        spent = time.thread_time() - self.started
        if spent > self.limit:
            raise SourceTooCostly(
                f"{TOO_COSTLY}: over {self.limit:g} s of CPU ({spent:.2f} s spent)"
            )


class _CallRec:
    """What the index keeps of one call (the syntax tree itself is dropped)."""

    __slots__ = ("lineno", "end", "func", "method", "receiver", "nested", "args")

    def __init__(
        self,
        lineno: int,
        end: int,
        func: Chain | None,
        method: str | None,
        receiver: bool,
        nested: bool,
        args: tuple[Chain, ...] | None,
    ) -> None:
        self.lineno = lineno
        self.end = end
        self.func = func
        self.method = method
        self.receiver = receiver
        self.nested = nested
        self.args = args


class SourceIndex:
    """One parsed source file; `calls_at(line)` is memoized per line.

    Building it is linear in the file's size (`work` counts its elementary steps:
    syntax-tree nodes visited, name lookups, line entries; tests/classify/test_hostile_sources.py
    checks the ratio), and raises SourceTooCostly past SOURCE_CPU_BUDGET_S of CPU
    (counted from `cpu_started`, a time.thread_time(), when the caller's read began).
    """

    _MEMO_MAX = 1 << 15  # lines answered and kept

    def __init__(
        self,
        text: str,
        filename: str = "<source>",
        package: str | None = None,
        *,
        cpu_started: float | None = None,
    ) -> None:
        budget = _Budget(cpu_started)
        tree = parse_source(text, filename, budget.check)
        self._text = text
        self._filename = filename
        # The file's package ("multiprocessing" for multiprocessing/queues.py), used to
        # resolve relative imports; None when unknown (relative imports stay unresolved).
        self.package = package
        self._memo: dict[int, LineCalls] = {}
        self._steps = 0  # name lookups and scope nodes of the scope being bound
        module_scope = _Scope(tree, 0, 1 << 30, None)
        self._scopes: list[_Scope] = [module_scope]
        self._build(tree, module_scope, budget)
        # One pass, the order every line's calls are listed in; `inner` = below a
        # comprehension or lambda (its own frame <3.12).
        calls: list[_CallRec] = []
        receivers: set[int] = set()
        comp_spans: list[tuple[int, int]] = []
        stack: list[tuple[ast.AST, bool]] = [(tree, False)]
        while stack:
            node, inner = stack.pop()
            budget.count(1)
            if isinstance(node, ast.Call):
                func = node.func
                while isinstance(func, (ast.Attribute, ast.Call)):
                    if isinstance(func, ast.Call):
                        receivers.add(id(func))
                        func = func.func
                    else:
                        func = func.value
                calls.append(
                    _CallRec(
                        node.lineno,
                        node.end_lineno or node.lineno,
                        name_chain(node.func),
                        node.func.attr if isinstance(node.func, ast.Attribute) else None,
                        id(node) in receivers,
                        inner,
                        argument_chains(node),
                    )
                )
            elif isinstance(node, _COMPREHENSIONS):
                comp_spans.append((node.lineno, node.end_lineno or node.lineno))
            child_inner = inner or isinstance(node, (*_COMPREHENSIONS, ast.Lambda))
            stack.extend((child, child_inner) for child in ast.iter_child_nodes(node))
        # A receiver is found (by its parent call) before it is itself popped: walk
        # order pops the outer call first, so `id(node) in receivers` above holds.
        del tree, stack, receivers
        self._calls = calls
        self._call_cover = _LineCover([(c.lineno, c.end) for c in calls], budget.count)
        self._scope_cover = _LineCover([(s.start, s.end) for s in self._scopes[1:]], budget.count)
        self._comp_lines = _covered_lines(comp_spans, budget.count)
        self.work = budget.work

    @property
    def call_count(self) -> int:
        return len(self._calls)

    def line_table(self, max_entries: int) -> dict[int, LineCalls] | None:
        """Every line's LineCalls that is not the empty answer (no call, no comprehension),
        for the on-disk store (source_store.py); None once the calls listed pass
        `max_entries` (a call is listed on every line it spans, so deep multi-line calls
        would make the table quadratic in the file's size)."""
        last = max([c.end for c in self._calls] + [len(self._comp_lines) - 1])
        table: dict[int, LineCalls] = {}
        listed = 0
        for line in range(1, last + 1):
            lc = self.calls_at(line)
            listed += len(lc.calls)
            if listed > max_entries:
                return None
            if lc.calls or lc.comprehension or lc.unresolved:
                table[line] = lc
        return table

    @property
    def tree(self) -> ast.Module:
        """The file's syntax tree (parsed again: the index does not keep it)."""
        return parse_source(self._text, self._filename)

    def _lookup(
        self, scope: _Scope, name: str, *, own: dict[str, Binding] | None
    ) -> Binding | None:
        """`name` in `own` (the bindings being built), then `scope` and its enclosing
        scopes innermost first; class bodies other than `scope` itself do not enclose
        their methods' names (Python scoping)."""
        if own is not None and name in own:
            return own[name]
        s: _Scope | None = scope
        while s is not None:
            self._steps += 1
            if (s is scope or not s.klass) and name in s.bindings:
                return s.bindings[name]
            s = s.parent
        return None

    def _build(self, tree: ast.Module, module_scope: _Scope, budget: _Budget) -> None:
        """Every scope's bindings, scopes listed in the order a depth-first walk meets
        them (the order _scope_at breaks ties in); a scope's bindings are complete
        before any scope nested in it is built. Iterative: nesting cannot overflow."""
        todo: list[tuple[ast.AST, _Scope]] = [(tree, module_scope)]
        while todo:
            node, scope = todo.pop()
            if scope is not module_scope:
                self._scopes.append(scope)
            if scope.depth > MAX_SCOPE_DEPTH:
                raise SourceTooCostly(f"{TOO_COSTLY}: scopes nested over {MAX_SCOPE_DEPTH} deep")
            self._steps = 0
            nested = self._bind(node, scope)
            budget.count(len(nested) + self._steps + 1)
            subs = []
            for child in nested:
                start = getattr(child, "lineno", 0)
                decorators = getattr(child, "decorator_list", [])
                if decorators:
                    start = min(start, *(d.lineno for d in decorators))
                end = getattr(child, "end_lineno", None) or start
                sub = _Scope(child, start, end, scope)
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    for arg in _arg_names(child.args):
                        # A parameter shadows a module-level import of the same name.
                        sub.bindings[arg] = (arg, False)
                subs.append((child, sub))
            todo.extend(reversed(subs))

    def _bind(self, node: ast.AST, scope: _Scope) -> list[ast.AST]:
        """Bind `node`'s own scope's names; returns the scopes nested directly in it."""
        nested: list[ast.AST] = []
        body = _scope_body(node)
        self._steps += len(body)
        parent = scope.parent
        bindings = scope.bindings

        def lookup(name: str) -> Binding | None:
            # what `{**env(parent), **bindings}` held: bindings so far, then the parent's
            # view (the parent itself included even when it is a class body)
            if name in bindings:
                return bindings[name]
            return self._lookup(parent, name, own=None) if parent is not None else None

        def value_of(expr: ast.expr) -> Binding | None:
            chain = name_chain(expr)
            if chain is None or chain is TOO_DEEP:
                return None
            self._steps += len(chain[1]) + 1
            return resolve(chain, lookup)

        # Imports bind first (anywhere in the scope), then assignments in source order.
        for child in body:
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.asname:
                        bindings[alias.asname] = (alias.name, True)
                    else:
                        root = alias.name.split(".", 1)[0]
                        bindings[root] = (root, True)
            elif isinstance(child, ast.ImportFrom):
                base = self._absolute(child.module, child.level)
                if base is None:
                    continue
                for alias in child.names:
                    if alias.name == "*":
                        continue
                    bindings[alias.asname or alias.name] = (f"{base}.{alias.name}", True)
        for child in body:
            if isinstance(child, _SCOPE_NODES):
                nested.append(child)
            if isinstance(child, ast.Assign) and len(child.targets) == 1:
                target = child.targets[0]
                if isinstance(target, ast.Name):
                    value = value_of(child.value)
                    if value is not None and value[1]:
                        bindings[target.id] = value
            elif isinstance(child, ast.AnnAssign) and child.value is not None:
                if isinstance(child.target, ast.Name):
                    value = value_of(child.value)
                    if value is not None and value[1]:
                        bindings[child.target.id] = value
            elif isinstance(child, ast.withitem) and child.optional_vars is not None:
                if isinstance(child.optional_vars, ast.Name):
                    value = value_of(child.context_expr)
                    if value is not None and value[1]:
                        bindings[child.optional_vars.id] = value
            elif isinstance(child, ast.ClassDef):
                # `class P(pickle.Pickler)`: `P(f).dump(x)` is `pickle.Pickler().dump`.
                for base_expr in child.bases:
                    value = value_of(base_expr)
                    if value is not None and value[1]:
                        bindings[child.name] = value
                        break
        return nested

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
        """The innermost scope covering `line`: the shortest span, the later of two
        equal ones."""
        best_k = -1
        best = self._scopes[0]
        found = self._scope_cover.at(line)
        self._steps += len(found)
        for k in found:
            s = self._scopes[k + 1]
            span, best_span = s.end - s.start, best.end - best.start
            if span < best_span or (span == best_span and k > best_k):
                best, best_k = s, k
        return best

    def calls_at(self, line: int) -> LineCalls:
        hit = self._memo.get(line)
        if hit is not None:
            return hit
        steps = self._steps
        scope = self._scope_at(line)
        calls = []
        unresolved = False

        def lookup(name: str) -> Binding | None:
            return self._lookup(scope, name, own=None)

        for k in sorted(self._call_cover.at(line)):
            c = self._calls[k]
            if c.func is TOO_DEEP:
                unresolved = True
                continue
            resolved = resolve(c.func, lookup) if c.func is not None else None
            name, imported = resolved if resolved is not None else ("?", False)
            calls.append(
                CallSite(
                    name,
                    c.method,
                    imported,
                    c.lineno,
                    c.end,
                    receiver=c.receiver,
                    nested=c.nested,
                    plain_args=c.args is not None and all(is_plain(a, lookup) for a in c.args),
                )
            )
        comp = 0 <= line < len(self._comp_lines) and bool(self._comp_lines[line])
        result = LineCalls(tuple(calls), comp, unresolved)
        # answering counts too: calls and scopes found, names looked up
        self.work += 1 + len(calls) + self._steps - steps
        if len(self._memo) >= self._MEMO_MAX:
            self._memo.clear()
        self._memo[line] = result
        return result


def _covered_lines(spans: list[tuple[int, int]], count: Callable[[int], None]) -> bytearray:
    """1 for each line some span covers (a running count over start/end marks)."""
    n = max((e for _, e in spans), default=0) + 2
    marks = array("i", [0]) * (n + 1)
    for s, e in spans:
        marks[s] += 1
        marks[e + 1] -= 1
    out = bytearray(n)
    depth = 0
    for line in range(n):
        depth += marks[line]
        out[line] = depth > 0
    count(len(spans) + n)
    return out


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


def _arg_names(args: ast.arguments) -> list[str]:
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    if args.vararg:
        names.append(args.vararg.arg)
    if args.kwarg:
        names.append(args.kwarg.arg)
    return names
