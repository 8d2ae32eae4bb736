"""`serwatt ab --swap torch`: torch.save and torch.load routed through `.many`'s drop-in
(profiler.many.torch_compat) in a job that is not changed.

Python imports a module named `sitecustomize` at start-up from the first sys.path entry that
holds one; `serwatt ab` puts this file's directory first on PYTHONPATH, and PYTHONPATH is
inherited, so the job's Python children get the swap too. It acts only while
SERWATT_SWAP=torch is set, so a PYTHONPATH copied elsewhere changes nothing.

- The job's own `sitecustomize` (a venv's, a distribution's) would be hidden by this one, so
  the next one on sys.path is found and run first, under its own name.
- torch is not imported here (seconds, and a job that never uses it should not pay): a
  finder on sys.meta_path patches torch.save and torch.load the moment `torch` has been
  imported, before the job's code sees the module.
- The drop-in is serwatt's own code, loaded from serwatt's tree (SERWATT_ROOT) and never
  looked up on the job's path: the job's interpreter usually cannot import serwatt (its own
  venv), and a module of the job's own named `profiler` must not be taken for it (nor
  shadowed: serwatt's top-level package is taken out of sys.modules once loaded; the
  drop-in's modules stay under their names). Its third-party imports (numpy, blake3) come
  from the job's environment; when they, or anything else, fail, the swap does not apply in
  that process: one warning on stderr, torch left as it is, and the A/B refuses (the log).
- Per file: what `.many` can store (tensors, numpy arrays, JSON scalars in dicts, lists and
  tuples) is written as `.many`; anything else (a pickled object: TrainingArguments, an
  LR scheduler's lambdas) goes to the original torch.save, unchanged. torch.load reads a
  `.many` file with the drop-in and hands the original torch.load only files this job
  itself wrote through that fallback (by device, inode, size and mtime, from the log):
  the swap opens no unpickling path the job did not already have, and a torch.save file
  it did not write stays refused.
- SERWATT_SWAP_LOG names a file each process appends JSON lines to: whether the swap
  applied, and each save (its file, bytes, and where it went); `serwatt ab` reads it to
  say what was compared, and a resumed run reads it for the files it may hand back.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import stat
import sys
from types import ModuleType
from typing import Any

ENV = "SERWATT_SWAP"
LOG_ENV = "SERWATT_SWAP_LOG"
HERE = os.path.dirname(os.path.abspath(__file__))
SERWATT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
if os.path.isfile(os.path.join(SERWATT_ROOT, "__init__.py")):  # installed: .../serwatt/
    SERWATT_ROOT = os.path.dirname(SERWATT_ROOT)
NEXT = "_serwatt_next_sitecustomize"
MARK = "_serwatt_swapped"  # set on torch once patched: a second finder pass is a no-op
PACKAGE = "serwatt"  # serwatt's top-level package
MAGIC = b"\x89MANY\r\n\x1a"  # profiler/many/FORMAT.md; checked against the format module
MAX_LOG_BYTES = 16 << 20  # of the log read back: a line per save

_torch_written: set[tuple[int, int, int | None, int | None]] = set()


def _run_next_sitecustomize() -> None:
    """Run the `sitecustomize` this file hides: the first one on sys.path after HERE."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[NEXT] = module  # under a name of its own: `sitecustomize` is this file
    spec.loader.exec_module(module)


def _log(event: dict[str, Any]) -> None:
    """One JSON line appended to the log (one write of a short line: lines of processes
    writing at once do not interleave). Nothing when there is no log or it cannot be
    written: the job is never failed for it."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    line = json.dumps({"pid": os.getpid(), **event}) + "\n"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError:
        pass


class _OwnPackage(importlib.abc.MetaPathFinder):
    """Finds serwatt's top-level package in SERWATT_ROOT only (its submodules are found
    through the package's own __path__, so also there)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != PACKAGE:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [SERWATT_ROOT])


def _ours(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def _load_compat() -> ModuleType:
    """serwatt.profiler.many.torch_compat from SERWATT_ROOT (module docstring). Raises whatever the
    import raises; sys.modules keeps any `serwatt` of the job's either way."""
    name = f"{PACKAGE}.profiler.many.torch_compat"
    if name in sys.modules:
        return sys.modules[name]
    theirs = {k: sys.modules.pop(k) for k in list(sys.modules) if _ours(k)}
    finder = _OwnPackage()
    sys.meta_path.insert(0, finder)
    try:
        module = importlib.import_module(name)
    except BaseException:
        for k in [k for k in sys.modules if _ours(k)]:
            del sys.modules[k]
        raise
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop(PACKAGE, None)
        sys.modules.update(theirs)
    return module


def _identity(f: Any) -> tuple[int, int, int | None, int | None] | None:
    """(device, inode, size, mtime_ns) of a path, (device, inode, None, None) of an open
    file object (its size may still change); None when neither can be had."""
    try:
        if isinstance(f, str | bytes | os.PathLike):
            info = os.stat(f)
            return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
        info = os.fstat(f.fileno())
        return (info.st_dev, info.st_ino, None, None)
    except (OSError, AttributeError, ValueError, TypeError):
        return None


def _written_by_this_job(f: Any) -> bool:
    got = _identity(f)
    if got is None:
        return False
    return got in _torch_written or (got[0], got[1], None, None) in _torch_written


def _read_log() -> None:
    """The files earlier processes of this run (or the run this one resumes) wrote through
    the fallback, from the log."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        data = os.read(fd, MAX_LOG_BYTES)
    finally:
        os.close(fd)
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            ev = json.loads(line)
            if ev.get("event") == "save" and ev.get("to") == "torch" and ev.get("identity"):
                dev, ino, size, mtime = ev["identity"]
                _torch_written.add((int(dev), int(ino), size, mtime))
        except (ValueError, TypeError, AttributeError):
            continue


def _shown(f: Any) -> str | None:
    if isinstance(f, str | os.PathLike):
        return os.path.abspath(os.fspath(f))
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else None


def _size(f: Any) -> int | None:
    got = _identity(f)
    if got is not None and got[2] is not None:
        return got[2]
    try:
        return int(f.tell())
    except (AttributeError, OSError, ValueError):
        return None


def _head(f: Any) -> bytes:
    """The first bytes of a path, or of a seekable file object from its position (put
    back); b"" when they cannot be had."""
    try:
        if isinstance(f, str | bytes | os.PathLike):
            fd = os.open(f, os.O_RDONLY | os.O_NONBLOCK)
            try:
                return os.pread(fd, len(MAGIC), 0)
            finally:
                os.close(fd)
        pos = f.tell()
        head = f.read(len(MAGIC))
        f.seek(pos)
        return bytes(head)
    except (OSError, AttributeError, ValueError, TypeError):
        return b""


def _routed(torch: ModuleType, compat: ModuleType) -> tuple[Any, Any]:
    original_save, original_load = torch.save, torch.load

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            compat.save(obj, f, *args, **kwargs)
        except (TypeError, ValueError) as exc:
            # what .many cannot store (checked before a byte is written): torch's own
            original_save(obj, f, *args, **kwargs)
            ident = _identity(f)
            if ident is not None:
                _torch_written.add(ident)
            why = f"{type(exc).__name__}: {exc}"[:300]
            _log(
                {"event": "save", "to": "torch", "path": _shown(f), "bytes": _size(f),
                 "identity": list(ident) if ident else None, "why": why}
            )  # fmt: skip
            return None
        _log({"event": "save", "to": "many", "path": _shown(f), "bytes": _size(f)})
        return None

    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        if _head(f) != MAGIC and _written_by_this_job(f):
            return original_load(f, *args, **kwargs)
        return compat.load(f, *args, **kwargs)  # .many, or refused with the reason

    save.__module__ = load.__module__ = compat.__name__
    save.__doc__, load.__doc__ = compat.save.__doc__, compat.load.__doc__
    return save, load


def _patch(torch: ModuleType) -> None:
    if getattr(torch, MARK, False):
        return
    setattr(torch, MARK, True)  # noqa: B010 (torch is a ModuleType to mypy)
    try:
        compat = _load_compat()
        from_format = sys.modules[f"{PACKAGE}.profiler.many.format"].MAGIC
        if from_format != MAGIC:
            raise ImportError(f"the .many magic is {from_format!r}, this file expects {MAGIC!r}")
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"[:300]
        print(
            f"serwatt --swap torch: NOT applied in process {os.getpid()} ({sys.executable}): "
            f"cannot load serwatt's .many drop-in from {SERWATT_ROOT}: {why}; torch.save "
            "and torch.load are left as they are (install numpy and blake3 into the job's "
            "environment, or run the job with serwatt's interpreter)",
            file=sys.stderr,
            flush=True,
        )
        _log({"event": "not_applied", "python": sys.executable, "why": why})
        return
    _read_log()
    save, load = _routed(torch, compat)
    setattr(torch, "save", save)  # noqa: B010
    setattr(torch, "load", load)  # noqa: B010
    _log({"event": "applied", "python": sys.executable})


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _patch(module)


class _TorchFinder(importlib.abc.MetaPathFinder):
    """Finds `torch` with the other finders and wraps its loader so it is patched on import."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    if "torch" in sys.modules:
        _patch(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchFinder())


_run_next_sitecustomize()
if os.environ.get(ENV) == "torch":
    install()
