"""`.many` slot names for a terminal and for messages: escaped (profiler/terminal_escape.py)
and cut to a bound with their true length, so listing or quoting a file's names costs
O(names x bound), not O(longest name).
"""

from __future__ import annotations

from serwatt.profiler.terminal_escape import escape_text

# Names longer than this are cut in messages and listings (with their true length).
NAME_DISPLAY_LIMIT = 64


def display_name(name: str, limit: int = NAME_DISPLAY_LIMIT) -> str:
    """A slot name for a terminal: escaped, and cut to about `limit` characters with a marker
    naming its true length (so listing N names costs O(N * limit), not O(N * longest))."""
    shown = escape_text(name[: limit + 1])
    if len(name) <= limit and len(shown) <= limit:
        return shown
    marker = f"…[{len(name)} chars]"
    return shown[: max(limit - len(marker), 8)] + marker


def show_name(name: object) -> str:
    """A slot name quoted for an error message: escaped and bounded."""
    if not isinstance(name, str):
        return escape_text(str(name)[:NAME_DISPLAY_LIMIT])
    return f"'{display_name(name)}'"
