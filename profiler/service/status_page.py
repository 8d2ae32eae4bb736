"""The status page at `/`: the HTML a person reads to see what the daemon is doing
(targets, collectors, sampling rate, series count), built from one ledger snapshot."""

from __future__ import annotations

import html

from serwatt.profiler.service.ledger import LedgerSnapshot
from serwatt.profiler.service.metrics import series_count


def render_landing_page(snap: LedgerSnapshot, *, listen: str = "", now: float) -> str:
    """The HTML at `/`: a link to /metrics, the targets and the collectors' status. now:
    epoch seconds on the clock that stamped the snapshot (the daemon's)."""
    e = html.escape
    age_s = max(0.0, now - snap.taken_at)
    rows = []
    for t in snap.targets:
        samples = sum(n for (name, _cp, _d), n in snap.samples.items() if name == t.name)
        cpu_s = sum(v for (name, _cp, _d), v in snap.cpu_s.items() if name == t.name)
        errors = sum(v for (name, _k), v in snap.sampler_errors.items() if name == t.name)
        procs = (
            ", ".join(f"pid {p.pid} (Python {e(p.python)})" for p in t.processes) or "none found"
        )
        state = "up" if t.up else ("down" if t.configured else "removed from config")
        labels = ", ".join(f"{k}={v}" for k, v in t.labels.items()) or "none"
        rows.append(
            f"<tr><td>{e(t.name)}</td><td>{e(labels)}</td>"
            f"<td class='{'up' if t.up else 'down'}'>{state}</td>"
            f"<td>{procs}</td><td>{samples}</td><td>{cpu_s:.2f}</td><td>{errors}</td></tr>"
        )
    crows = []
    for name, c in sorted(snap.collectors.items()):
        crows.append(
            f"<tr><td>{e(name)}</td><td class='{'up' if c.up else 'down'}'>"
            f"{'up' if c.up else 'down'}</td><td>{c.duration_s:.4f}</td>"
            f"<td>{e(c.detail)}</td></tr>"
        )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>serwatt {e(snap.version)}</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:.2em .8em;text-align:left}}
.up{{color:#070}}.down{{color:#a00}}</style></head>
<body><h1>serwatt {e(snap.version)}</h1>
<p>Per-node serialization profiler. Metrics: <a href="/metrics">/metrics</a>.
Listening on {e(listen)}. Snapshot taken {age_s:.1f} s ago, {snap.windows} windows recorded.</p>
<p>{e(_sampling_line(snap))}</p>
<p class="series">{e(series_count(snap).line())}</p>
<h2>Targets</h2>
<table><tr><th>target</th><th>labels</th><th>state</th><th>processes</th><th>samples</th>
<th>CPU s</th><th>sampler errors</th></tr>
{"".join(rows) or "<tr><td colspan=7>no targets configured</td></tr>"}
</table>
<h2>Collectors</h2>
<table><tr><th>collector</th><th>state</th><th>last duration s</th><th>detail</th></tr>
{"".join(crows) or "<tr><td colspan=4>no collector has run yet</td></tr>"}
</table>
</body></html>
"""


def _sampling_line(snap: LedgerSnapshot) -> str:
    used = ", ".join(f"{part} {s:.1f} CPU s" for part, s in sorted(snap.self_cpu_s.items()))
    budget = (
        f"CPU budget {snap.cpu_budget_cores:g} cores"
        if snap.cpu_budget_cores is not None
        else "no CPU budget"
    )
    return (
        f"Sampling at {snap.sample_rate_hz:g} Hz ({budget}); serwatt's own CPU so far: "
        f"{used or 'none measured yet'}."
    )
