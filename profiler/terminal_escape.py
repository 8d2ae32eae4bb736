"""Text from outside serwatt made safe for a terminal: every string serwatt did not write
itself (a target's argv, a record's host fields, a server's answer, a file's slot names)
is printed through `escape_text`, so no terminal escape reaches the terminal raw.

Standard library only, and it imports nothing from serwatt: every layer uses it, the
`.many` library included.
"""

from __future__ import annotations

_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def escape_text(text: str, *, backslash: bool = True) -> str:
    """`text` with every non-printable character (controls, escapes, bidi overrides, lone
    surrogates) written as a Python-style escape: safe for a terminal. With `backslash`, a
    backslash is doubled too, so the escaped form is unambiguous; without it, text that is
    already escaped (a message quoting names) passes through unchanged."""
    if text.isprintable() and (not backslash or "\\" not in text):
        return text
    out = []
    for ch in text:
        if ch == "\\" and not backslash:
            out.append(ch)
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(
                f"\\x{code:02x}"
                if code < 0x100
                else f"\\u{code:04x}"
                if code < 0x10000
                else f"\\U{code:08x}"
            )
    return "".join(out)
