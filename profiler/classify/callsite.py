"""Call sites: which calls a target's source line makes, with imports resolved.

A C serializer (`_pickle`, upb protobuf, orjson, msgpack's Cython unpacker) pushes no
Python frame, so while it runs the innermost Python frame is its caller, at the line
of the call. The caller's source file is read inside the target's root
(target_files.py), parsed once per file version with `ast` (source_index.py) on
loader threads (source_cache.py), unless its text cannot hold a rule's call
(prefilter.py). The answer, per line, is a LineCalls: which calls span line L,
resolved through import aliases and simple local bindings (`import pickle as pk`,
`from pickle import loads as thaw`, `p = pickle.Pickler(f)`, `class P(pickle.Pickler)`),
and whether the line does other work too (a comprehension, a generator). This module
holds those values and the name resolution that makes them.

Names: a call's `name` is a dotted path with `()` marking a call result, e.g.
`pickle.dumps`, `pickle.Pickler().dump`, `msg.SerializeToString`; `imported` says
its root name is bound by an import (so `pickle.dumps` really is the module's).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

# A dotted name longer than this (`a.b.c...`) is not resolved: its line is `other`,
# low confidence.
MAX_NAME_PARTS = 64


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


class LineIndex(Protocol):
    """What classification asks of a source file: each line's calls (a SourceIndex, parsed
    now, or a StoredIndex, read from the on-disk store)."""

    def calls_at(self, line: int) -> LineCalls: ...


Binding = tuple[str, bool]  # (dotted name, imported)
# A name expression reduced to what resolution needs: the base identifier (None when
# the base is not a plain name: `x[0].f`) and the steps applied to it, innermost
# first: an attribute name, or "" for a call. TOO_DEEP: more than MAX_NAME_PARTS.
Chain = tuple[str | None, tuple[str, ...]]
TOO_DEEP: Chain = (None, ("<too deep>",))


def name_chain(expr: ast.expr) -> Chain | None:
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
            return TOO_DEEP
    steps.reverse()
    return base, tuple(steps)


def resolve(chain: Chain, lookup: Callable[[str], Binding | None]) -> Binding | None:
    """Resolve a chain: exactly what resolving the expression recursively gives (an
    attribute of an unknown base is `?.attr`, a call of an unknown base unknown)."""
    base, steps = chain
    cur: Binding | None = None
    if base is not None:
        cur = lookup(base) or (base, False)
    for step in steps:
        if step:
            cur = ("?." + step, False) if cur is None else (f"{cur[0]}.{step}", cur[1])
        elif cur is not None:
            cur = (cur[0] + "()", cur[1])
    return cur


def is_plain(chain: Chain, lookup: Callable[[str], Binding | None]) -> bool:
    """A local name, or an attribute of an imported one (a module's, a class's)."""
    if not chain[1]:
        return True
    resolved = resolve(chain, lookup)
    return resolved is not None and resolved[1]


def argument_chains(call: ast.Call) -> tuple[Chain, ...] | None:
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
        chain = name_chain(e)
        if chain is None or chain is TOO_DEEP or chain[0] is None:
            return None
        chains.append(chain)
    return tuple(chains)
