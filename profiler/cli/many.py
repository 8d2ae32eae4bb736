"""`serwatt many inspect FILE`, `serwatt many verify FILE...` and `serwatt many keygen NAME`.

inspect: header, receipts, signature and one line per slot (no tensor data is read). Text
from the file is escaped and long names are cut with their true length, so a hostile file
cannot drive the terminal or blow up the output; `--json` is strict JSON.
verify: rehash every slot, recompute each receipt and, for several files, check that each
file's prev_receipt links to the file before it; `--key` also requires every file to be
signed by that Ed25519 key, `--head` that the chain ends at an anchored receipt.
keygen: write an Ed25519 key pair for signing checkpoints.

Exit codes: 0 sound, 1 problems found or a file unreadable (one line each, naming the file),
2 usage (missing file, not a regular file, bad key file or arguments).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import stat
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from serwatt.profiler.cli.main import UsageError
from serwatt.profiler.exitcodes import EXIT_OK, EXIT_RUNTIME
from serwatt.profiler.many.format import HEADER_DIRTY, VERSION_MAJOR, ManyFormatError
from serwatt.profiler.many.names import display_name
from serwatt.profiler.many.reader import load
from serwatt.profiler.many.receipt import Receipt
from serwatt.profiler.many.signing import (
    generate_signing_key,
    key_id,
    load_public_key,
)
from serwatt.profiler.many.verify import verify, verify_chain
from serwatt.profiler.terminal_escape import escape_text

# Text-mode column width for names; longer names are cut with a marker and their length.
_NAME_COLUMN = 48


def _safe(text: str) -> str:
    """Paths and messages for the terminal: non-printable characters escaped. Names inside
    messages are already escaped (`show_name`), so backslashes pass through."""
    return escape_text(text, backslash=False)


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="many_command", metavar="ACTION")
    p_inspect = sub.add_parser("inspect", help="print a .many file's header and slot table")
    p_inspect.add_argument("file")
    p_inspect.add_argument(
        "--json",
        action="store_true",
        help="print one strict JSON document (non-finite metadata numbers become the strings "
        '"NaN", "Infinity", "-Infinity")',
    )
    p_verify = sub.add_parser(
        "verify", help="check slot hashes, receipts and (for several files) the receipt chain"
    )
    p_verify.add_argument("files", nargs="+", metavar="FILE")
    p_verify.add_argument(
        "--no-chain",
        action="store_true",
        help="verify files independently; do not require each to link to the one before",
    )
    p_verify.add_argument(
        "--key",
        metavar="PUB",
        help="Ed25519 public key file (PEM, ssh-ed25519 line or 64 hex digits): every file "
        "must be signed by it; an unsigned or otherwise signed file fails",
    )
    p_verify.add_argument(
        "--head",
        metavar="RECEIPT",
        help="rcpt_… anchored outside the files (e.g. in a run record): the last file must "
        "carry it",
    )
    p_keygen = sub.add_parser(
        "keygen", help="write an Ed25519 key pair for signing: NAME (private) and NAME.pub"
    )
    p_keygen.add_argument("name", metavar="NAME")


def _say(path: str, message: str, *, file: Any = None) -> None:
    print(f"{_safe(path)}: {_safe(message)}", file=file or sys.stdout)


def _require_files(paths: list[str]) -> None:
    """Missing files and files of the wrong kind are usage errors; anything else that stops a
    file from being read is reported by the reader, as that file's problem."""
    for p in paths:
        try:
            mode = os.stat(p).st_mode
        except FileNotFoundError:
            raise UsageError(f"{_safe(p)}: no such file") from None
        except OSError:
            continue
        if stat.S_ISDIR(mode):
            raise UsageError(f"{_safe(p)}: is a directory; pass .many files")
        if not stat.S_ISREG(mode):
            kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "not a regular file"
            raise UsageError(f"{_safe(p)}: is {kind}, not a .many file")


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _finite(value: Any) -> Any:
    """A copy of a decoded JSON value with NaN and ±Infinity as strings (strict JSON has no
    such numbers). Iterative: the table's nesting depth is the file's choice."""

    def scalar(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
        return v

    if not isinstance(value, dict | list):
        return scalar(value)
    root: Any = {} if isinstance(value, dict) else []
    stack: list[tuple[Any, Any]] = [(value, root)]
    while stack:
        src, dst = stack.pop()
        items = src.items() if isinstance(src, dict) else enumerate(src)
        for k, v in items:
            if isinstance(v, dict | list):
                child: Any = {} if isinstance(v, dict) else []
                stack.append((v, child))
            else:
                child = scalar(v)
            if isinstance(dst, dict):
                dst[k] = child
            else:
                dst.append(child)
    return root


def _signature_doc(ckpt: Any) -> dict[str, object] | None:
    """The checkpoint's signature as `inspect` shows it (None: unsigned)."""
    try:
        sig = ckpt.signature
    except ManyFormatError as exc:
        return {"error": "; ".join(exc.problems)}
    if sig is None:
        return None
    return {"algorithm": "ed25519", "public_key": sig.public_key.hex(), "valid": sig.valid}


def _inspect_doc(path: str, ckpt: Any, slots: Sequence[Any], sig_doc: Any) -> dict[str, object]:
    h = ckpt.header
    return {
        "file": path,
        "format": f"{VERSION_MAJOR}.{h.version_minor}",
        "receipt": str(ckpt.receipt),
        "prev_receipt": str(ckpt.prev_receipt) if ckpt.prev_receipt else None,
        "commit_seq": h.commit_seq,
        "dirty": bool(h.flags & HEADER_DIRTY),
        "signature": sig_doc,
        "file_bytes": h.file_length,
        "state_bytes": sum(s.length for s in slots),
        "metadata": _finite(ckpt.metadata),
        "slots": [
            {
                "index": s.index,
                "name": s.name,
                "dtype": s.dtype,
                "shape": list(s.shape),
                "offset": s.offset,
                "bytes": s.length,
                "rights": s.rights_text,
                "generation": s.generation,
                "blake3": s.hash.hex() if s.hashed else None,
            }
            for s in slots
        ],
    }


def _print_inspect(path: str, doc: Mapping[str, Any], slots: Sequence[Any]) -> None:
    """`inspect`'s text: the header, the signature, sizes and metadata, then one line per
    slot (names made printable and cut to the column)."""
    sig_doc = doc["signature"]
    print(f"file          {_safe(path)}")
    print(f"format        .many {doc['format']}")
    print(f"receipt       {doc['receipt']}")
    print(f"prev_receipt  {doc['prev_receipt'] or '(none: first in chain)'}")
    dirty = "  DIRTY (uncommitted updates)" if doc["dirty"] else ""
    print(f"commit_seq    {doc['commit_seq']}{dirty}")
    if sig_doc is None:
        print("signature     (none)")
    elif "error" in sig_doc:
        print(f"signature     malformed: {_safe(str(sig_doc['error']))}")
    else:
        state = "matches the stored receipt" if sig_doc["valid"] else "DOES NOT MATCH the receipt"
        print(
            f"signature     {key_id(bytes.fromhex(str(sig_doc['public_key'])))} {state} "
            "(verify --key PUB proves data and signer)"
        )
    print(
        f"size          {_human(doc['file_bytes'])} on disk, {_human(doc['state_bytes'])} of "
        f"tensors in {len(slots)} slots"
    )
    if doc["metadata"]:
        # json.dumps escapes every control and non-ASCII character: printable as it is.
        print(f"metadata      {json.dumps(doc['metadata'])[:200]}")
    print()
    shown = [display_name(s.name, _NAME_COLUMN) for s in slots]
    width = max([len(n) for n in shown] + [4])
    print(
        f"{'#':>4}  {'name':<{width}}  {'dtype':<10} {'shape':<18} {'bytes':>12}  rw  gen  blake3"
    )
    for s, name in zip(slots, shown, strict=True):
        digest = s.hash.hex()[:16] if s.hashed else "(none)"
        shape = "x".join(map(str, s.shape)) or "scalar"
        print(
            f"{s.index:>4}  {name:<{width}}  {s.dtype:<10} {shape:<18} {s.length:>12}  "
            f"{s.rights_text}  {s.generation:>3}  {digest}"
        )


def _inspect(path: str, as_json: bool) -> int:
    try:
        # inspect reads no slot: mapped, a file on a network filesystem costs its header
        # and table, where a copy (load's auto there) would read all of it
        ckpt = load(path, read="mmap")
        slots = ckpt.slots()
        sig_doc = _signature_doc(ckpt)
    except ManyFormatError as exc:
        for problem in exc.problems:
            _say(path, problem, file=sys.stderr)
        return EXIT_RUNTIME
    except OSError as exc:
        _say(path, f"cannot read: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_RUNTIME
    doc = _inspect_doc(path, ckpt, slots, sig_doc)
    ckpt.close()
    if not as_json:
        _print_inspect(path, doc, slots)
        return EXIT_OK
    try:
        # ensure_ascii: names reach the terminal as \\u escapes, never as raw controls.
        print(json.dumps(doc, indent=2, allow_nan=False))
    except RecursionError:
        _say(path, "metadata is nested too deeply to print as JSON", file=sys.stderr)
        return EXIT_RUNTIME
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    key = None
    if args.key:
        try:
            key = load_public_key(args.key)
        except OSError as exc:
            raise UsageError(f"{_safe(args.key)}: cannot read the key: {exc.strerror}") from None
        except ValueError as exc:
            raise UsageError(_safe(str(exc))) from None
    head = None
    if args.head:
        if args.no_chain:
            raise UsageError("--head checks a chain; drop --no-chain")
        try:
            head = Receipt.parse(args.head)
        except ValueError as exc:
            raise UsageError(_safe(str(exc))) from None
    _require_files(args.files)
    if (len(args.files) > 1 and not args.no_chain) or head is not None:
        problems = verify_chain(args.files, key=key, head=head)
    else:
        problems = [f"{p}: {msg}" for p in args.files for msg in verify(p, key=key)]
    for problem in problems:
        print(_safe(problem))
    if problems:
        print(f"FAILED: {len(problems)} problem(s)", file=sys.stderr)
        return EXIT_RUNTIME
    what = "file" if len(args.files) == 1 else "files and their receipt chain"
    signed = "" if key is None else f", each signed by {key_id(key.public_bytes_raw())}"
    print(f"ok: {len(args.files)} {what} verified{signed}")
    return EXIT_OK


def _keygen(name: str) -> int:
    try:
        private, public = generate_signing_key(name)
    except FileExistsError as exc:
        raise UsageError(_safe(str(exc))) from None
    except OSError as exc:
        _say(name, f"cannot write the key: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_RUNTIME
    pub = load_public_key(public)
    print(f"private key  {_safe(str(private))}  (mode 0600: keep it secret, sign with it)")
    print(f"public key   {_safe(str(public))}  {key_id(pub.public_bytes_raw())}")
    print(f"verify with  serwatt many verify --key {_safe(str(public))} FILE...")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Usage errors are UsageError: the dispatcher prints them and exits 2."""
    if args.many_command == "inspect":
        _require_files([args.file])
        return _inspect(args.file, args.json)
    if args.many_command == "verify":
        return _verify(args)
    if args.many_command == "keygen":
        return _keygen(args.name)
    raise UsageError(
        "choose an action: serwatt many inspect FILE | serwatt many verify FILE... | "
        "serwatt many keygen NAME"
    )
