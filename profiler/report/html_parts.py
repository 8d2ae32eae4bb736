"""The pieces every section of the HTML pages is made of: the one escape (every value from
the inputs goes through `e`), a table, an SVG's size."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any


def e(value: Any) -> str:
    """Escape any value for HTML text or a quoted attribute."""
    return html.escape(str(value), quote=True)


def svg_size(width: int, height: float) -> str:
    """An SVG's size: its drawn width at most, narrower with the column (no overflow)."""
    return (
        f'width="100%" style="max-width:{width}px;height:auto" height="{height}" '
        f'viewBox="0 0 {width} {height}"'
    )


def html_table(head: Sequence[str], rows: Sequence[Sequence[Any]], numeric_from: int = 1) -> str:
    out = ["<table><tr>", *(f"<th>{e(h)}</th>" for h in head), "</tr>"]
    for row in rows:
        out.append("<tr>")
        for i, cell in enumerate(row):
            cls = ' class="num"' if i >= numeric_from else ""
            out.append(f"<td{cls}>{e(cell)}</td>")
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)
