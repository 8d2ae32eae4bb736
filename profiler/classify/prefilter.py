"""The call-site prefilter: whether a file's text alone can hold a call-site rule's match.

A file whose words cannot form any rule's name is not parsed at all (`ast.parse` of a
large library file costs 0.1-0.5 s of CPU with the GIL held). The test is conservative:
a "maybe" is parsed, a "no" is certain. tests/classify/test_callsite_prefilter.py checks it
against parsing every file; docs/classification.md describes it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable

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

    def __init__(
        self,
        calls: Iterable[str],
        methods: Callable[[str], bool],
        *,
        fingerprint: str | None = None,
    ) -> None:
        """fingerprint: text that changes whenever `calls` or `methods` match differently
        (the rules' patterns); the on-disk store keeps "no match" verdicts under it. None:
        they are not stored."""
        self.method_match = methods
        self.fingerprint = fingerprint
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
