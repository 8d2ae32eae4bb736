"""`Receipt`: the printable name of one checkpoint's receipt digest (`rcpt_<64 hex>`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_RECEIPT_RE = re.compile(r"rcpt_([0-9a-f]{64})")


@dataclass(frozen=True)
class Receipt:
    """A checkpoint receipt: BLAKE3 over (previous receipt, header, descriptor arena).

    `str(receipt)` is the written form `rcpt_<hex>`; `digest` is the 32 raw bytes. A receipt
    proves consistency, not authenticity: anyone can recompute it after editing a file. A
    signature over it (FORMAT.md, signature block) is what proves who wrote the checkpoint.
    """

    digest: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.digest, bytes) or len(self.digest) != 32:
            raise ValueError("a receipt digest is exactly 32 bytes")

    @property
    def hex(self) -> str:
        return self.digest.hex()

    def __str__(self) -> str:
        return f"rcpt_{self.digest.hex()}"

    @classmethod
    def parse(cls, text: str) -> Receipt:
        m = _RECEIPT_RE.fullmatch(text.strip())
        if not m:
            raise ValueError(
                f"{text!r} is not a receipt: expected 'rcpt_' and 64 lowercase hex digits"
            )
        return cls(bytes.fromhex(m.group(1)))

    @classmethod
    def coerce(cls, value: Receipt | str | bytes | None) -> Receipt | None:
        """Accept a Receipt, its `rcpt_` text or its 32-byte digest (None passes through)."""
        if value is None or isinstance(value, Receipt):
            return value
        if isinstance(value, bytes):
            return cls(value)
        if isinstance(value, str):
            return cls.parse(value)
        raise TypeError(
            f"prev must be a Receipt, 'rcpt_…' string or None, not {type(value).__name__}"
        )
