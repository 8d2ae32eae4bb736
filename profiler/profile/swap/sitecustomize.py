"""`serwatt ab --swap torch`: torch.save and torch.load replaced by `.many`'s drop-in
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
- serwatt's root is appended to sys.path, last, only when `profiler.many` is not importable
  already, so a module of the job's own that shares a name still wins.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

ENV = "SERWATT_SWAP"
HERE = os.path.dirname(os.path.abspath(__file__))
SERWATT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
NEXT = "_serwatt_next_sitecustomize"
MARK = "_serwatt_swapped"  # set on torch once patched: a second finder pass is a no-op


def _run_next_sitecustomize() -> None:
    """Run the `sitecustomize` this file hides: the first one on sys.path after HERE."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[NEXT] = module  # under a name of its own: `sitecustomize` is this file
    spec.loader.exec_module(module)


def _patch(torch: ModuleType) -> None:
    if getattr(torch, MARK, False):
        return
    if importlib.util.find_spec("profiler.many") is None and SERWATT_ROOT not in sys.path:
        sys.path.append(SERWATT_ROOT)
    from profiler.many import torch_compat

    setattr(torch, "save", torch_compat.save)  # noqa: B010 (torch is a ModuleType to mypy)
    setattr(torch, "load", torch_compat.load)  # noqa: B010
    setattr(torch, MARK, True)


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
