"""The `.many` arena: a zero-copy, page-aligned, hash-receipted checkpoint format.

- `save(path, state, *, prev=None, metadata=None) -> Receipt`: atomic write from the
  tensors' own buffers.
- `load(path, *, verify=False) -> Checkpoint`: mmap + O(slots) rebind to zero-copy views.
- `Arena`: a live file mapped shared; `update` a slot in place, `commit` a new receipt.
- `verify(path)`, `verify_chain(paths)`: lists of problems (empty when sound).

Byte layout: FORMAT.md next to this file.
"""

from profiler.many.arena import Arena, Handle, StaleHandleError
from profiler.many.format import (
    RIGHT_READ,
    RIGHT_WRITE,
    ManyError,
    ManyFormatError,
)
from profiler.many.reader import Checkpoint, RightsError, SlotInfo, load
from profiler.many.receipt import Receipt
from profiler.many.signing import generate_signing_key, load_public_key, load_signing_key
from profiler.many.verify import ChainHead, chain_head, verify, verify_chain
from profiler.many.writer import save

__all__ = [
    "RIGHT_READ",
    "RIGHT_WRITE",
    "Arena",
    "ChainHead",
    "Checkpoint",
    "Handle",
    "ManyError",
    "ManyFormatError",
    "Receipt",
    "RightsError",
    "SlotInfo",
    "StaleHandleError",
    "chain_head",
    "generate_signing_key",
    "load",
    "load_public_key",
    "load_signing_key",
    "save",
    "verify",
    "verify_chain",
]
