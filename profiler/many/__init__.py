"""The `.many` arena: a zero-copy, page-aligned, hash-receipted checkpoint format.

- `save(path, state, *, prev=None, metadata=None) -> Receipt`: atomic write from the
  tensors' own buffers.
- `load(path, *, verify=False, read="auto") -> Checkpoint`: mmap + O(slots) rebind to
  zero-copy views; a file on a network or FUSE filesystem is copied whole instead
  (restore.py; `read="mmap"` or `"copy"` decides, `Checkpoint.read_mode` says which).
- `Arena`: a live file mapped shared; `update` a slot in place, `commit` a new receipt.
- `verify(path)`, `verify_chain(paths)`: lists of problems (empty when sound).
- `save_state(path, tree)` / `load_state(path)`: whole nested checkpoints (dicts, lists,
  tuples of tensors and JSON scalars); `torch_compat.save/load`: the torch.save drop-in.
- `Checkpointer(dir)`: asynchronous checkpoints that stall training only for one copy.

Byte layout: FORMAT.md next to this file.
"""

from serwatt.profiler.many.arena import Arena, Handle, StaleHandleError
from serwatt.profiler.many.checkpointer import (
    Checkpointer,
    CheckpointError,
    Staged,
    TornCopyError,
    Written,
)
from serwatt.profiler.many.format import (
    RIGHT_READ,
    RIGHT_WRITE,
    ManyError,
    ManyFormatError,
)
from serwatt.profiler.many.reader import Checkpoint, RightsError, SlotInfo, load
from serwatt.profiler.many.receipt import Receipt
from serwatt.profiler.many.signing import generate_signing_key, load_public_key, load_signing_key
from serwatt.profiler.many.state import LoadedState, load_state, open_state, save_state
from serwatt.profiler.many.verify import ChainHead, chain_head, verify, verify_chain
from serwatt.profiler.many.writer import save

__all__ = [
    "RIGHT_READ",
    "RIGHT_WRITE",
    "Arena",
    "ChainHead",
    "Checkpoint",
    "CheckpointError",
    "Checkpointer",
    "Handle",
    "LoadedState",
    "ManyError",
    "ManyFormatError",
    "Receipt",
    "RightsError",
    "SlotInfo",
    "Staged",
    "StaleHandleError",
    "TornCopyError",
    "Written",
    "chain_head",
    "generate_signing_key",
    "load",
    "load_public_key",
    "load_signing_key",
    "load_state",
    "open_state",
    "save",
    "save_state",
    "verify",
    "verify_chain",
]
