"""A run's `sources`: what measured its energy and which collectors could read their
signal, in the one shape both drivers record (runs.sources_json):

    {"energy": "rapl" | "model" | "unavailable: <why>",
     "collectors": {name: {"up": bool, "reason": str | None, "detail": str | None}}}

Records written before this shape hold `{"energy": ..., "<name>_up": bool,
"<name>_reason": str}` from `serwatt profile`; `sources_text` reads both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from serwatt.collectors.status import CollectorStatus


def run_sources(energy: str, status: Mapping[str, CollectorStatus]) -> dict[str, Any]:
    return {
        "energy": energy,
        "collectors": {
            name: {"up": bool(st.up), "reason": st.reason, "detail": st.detail}
            for name, st in sorted(status.items())
        },
    }


def sources_text(sources: Mapping[str, Any]) -> str:
    """One line: `energy=model; rapl down (no_powercap), cpustat up, ...`; an older
    record's flat keys as `key=value`."""
    collectors = sources.get("collectors")
    if not isinstance(collectors, Mapping):
        return ", ".join(f"{k}={v}" for k, v in sorted(sources.items())) or "none recorded"
    parts = []
    for name, st in sorted(collectors.items()):
        st = st if isinstance(st, Mapping) else {}
        reason = st.get("reason")
        state = "up" if st.get("up") else "down" + (f" ({reason})" if reason else "")
        parts.append(f"{name} {state}")
    energy = f"energy={sources.get('energy')}"
    return f"{energy}; {', '.join(parts)}" if parts else energy
