"""Call-site reading: which calls a target's source line makes, with imports resolved.

A C serializer (`_pickle`, upb protobuf, orjson, msgpack's Cython unpacker) pushes no
Python frame, so while it runs the innermost Python frame is its caller, at the line
of the call. This module reads that caller's source file (inside the target's root,
`/proc/<pid>/root`, so container targets work), parses it once per file version with
`ast`, and answers: which calls span line L, resolved through import aliases and
simple local bindings (`import pickle as pk`, `from pickle import loads as thaw`,
`p = pickle.Pickler(f)`, `class P(pickle.Pickler)`), and whether the line does other
work too (a comprehension, a generator).

Names: a call's `name` is a dotted path with `()` marking a call result, e.g.
`pickle.dumps`, `pickle.Pickler().dump`, `msg.SerializeToString`; `imported` says
its root name is bound by an import (so `pickle.dumps` really is the module's).

Every file a target names is hostile (serwatt runs as root, the target does not):
paths resolve inside the target's root and never leave it (openat2 RESOLVE_IN_ROOT,
or a component walk where the kernel lacks it); only regular files are opened, never
FIFOs or device nodes; reads are bounded (MAX_SOURCE_BYTES); indexing is linear in
the file's size and stops past a CPU budget (SOURCE_CPU_BUDGET_S); and loading runs
on loader threads that callers wait on only until their deadline (SOURCE_WAIT_S), so
no file can stall a sampling thread. docs/classification.md "Hostile sources".
"""

from __future__ import annotations

import ast
import ctypes
import errno
import io
import os
import platform
import re
import stat
import threading
import time
import tokenize
import unicodedata
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path

# The largest file read. The largest .py file in the stdlib or torch 2.x is 1.4 MB
# (torch/testing/_internal/common_methods_invocations.py). Parsing peaks at up to
# ~520 bytes of memory per source byte for the densest code (the syntax tree and the
# parser's arena, freed once the index is built; the index keeps under 11 B/byte):
# docs/classification.md "Hostile sources".
MAX_SOURCE_BYTES = 1536 * 1024
# CPU seconds (the loader thread's own) reading, parsing and indexing one file may
# take; past it the file is given up (its lines classify `other`, low confidence) and
# never tried again in this process. The 1.4 MB torch file above takes about 1 s.
SOURCE_CPU_BUDGET_S = 5.0
# How long one caller waits for one file's load. A load still running after this is
# not waited on again by anyone: it finishes (or not) in the background.
SOURCE_WAIT_S = 3.0
# Loader threads at once, in all and per target root. A load blocked for good (a
# FUSE file the target serves and never answers) keeps its thread; past these caps
# new files are "not ready" until loads finish, so a target can degrade its own
# call-site classification, not stall sampling or grow the daemon's threads.
MAX_LOADS = 16
MAX_LOADS_PER_ROOT = 4
# A dotted name longer than this (`a.b.c...`) is not resolved: its line is `other`,
# low confidence.
MAX_NAME_PARTS = 64
# Function/class/lambda nesting deeper than this: the file is given up as too costly
# (name lookups walk the enclosing scopes; real code nests a handful deep).
MAX_SCOPE_DEPTH = 100

_SCOPE_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)

# Errors (SourceCache.get's `error`) that callers tell apart.
NOT_READY = "source not ready: still loading (not waited on past the deadline)"
TOO_COSTLY = "source too costly to index"


class SourceTooCostly(Exception):
    """Indexing a file went past SOURCE_CPU_BUDGET_S or MAX_SCOPE_DEPTH."""


class NotRegularFile(OSError):
    """A source path names a FIFO, device node, socket or directory: never read."""


# --------------------------------------------------------------------------- opening

# openat2(2) (Linux 5.6+): resolve a path with a directory fd as its root, so "..",
# absolute symlinks and absolute paths all stay below it.
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
# 437 on every architecture with the unified syscall table (all 64-bit Linux ports).
_SYS_OPENAT2 = 437
_OPENAT2_ARCHES = ("x86_64", "aarch64", "arm64", "ppc64le", "s390x", "riscv64")
_MAX_SYMLINKS = 40  # the kernel's own limit (ELOOP)


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


_libc: ctypes.CDLL | None = None
# None: not probed yet; tests set False to exercise the component walk.
_OPENAT2_OK: bool | None = None


def _openat2(dirfd: int, path: str, flags: int) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    how = _OpenHow(flags, 0, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
    for _ in range(8):  # EAGAIN: a rename or mount raced the resolution; retry
        fd = _libc.syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(dirfd),
            ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


def openat2_available() -> bool:
    """Whether openat2 with RESOLVE_IN_ROOT works here (kernel, seccomp, arch)."""
    global _OPENAT2_OK
    if _OPENAT2_OK is None:
        ok = False
        if platform.system() == "Linux" and platform.machine() in _OPENAT2_ARCHES:
            try:
                root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.close(_openat2(root, ".", os.O_PATH | os.O_CLOEXEC))
                    ok = True
                finally:
                    os.close(root)
            except OSError:
                ok = False  # ENOSYS (before 5.6), EPERM (a seccomp filter)
        _OPENAT2_OK = ok
    return _OPENAT2_OK


def _walk_in_root(rootfd: int, path: str) -> int:
    """An O_PATH fd for `path` resolved with `rootfd` as "/": each component opened
    with O_NOFOLLOW, symlinks spliced in by hand (absolute ones restart at the root),
    ".." never above the root. The fallback where openat2 is missing."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    stack = [os.dup(rootfd)]  # the directories from the root down to the current one
    links = 0
    try:
        while parts:
            name = parts.pop(0)
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=stack[-1])
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                try:
                    target = os.readlink("", dir_fd=fd)
                finally:
                    os.close(fd)
                links += 1
                if links > _MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop())
                parts[:0] = [p for p in target.split("/") if p not in ("", ".")]
                continue
            if parts and not stat.S_ISDIR(mode):
                os.close(fd)
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            stack.append(fd)
        return stack.pop() if len(stack) > 1 else os.dup(stack[0])
    finally:
        for fd in stack:
            os.close(fd)


def _open_path(path: str, root: str | None) -> int:
    """An O_PATH fd (opening nothing: no FIFO, device or FUSE open is triggered)."""
    if root is None:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    if not path.startswith(root):
        raise ValueError(f"{path!r} is not under the root {root!r}")
    rel = path[len(root) :]
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if openat2_available():
            return _openat2(rootfd, rel.lstrip("/") or ".", os.O_PATH | os.O_CLOEXEC)
        return _walk_in_root(rootfd, rel)
    finally:
        os.close(rootfd)


def stat_source(path: str, root: str | None = None) -> os.stat_result:
    """stat() of `path` resolved inside `root` (`path` starts with it; None: the host)."""
    fd = _open_path(path, root)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def open_source(path: str, root: str | None = None) -> int:
    """A read-only, non-blocking fd of the regular file `path` names inside `root`.

    Raises NotRegularFile for anything else (checked on the O_PATH fd before any
    open that could block or have a device's side effects), OSError when it cannot
    be resolved inside the root."""
    pfd = _open_path(path, root)
    try:
        st = os.fstat(pfd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", path)
        # reopen the very inode the O_PATH fd holds (no second path resolution)
        fd = os.open(
            f"/proc/self/fd/{pfd}",
            os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
        )
    finally:
        os.close(pfd)
    st2 = os.fstat(fd)
    if not stat.S_ISREG(st2.st_mode) or (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, "not a regular file", path)
    return fd


def _read_fd(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _decode(data: bytes) -> str:
    if len(data) > MAX_SOURCE_BYTES:
        raise ValueError(f"larger than {MAX_SOURCE_BYTES} bytes")
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding)


def read_source(path: Path, root: str | None = None) -> str:
    """A Python source file's text, honouring its coding cookie; raises OSError (also
    NotRegularFile) or ValueError (too large, bad encoding)."""
    fd = open_source(str(path), root)
    try:
        data = _read_fd(fd, MAX_SOURCE_BYTES)
    finally:
        os.close(fd)
    return _decode(data)


def _is_regular_in_root(path: str, root: str | None) -> bool:
    try:
        return stat.S_ISREG(stat_source(path, root).st_mode)
    except (OSError, ValueError):
        return False


def package_of(path: Path, root: str | None = None) -> str | None:
    """The dotted package a source file belongs to, from `__init__.py` files above it
    (looked up inside `root` when given)."""
    parts: list[str] = []
    d = path.parent
    stop = len(root) if root is not None else 0
    while d.name and len(str(d)) > stop and len(parts) < 32:
        if not _is_regular_in_root(str(d / "__init__.py"), root):
            break
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


# --------------------------------------------------------------------------- index


@dataclass(frozen=True)
class CallSite:
    name: str  # resolved dotted name, "()" marks a call result
    method: str | None  # attribute name for `x.m(...)`, else None
    imported: bool  # the name's root is bound by an import
    lineno: int
    end_lineno: int
    receiver: bool = False  # the object another call is made on: `Pickler(f)` in `.dump(x)`
    nested: bool = False  # inside a comprehension/generator/lambda (its own frame <3.12)
    # every argument is a constant, a plain name or an attribute of an imported name:
    # evaluating them runs no Python function (no property, __getitem__, operator)
    plain_args: bool = False


@dataclass(frozen=True)
class LineCalls:
    """Every call whose source span includes one line, innermost scope's bindings applied."""

    calls: tuple[CallSite, ...]
    comprehension: bool  # a comprehension/generator also runs on this line
    # a call on the line has a name too deep to resolve (MAX_NAME_PARTS): what the
    # line calls is not known
    unresolved: bool = False


_Binding = tuple[str, bool]  # (dotted name, imported)
# A name expression reduced to what resolution needs: the base identifier (None when
# the base is not a plain name: `x[0].f`) and the steps applied to it, innermost
# first: an attribute name, or "" for a call. _TOO_DEEP: more than MAX_NAME_PARTS.
_Chain = tuple[str | None, tuple[str, ...]]
_TOO_DEEP: _Chain = (None, ("<too deep>",))


def _chain(expr: ast.expr) -> _Chain | None:
    """The chain of a Name/Attribute/Call expression; None for other expressions."""
    steps: list[str] = []
    e = expr
    while True:
        if isinstance(e, ast.Name):
            base: str | None = e.id
            break
        if isinstance(e, ast.Attribute):
            steps.append(e.attr)
            e = e.value
        elif isinstance(e, ast.Call):
            steps.append("")
            e = e.func
        else:
            if not steps:
                return None
            base = None
            break
        if len(steps) > MAX_NAME_PARTS:
            return _TOO_DEEP
    steps.reverse()
    return base, tuple(steps)


def _apply(chain: _Chain, lookup: Callable[[str], _Binding | None]) -> _Binding | None:
    """Resolve a chain: exactly what resolving the expression recursively gives (an
    attribute of an unknown base is `?.attr`, a call of an unknown base unknown)."""
    base, steps = chain
    cur: _Binding | None = None
    if base is not None:
        cur = lookup(base) or (base, False)
    for step in steps:
        if step:
            cur = ("?." + step, False) if cur is None else (f"{cur[0]}.{step}", cur[1])
        elif cur is not None:
            cur = (cur[0] + "()", cur[1])
    return cur


class _Scope:
    __slots__ = ("start", "end", "bindings", "parent", "depth", "klass")

    def __init__(self, node: ast.AST | None, start: int, end: int, parent: _Scope | None) -> None:
        self.start = start
        self.end = end
        self.bindings: dict[str, _Binding] = {}
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
    the genuine error). tests/test_callsite_prefilter.py compares the trees.
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


def _arg_chains(call: ast.Call) -> tuple[_Chain, ...] | None:
    """The chains of a call's name and attribute arguments (constants dropped); None
    when an argument is anything else (a call, subscript, operator: it may run Python)."""
    exprs = [a.value if isinstance(a, ast.Starred) else a for a in call.args]
    exprs += [k.value for k in call.keywords]
    chains = []
    for e in exprs:
        if isinstance(e, ast.Constant):
            continue
        if not isinstance(e, (ast.Name, ast.Attribute)):
            return None
        chain = _chain(e)
        if chain is None or chain is _TOO_DEEP or chain[0] is None:
            return None
        chains.append(chain)
    return tuple(chains)


class _CallRec:
    """What the index keeps of one call (the syntax tree itself is dropped)."""

    __slots__ = ("lineno", "end", "func", "method", "receiver", "nested", "args")

    def __init__(
        self,
        lineno: int,
        end: int,
        func: _Chain | None,
        method: str | None,
        receiver: bool,
        nested: bool,
        args: tuple[_Chain, ...] | None,
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
    syntax-tree nodes visited, name lookups, line entries; tests/test_hostile_sources.py
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
                        _chain(node.func),
                        node.func.attr if isinstance(node.func, ast.Attribute) else None,
                        id(node) in receivers,
                        inner,
                        _arg_chains(node),
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
    def tree(self) -> ast.Module:
        """The file's syntax tree (parsed again: the index does not keep it)."""
        return parse_source(self._text, self._filename)

    def _lookup(
        self, scope: _Scope, name: str, *, own: dict[str, _Binding] | None
    ) -> _Binding | None:
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

        def lookup(name: str) -> _Binding | None:
            # what `{**env(parent), **bindings}` held: bindings so far, then the parent's
            # view (the parent itself included even when it is a class body)
            if name in bindings:
                return bindings[name]
            return self._lookup(parent, name, own=None) if parent is not None else None

        def value_of(expr: ast.expr) -> _Binding | None:
            chain = _chain(expr)
            if chain is None or chain is _TOO_DEEP:
                return None
            self._steps += len(chain[1]) + 1
            return _apply(chain, lookup)

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

        def lookup(name: str) -> _Binding | None:
            return self._lookup(scope, name, own=None)

        for k in sorted(self._call_cover.at(line)):
            c = self._calls[k]
            if c.func is _TOO_DEEP:
                unresolved = True
                continue
            resolved = _apply(c.func, lookup) if c.func is not None else None
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
                    plain_args=c.args is not None and all(_plain(a, lookup) for a in c.args),
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


def _plain(chain: _Chain, lookup: Callable[[str], _Binding | None]) -> bool:
    """A local name, or an attribute of an imported one (a module's, a class's)."""
    if not chain[1]:
        return True
    resolved = _apply(chain, lookup)
    return resolved is not None and resolved[1]


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


# --------------------------------------------------------------------------- loading

_Ident = tuple[int, int, int, int]  # (st_dev, st_ino, mtime_ns, size): one file version


@dataclass
class _Loaded:
    """What one load found (on a loader thread)."""

    key: tuple[int, int] | None  # (mtime_ns, size); None when the file could not be opened
    index: SourceIndex | None = None
    error: str | None = None
    filtered: bool = False  # read, and the prefilter found no possible match
    parsed: bool = False  # this load built the index
    shared: bool = False  # the index was built by another load or cache
    too_costly: bool = False


# Parsed files shared by every SourceCache in the process, keyed by the file's identity
# and version. Targets' frames name their files through /proc/<pid>/root, so each
# process of a job, and each restart, is a new path to the same inode, and the daemon
# keeps one classifier (one SourceCache) per concurrent window: without this, one file
# would be parsed once per (process, classifier) pair and the daemon's RSS would grow
# as processes come and go (docs/daemon.md). Weak values: an index lives as long as
# some cache holds it.
_SHARED: weakref.WeakValueDictionary[_Ident, SourceIndex] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()
# Versions being indexed now: a second load of one waits for the first (one parse).
_INDEXING: dict[_Ident, Future[SourceIndex]] = {}
# Versions given up as too costly (bounded: oldest forgotten first).
_GIVEN_UP: OrderedDict[_Ident, str] = OrderedDict()
_GIVEN_UP_MAX = 4096
# Loader threads running, in all and per root.
_LOADS_RUNNING: dict[str | None, int] = {}


def _index_once(
    ident: _Ident, text: str, path: str, package: str | None, started: float
) -> tuple[SourceIndex, bool]:
    """(index, built here) for one file version; raises what indexing raised."""
    with _SHARED_LOCK:
        index = _SHARED.get(ident)
        if index is not None:
            return index, False
        pending = _INDEXING.get(ident)
        if pending is None:
            pending = _INDEXING[ident] = Future()
            mine = True
        else:
            mine = False
    if not mine:
        return pending.result(), False  # on a loader thread: bounded by the CPU budget
    try:
        index = SourceIndex(text, path, package, cpu_started=started)
    except BaseException as exc:
        with _SHARED_LOCK:
            del _INDEXING[ident]
            if isinstance(exc, SourceTooCostly):
                _GIVEN_UP[ident] = str(exc)
                while len(_GIVEN_UP) > _GIVEN_UP_MAX:
                    _GIVEN_UP.popitem(last=False)
        pending.set_exception(exc)
        raise
    with _SHARED_LOCK:
        index = _SHARED.setdefault(ident, index)
        del _INDEXING[ident]
    pending.set_result(index)
    return index, True


def _load(path: str, root: str | None, prefilter: CallsitePrefilter | None) -> _Loaded:
    """Open, read, prefilter and index one file (runs on a loader thread)."""
    started = time.thread_time()
    try:
        fd = open_source(path, root)
    except (OSError, ValueError) as exc:
        return _Loaded(None, error=f"source not readable: {_reason(exc)}")
    try:
        st = os.fstat(fd)
        key = (st.st_mtime_ns, st.st_size)
        ident = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        with _SHARED_LOCK:
            index = _SHARED.get(ident)
            given_up = _GIVEN_UP.get(ident)
        if index is not None:
            return _Loaded(key, index, shared=True)
        if given_up is not None:
            return _Loaded(key, error=given_up, too_costly=True)
        data = _read_fd(fd, MAX_SOURCE_BYTES)
    except OSError as exc:
        return _Loaded(None, error=f"source not readable: {_reason(exc)}")
    finally:
        os.close(fd)
    try:
        text = _decode(data)
        package = package_of(Path(path), root)
        if prefilter is not None and not prefilter.may_match(text, package):
            return _Loaded(key, filtered=True)
        index, built = _index_once(ident, text, path, package, started)
        return _Loaded(key, index, parsed=built, shared=not built)
    except SourceTooCostly as exc:
        return _Loaded(key, error=str(exc), too_costly=True)
    except (OSError, ValueError, SyntaxError, RecursionError, MemoryError) as exc:
        return _Loaded(key, error=f"source not parsed: {type(exc).__name__}: {exc}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


def _start_load(
    path: str, root: str | None, prefilter: CallsitePrefilter | None
) -> Future[_Loaded] | None:
    """A load on its own thread; None when MAX_LOADS (or MAX_LOADS_PER_ROOT) run."""
    with _SHARED_LOCK:
        running = sum(_LOADS_RUNNING.values())
        if running >= MAX_LOADS or _LOADS_RUNNING.get(root, 0) >= MAX_LOADS_PER_ROOT:
            return None
        _LOADS_RUNNING[root] = _LOADS_RUNNING.get(root, 0) + 1
    future: Future[_Loaded] = Future()

    def run() -> None:
        try:
            future.set_result(_load(path, root, prefilter))
        except BaseException as exc:  # handed to the waiter, never lost
            future.set_exception(exc)
        finally:
            with _SHARED_LOCK:
                _LOADS_RUNNING[root] -= 1
                if not _LOADS_RUNNING[root]:
                    del _LOADS_RUNNING[root]

    threading.Thread(target=run, name="serwatt-source-load", daemon=True).start()
    return future


@dataclass
class _Entry:
    key: tuple[int, int] | None  # (mtime_ns, size); None when the file could not be stat'ed
    index: SourceIndex | None
    error: str | None
    checked_at: float
    # the prefilter read the text and found no possible call-site match: not parsed
    filtered: bool = False


class SourceCache:
    """Parsed sources keyed by path, revalidated by (mtime, size) at most every `stat_ttl_s`.

    A file already parsed by any cache in the process (same inode and version) is
    reused, not parsed again (`shared_hits`).

    `generation` increases whenever a cached file changes, so callers that memoize
    results derived from sources know to drop them.

    Loads run on loader threads; `get` waits for one at most SOURCE_WAIT_S (a load
    running longer is not waited on again) and never past its `deadline`. A source
    not loaded by then is NOT_READY (`not_ready` counts those answers) and asked
    again next time. Not thread-safe: one per sampling thread.
    """

    def __init__(self, *, max_files: int = 2048, stat_ttl_s: float = 2.0) -> None:
        self.max_files = max_files
        self.stat_ttl_s = stat_ttl_s
        self.generation = 0
        self.sweeps = 0
        self.parses = 0
        self.filtered = 0  # files the prefilter read and did not parse
        self.shared_hits = 0  # files another path or cache had parsed already
        self.not_ready = 0  # answers NOT_READY: the load was not waited for
        self.too_costly = 0  # files given up past the CPU budget
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._roots: dict[str, str | None] = {}  # path -> the root it resolves in
        self._pending: dict[tuple[str, bool], tuple[Future[_Loaded], float]] = {}
        self._last_sweep = time.monotonic()

    @staticmethod
    def _stat_key(path: str, root: str | None) -> tuple[int, int] | None:
        try:
            st = stat_source(path, root)
        except (OSError, ValueError):
            return None
        return (st.st_mtime_ns, st.st_size)

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
            if self._stat_key(path, self._roots.get(path)) != entry.key:
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
            self._roots.pop(p, None)
        for slot in [k for k in self._pending if k[0].startswith(prefix)]:
            del self._pending[slot]  # its load may finish; nobody takes its answer
        if gone:
            self.generation += 1

    def get(
        self,
        path: str,
        prefilter: CallsitePrefilter | None = None,
        *,
        root: str | None = None,
        deadline: float | None = None,
    ) -> tuple[SourceIndex | None, str | None, int | None]:
        """(index, error, mtime_ns) for one path; the error says why there is no index.

        `root`: `path` starts with it and resolves inside it (a target's
        /proc/<pid>/root); None reads host paths. With `prefilter`, a file whose text
        cannot hold a call-site match is not parsed: (None, None, mtime_ns); without
        it, such a file is parsed now. `deadline` (time.monotonic()): not waited on
        past it; error NOT_READY then.
        """
        entry = self._entries.get(path)
        if entry is not None and not (entry.filtered and prefilter is None):
            self._entries.move_to_end(path)
            return entry.index, entry.error, entry.key[0] if entry.key else None
        slot = (path, prefilter is None)
        pending = self._pending.get(slot)
        if pending is None:
            future = _start_load(path, root, prefilter)
            if future is None:
                self.not_ready += 1
                return None, NOT_READY, None
            pending = self._pending[slot] = (future, time.monotonic())
        future, started = pending
        now = time.monotonic()
        wait = SOURCE_WAIT_S - (now - started)
        if deadline is not None:
            wait = min(wait, deadline - now)
        try:
            loaded = future.result(timeout=max(0.0, wait))
        except FutureTimeout:
            self.not_ready += 1
            return None, NOT_READY, None
        finally:
            if future.done():
                del self._pending[slot]
        self.parses += loaded.parsed
        self.shared_hits += loaded.shared
        self.filtered += loaded.filtered
        self.too_costly += loaded.too_costly
        self._entries[path] = _Entry(
            loaded.key, loaded.index, loaded.error, time.monotonic(), loaded.filtered
        )
        self._roots[path] = root
        self._entries.move_to_end(path)
        if len(self._entries) > self.max_files:
            old, _ = self._entries.popitem(last=False)
            self._roots.pop(old, None)
        return loaded.index, loaded.error, loaded.key[0] if loaded.key else None
