"""The on-disk source store: what indexing a source file's contents found, kept across runs.

Every `serwatt profile` is a new process, and a torch job's stacks name about a thousand
files (the import of torch alone walks hundreds): reading, prefiltering and parsing them
cost each run 4.1 s of CPU on the 2-vCPU VM, beside the job (docs/classification.md
"Cost"). The facts are a function of the file's bytes, its package (relative imports) and
serwatt's own indexing code, so they are stored under a key hashed from exactly those:

- `<key>.index.json`: the file's call-site table, each line's LineCalls (SourceIndex.line_table),
  read back as a StoredIndex, which answers `calls_at` as the SourceIndex did;
- `<key>.<prefilter>.none`: an empty file saying the prefilter, with these rules, found no
  possible call-site match in the file (nothing to parse).

A changed file is a new key, an upgraded serwatt (its indexing code hashed into every key)
misses every old entry, so nothing is ever invalidated, only pruned (oldest first, past
MAX_ENTRIES). The store is root's when serwatt runs as root: its directory must be writable
by nobody else (not even a sticky /tmp: another user could create an entry's name first),
entries are written through safeio's writer and read through its bounded open, links never
followed, and an entry that is not exactly what serwatt writes is a miss, never an error.
A file given up as too costly is not stored: whether it is depends on the machine's load.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import blake3

from serwatt.profiler import safeio
from serwatt.profiler.classify import callsite, prefilter, source_index
from serwatt.profiler.classify.callsite import CallSite, LineCalls
from serwatt.profiler.classify.source_index import SourceIndex

FORMAT = "serwatt.source-index/1"
# Entries kept; past it, opening the store removes the oldest written until half remain.
# A torch job's run writes about 520 (36 tables, the rest empty markers).
MAX_ENTRIES = 20_000
# The largest table written or read (the largest torch file's is about 0.6 MB).
MAX_ENTRY_BYTES = 8 * 1024 * 1024
# A line table lists every call once per line it spans: over this many entries per call
# (plus a constant), deep multi-line calls would make it quadratic, so it is not stored.
TABLE_ENTRIES_PER_CALL = 8
TABLE_ENTRIES_SLACK = 4096


def default_dir() -> Path:
    """/var/cache/serwatt/sources for root, else $XDG_CACHE_HOME (~/.cache)/serwatt/sources."""
    if os.geteuid() == 0:
        return Path("/var/cache/serwatt/sources")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "serwatt" / "sources"


def _code_hash(modules: Iterable[Any]) -> bytes:
    """A hash of serwatt's own code that computes what is stored: a change to it is a new key."""
    h = blake3.blake3()
    for module in modules:
        h.update(safeio.read_bounded(module.__file__, max_bytes=4 * 1024 * 1024))
    return h.digest()


class StoredIndex:
    """A file's LineCalls read from the store: `calls_at` as SourceIndex's."""

    _NONE = LineCalls((), False)

    def __init__(self, lines: dict[int, LineCalls]) -> None:
        self._lines = lines

    def calls_at(self, line: int) -> LineCalls:
        return self._lines.get(line, self._NONE)


def encode_table(package: str | None, table: dict[int, LineCalls]) -> bytes:
    sites: dict[CallSite, int] = {}
    lines = []
    for line, lc in sorted(table.items()):
        ids = [sites.setdefault(c, len(sites)) for c in lc.calls]
        lines.append([line, int(lc.comprehension), int(lc.unresolved), ids])
    doc = {
        "format": FORMAT,
        "package": package,
        "sites": [
            [
                c.name, c.method, int(c.imported), c.lineno, c.end_lineno,
                int(c.receiver), int(c.nested), int(c.plain_args),
            ]
            for c in sites
        ],
        "lines": lines,
    }  # fmt: skip
    return json.dumps(doc, separators=(",", ":")).encode()


def _is_int(v: object) -> bool:
    return type(v) is int and v >= 0


def _flag(v: object) -> bool:
    if v not in (0, 1) or type(v) is not int:
        raise ValueError("a flag is not 0 or 1")
    return bool(v)


def decode_table(data: bytes, package: str | None) -> dict[int, LineCalls]:
    """The table `encode_table` wrote; raises ValueError for anything else."""
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("not a source-index entry")
    if doc.get("package") != package:
        raise ValueError("another package's entry")
    raw_sites, raw_lines = doc.get("sites"), doc.get("lines")
    if not isinstance(raw_sites, list) or not isinstance(raw_lines, list):
        raise ValueError("no sites or lines")
    sites = []
    for s in raw_sites:
        if not isinstance(s, list) or len(s) != 8:
            raise ValueError("a site is not 8 fields")
        name, method, imported, lineno, end, receiver, nested, plain = s
        if not isinstance(name, str) or not (method is None or isinstance(method, str)):
            raise ValueError("a site's name is not text")
        if not (_is_int(lineno) and _is_int(end)):
            raise ValueError("a site's lines are not counts")
        sites.append(
            CallSite(
                name, method, _flag(imported), lineno, end,
                receiver=_flag(receiver), nested=_flag(nested), plain_args=_flag(plain),
            )
        )  # fmt: skip
    table: dict[int, LineCalls] = {}
    for entry in raw_lines:
        if not isinstance(entry, list) or len(entry) != 4:
            raise ValueError("a line is not 4 fields")
        line, comp, unresolved, ids = entry
        if not _is_int(line) or not isinstance(ids, list):
            raise ValueError("a line's number or calls are malformed")
        if not all(_is_int(i) and i < len(sites) for i in ids):
            raise ValueError("a line names a site that is not there")
        table[line] = LineCalls(tuple(sites[i] for i in ids), _flag(comp), _flag(unresolved))
    return table


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _make_dirs(directory: Path) -> None:
    """mkdir -p, 0700, each new directory made only in a parent safeio's walk checked (no
    link another user could have planted on the way), so a planted link never leads root's
    mkdir elsewhere. Raises UnsafePathError or OSError."""
    missing: list[str] = []
    at = Path(os.path.abspath(directory))
    while not at.exists() and at != at.parent:
        missing.append(at.name)
        at = at.parent
    for name in reversed(missing):
        safeio.check_output_path(at / name)
        try:
            os.mkdir(at / name, 0o700)
        except FileExistsError:
            pass  # made meanwhile (another serwatt): the walk checks it next
        at = at / name


class SourceStore:
    """One store directory. Thread-safe: loader threads read and write it at once.

    `problem` says why the store stopped being used (its directory unsafe or unwritable),
    once; classification goes on without it. Counters: `hits`, `misses`, `written`, `bad`
    (entries that were not what serwatt writes, read as misses).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.problem: str | None = None
        self.hits = self.misses = self.written = self.bad = 0
        self._lock = threading.Lock()
        self._salt = self._filter_salt = b""
        # one process writes at most half the store: a target that makes new source files
        # for as long as it runs cannot fill the disk through one serwatt
        self._writes_left = MAX_ENTRIES // 2

    @classmethod
    def open(cls, directory: Path) -> SourceStore:
        """The store at `directory`, made (0700) if missing and pruned past MAX_ENTRIES. One
        that cannot be used has `problem` set and answers every lookup with a miss."""
        store = cls(directory)
        store._prepare()
        return store

    def _disable(self, why: str) -> None:
        with self._lock:
            if self.problem is None:
                self.problem = f"source store {self.directory}: {why}; files are indexed anew"

    def _prepare(self) -> None:
        try:
            self._salt = _code_hash((callsite, source_index))
            self._filter_salt = _code_hash((prefilter,))
        except (OSError, ValueError) as exc:  # serwatt installed without its .py sources
            self._disable(f"cannot hash serwatt's own indexing code ({exc})")
            return
        try:
            _make_dirs(self.directory)
            safeio.check_output_path(self.directory / "probe")
            info = os.stat(self.directory, follow_symlinks=False)
        except OSError as exc:
            self._disable(str(exc) if isinstance(exc, safeio.UnsafePathError) else _why(exc))
            return
        if not stat.S_ISDIR(info.st_mode):
            self._disable("not a directory")
        elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            # a sticky bit is not enough here: another user could create an entry's name
            self._disable("other users can write it (give a directory only you can write)")
        else:
            self._prune()

    def _prune(self) -> None:
        try:
            with os.scandir(self.directory) as it:
                entries = [e for e in it if e.name.endswith((".json", ".none"))]
            if len(entries) <= MAX_ENTRIES:
                return
            aged = sorted(entries, key=lambda e: e.stat(follow_symlinks=False).st_mtime_ns)
            for e in aged[: len(entries) - MAX_ENTRIES // 2]:
                try:
                    os.unlink(e.path)
                except FileNotFoundError:
                    pass  # another serwatt pruned it
        except OSError as exc:
            self._disable(f"cannot prune it: {_why(exc)}")

    # -- entries -------------------------------------------------------------------

    def entry(self, data: bytes, package: str | None, fingerprint: str | None) -> StoreEntry:
        """What the store holds, or will, for one file version: its bytes, its package,
        serwatt's indexing code; and, for a no-match marker, the prefilter's `fingerprint`
        (its rules; None: no marker is read or written)."""
        h = blake3.blake3(self._salt)
        h.update((package or "").encode() + b"\0")
        h.update(data)
        tag = None
        if fingerprint is not None:
            tag = blake3.blake3(self._filter_salt + fingerprint.encode()).hexdigest()[:16]
        return StoreEntry(self, h.hexdigest()[:48], package, tag)

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)

    def _read_index(self, key: str, package: str | None) -> StoredIndex | None:
        if self.problem is not None:
            return None
        path = self.directory / f"{key}.index.json"
        try:
            data = safeio.read_bounded(path, max_bytes=MAX_ENTRY_BYTES, follow_links=False)
        except safeio.InputFileError as exc:
            if exc.problem != safeio.NO_SUCH_FILE:
                self._count("bad")
            self._count("misses")
            return None
        try:
            table = decode_table(data, package)
        except (ValueError, TypeError, RecursionError):
            self._count("bad")  # a short file a crash left, or not ours: indexed anew
            self._count("misses")
            return None
        self._count("hits")
        return StoredIndex(table)

    def _has_marker(self, name: str) -> bool:
        if self.problem is not None:
            return False
        try:
            info = os.stat(self.directory / name, follow_symlinks=False)
        except OSError:
            return False
        ours = stat.S_ISREG(info.st_mode) and info.st_uid in (os.geteuid(), 0)
        self._count("hits" if ours else "bad")
        return ours

    def _write(self, name: str, data: bytes) -> None:
        with self._lock:
            if self.problem is not None or self._writes_left <= 0:
                return
            self._writes_left -= 1
        try:
            safeio.write_bytes(self.directory / name, data, mode=0o600, durable=False)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return  # pruned away under us by another serwatt: a later write remakes it
            self._disable(f"cannot write to it: {_why(exc)}")
            return
        self._count("written")


class StoreEntry:
    """One file version's place in a SourceStore."""

    def __init__(self, store: SourceStore, key: str, package: str | None, tag: str | None):
        self.store, self.key, self.package, self.tag = store, key, package, tag

    def no_match(self) -> bool:
        """The prefilter, with these rules, found no possible call-site match here before."""
        return self.tag is not None and self.store._has_marker(f"{self.key}.{self.tag}.none")

    def index(self) -> StoredIndex | None:
        return self.store._read_index(self.key, self.package)

    def put_no_match(self) -> None:
        if self.tag is not None:
            self.store._write(f"{self.key}.{self.tag}.none", b"")

    def put_index(self, index: SourceIndex) -> None:
        table = index.line_table(TABLE_ENTRIES_PER_CALL * index.call_count + TABLE_ENTRIES_SLACK)
        if table is None:
            return
        data = encode_table(self.package, table)
        if len(data) <= MAX_ENTRY_BYTES:
            self.store._write(f"{self.key}.index.json", data)
