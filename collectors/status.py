"""Whether a collector can read its signal: the one status shape every probe returns.

Missing hardware is a value, not an exception: a probe says `up`, or why not as a
short `reason` code (a label value: "no_powercap", "permission", "off", ...) and a
`detail` sentence that names the fix. Collectors with more to say about a healthy
probe (RAPL zones, NVML GPUs) extend this type with their own fields.
"""

from __future__ import annotations

from dataclasses import dataclass

REASON_OFF = "off"  # the operator set the source off (its config mode)


@dataclass(frozen=True)
class CollectorStatus:
    up: bool
    reason: str | None = None  # None when up
    detail: str | None = None  # a sentence for the operator; the fix when down
