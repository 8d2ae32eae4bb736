"""The run record's checks: the error a damaged or unusable file raises, and the checks
every value passes on its way out of the file (and every number on its way in).

A damaged or hand-edited file may hold text in a REAL column (SQLite keeps what it is
given), a blob, or JSON of any shape. Each check raises ValueError naming the column;
Recorder._reading turns it into one RecordError naming the file and the fix
(`sqlite3 FILE .recover`), never a traceback or a wrong number.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any


class RecordError(Exception):
    """A record file that cannot be used; the message names the file and the fix."""


def _damaged(path: Path, detail: str) -> RecordError:
    detail = detail if len(detail) <= 300 else detail[:300] + "..."
    return RecordError(
        f"{path}: damaged run record: {detail}; recover what is left with "
        f"`sqlite3 {path} .recover | sqlite3 {path}.recovered` and read that file"
    )


def _shown(value: Any) -> str:
    """A value from the file, for an error line: repr (no control characters), bounded."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _number(value: Any, what: str, *, nullable: bool = False) -> float | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} is {_shown(value)}, not a number")
    if not math.isfinite(value):
        raise ValueError(f"{what} is {value}, not a finite number")
    return float(value)


def _real(value: Any, what: str) -> float:
    out = _number(value, what)
    assert out is not None
    return out


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} is {_shown(value)}, not an integer")
    return value


def _text(value: Any, what: str, *, nullable: bool = False) -> Any:
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} is {_shown(value)}, not text")
    return value


def stored_name(name: str) -> str | bytes:
    """A file name as the record keeps it: text when it is UTF-8, else its own bytes (a
    BLOB). A name is bytes; Python hands one no UTF-8 decoder reads on as text with
    surrogate escapes, which SQLite refuses, so such a name is stored as the bytes it
    stands for and `read_name` gives back the same text."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogateescape")  # raises for what no OS name holds
    return name


def read_name(value: Any, what: str) -> str:
    """A file name `stored_name` stored: the text it was given, surrogate escapes and all."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return _text(value, what)


def _json_of(value: Any, what: str, want: type, *, nullable: bool = False) -> Any:
    """Decoded JSON text of the type `want` (dict or list)."""
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{what} is {_shown(value)}, not JSON text")
    try:
        decoded = json.loads(value)
    except RecursionError:
        raise ValueError(f"{what} is JSON nested too deep to read") from None
    except ValueError as exc:
        raise ValueError(f"{what} is not JSON ({exc})") from None
    if not isinstance(decoded, want):
        kind = "an object" if want is dict else "a list"
        raise ValueError(f"{what} is JSON {type(decoded).__name__}, not {kind}")
    return decoded


def _finite(value: Any, what: str) -> float:
    f = float(value)
    if not math.isfinite(f):
        raise ValueError(f"{what} is {f}: records hold finite numbers only")
    return f


_KINDS: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"),
    "real": ((float, int), "a number"),
    "real?": ((float, int, type(None)), "a number or NULL"),
    "text": ((str,), "text"),
    "text?": ((str, type(None)), "text or NULL"),
}


def _signatures(kinds: tuple[tuple[str, str], ...]) -> frozenset[tuple[type, ...]]:
    return frozenset(itertools.product(*(_KINDS[kind][0] for _name, kind in kinds)))


def _check_row(
    row: tuple,
    kinds: tuple[tuple[str, str], ...],
    signatures: frozenset[tuple[type, ...]],
    table: str,
) -> None:
    """Every column of `row` of the SQL type its table declares (a finite number where a
    number goes; SQLite stores NaN as NULL but keeps infinities). A month-long run reads
    ~2M such values, so the common case is one set lookup of the row's types."""
    if (
        tuple(map(type, row[: len(kinds)])) in signatures
        and math.inf not in row
        and -math.inf not in row
    ):
        return
    for value, (name, kind) in zip(row, kinds, strict=False):
        types, want = _KINDS[kind]
        if type(value) not in types or (type(value) is float and not math.isfinite(value)):
            raise ValueError(f"{table} row {_shown(row[0])}: {name} is {_shown(value)}, not {want}")
