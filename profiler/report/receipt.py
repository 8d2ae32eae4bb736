"""Receipts: `rcpt_<hex>` ties a report to exactly the inputs it was computed from.

The receipt is BLAKE3 (256-bit, hex) over the UTF-8 bytes of a canonical JSON form of
every input the report used:

    {"schema": "serwatt.receipt/1",
     "baseline": [RUN, ...], "candidate": [RUN, ...]}     (runs in the report's order)

where RUN is the run's every field (run_id, host, serwatt_version, rate_hz, sources,
started_at, ended_at, restore_s, energy_reason), its windows in time order with every
field and every codepath's figures, and its episodes in time order (null for a record
without episodes), and its stacks where it has them (a field marked `omit-default`
is left out while it holds its default, so a run recorded before the field existed
keeps its receipt). Canonical JSON: keys sorted, no whitespace (separators "," and ":"),
non-ASCII kept as UTF-8, NaN and infinities refused; floats are written by Python's
float repr (the shortest text that reads back to the same double), integers as
integers, so one value always gives one text. The input dataclasses store float fields
as floats, so a record saying `1` and one saying `1.0` give the same receipt.

A receipt proves that the inputs are the same; it does not prove who wrote them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import blake3

from serwatt.profiler.report.inputs import RunInput

RECEIPT_SCHEMA = "serwatt.receipt/1"
PREFIX = "rcpt_"


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not (
                f.metadata.get("receipt") == "omit-default" and getattr(value, f.name) == f.default
            )
        }
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def canonical(baseline: Sequence[RunInput], candidate: Sequence[RunInput]) -> bytes:
    """The canonical bytes the receipt hashes (see the module docstring)."""
    doc = {
        "schema": RECEIPT_SCHEMA,
        "baseline": [_plain(r) for r in baseline],
        "candidate": [_plain(r) for r in candidate],
    }
    text = json.dumps(
        doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


def receipt(baseline: Sequence[RunInput], candidate: Sequence[RunInput]) -> str:
    """`rcpt_` + the BLAKE3 hex digest of the canonical form."""
    return PREFIX + blake3.blake3(canonical(baseline, candidate)).hexdigest()


def verify_receipt(
    report: Mapping[str, Any], baseline: Sequence[RunInput], candidate: Sequence[RunInput]
) -> list[str]:
    """Problems with a report against the inputs it names; an empty list means the
    inputs still back every number (same runs, same order, same receipt)."""
    problems = []
    stated = report.get("receipt")
    if not isinstance(stated, str) or not stated.startswith(PREFIX):
        return [f"the report has no receipt (want {PREFIX}<hex>, got {stated!r})"]
    for side, runs in (("baseline", baseline), ("candidate", candidate)):
        named = (report.get(side) or {}).get("runs")
        given = [r.run_id for r in runs]
        if named != given:
            problems.append(f"{side} runs differ: the report names {named!r}, given {given!r}")
    recomputed = receipt(baseline, candidate)
    if recomputed != stated:
        problems.append(
            f"receipt mismatch: the report says {stated}, the inputs give {recomputed}; "
            "a record changed since the report was made"
        )
    return problems
