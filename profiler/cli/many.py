"""`serwatt many inspect FILE` and `serwatt many verify FILE...`.

inspect: header, receipts and one line per slot (no data is read).
verify: rehash every slot, recompute each receipt and, for several files, check that each
file's prev_receipt links to the file before it. Exit 0 when sound, 1 naming each problem.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from profiler.cli.main import UsageError
from profiler.exitcodes import EXIT_OK, EXIT_RUNTIME
from profiler.many.format import HEADER_DIRTY, VERSION_MAJOR, ManyFormatError
from profiler.many.reader import load
from profiler.many.verify import verify, verify_chain


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="many_command", metavar="ACTION")
    p_inspect = sub.add_parser("inspect", help="print a .many file's header and slot table")
    p_inspect.add_argument("file")
    p_inspect.add_argument("--json", action="store_true", help="print one JSON document")
    p_verify = sub.add_parser(
        "verify", help="check slot hashes, receipts and (for several files) the receipt chain"
    )
    p_verify.add_argument("files", nargs="+", metavar="FILE")
    p_verify.add_argument(
        "--no-chain",
        action="store_true",
        help="verify files independently; do not require each to link to the one before",
    )


def _require_files(paths: list[str]) -> None:
    for p in paths:
        if not os.path.exists(p):
            raise UsageError(f"{p}: no such file")
        if os.path.isdir(p):
            raise UsageError(f"{p}: is a directory; pass .many files")


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _inspect(path: str, as_json: bool) -> int:
    try:
        ckpt = load(path)
        slots = ckpt.slots()
    except ManyFormatError as exc:
        for problem in exc.problems:
            print(f"{path}: {problem}", file=sys.stderr)
        return EXIT_RUNTIME
    h = ckpt.header
    state_bytes = sum(s.length for s in slots)
    doc: dict[str, object] = {
        "file": path,
        "format": f"{VERSION_MAJOR}.{h.version_minor}",
        "receipt": str(ckpt.receipt),
        "prev_receipt": str(ckpt.prev_receipt) if ckpt.prev_receipt else None,
        "commit_seq": h.commit_seq,
        "dirty": bool(h.flags & HEADER_DIRTY),
        "file_bytes": h.file_length,
        "state_bytes": state_bytes,
        "metadata": ckpt.metadata,
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
    ckpt.close()
    if as_json:
        print(json.dumps(doc, indent=2))
        return EXIT_OK
    print(f"file          {path}")
    print(f"format        .many {doc['format']}")
    print(f"receipt       {doc['receipt']}")
    print(f"prev_receipt  {doc['prev_receipt'] or '(none: first in chain)'}")
    print(f"commit_seq    {h.commit_seq}{'  DIRTY (uncommitted updates)' if doc['dirty'] else ''}")
    print(
        f"size          {_human(h.file_length)} on disk, {_human(state_bytes)} of tensors "
        f"in {len(slots)} slots"
    )
    if ckpt.metadata:
        print(f"metadata      {json.dumps(ckpt.metadata)[:200]}")
    print()
    width = max([len(s.name) for s in slots] + [4])
    print(
        f"{'#':>4}  {'name':<{width}}  {'dtype':<10} {'shape':<18} {'bytes':>12}  rw  gen  blake3"
    )
    for s in slots:
        digest = s.hash.hex()[:16] if s.hashed else "(none)"
        shape = "x".join(map(str, s.shape)) or "scalar"
        print(
            f"{s.index:>4}  {s.name:<{width}}  {s.dtype:<10} {shape:<18} {s.length:>12}  "
            f"{s.rights_text}  {s.generation:>3}  {digest}"
        )
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    if args.many_command == "inspect":
        _require_files([args.file])
        return _inspect(args.file, args.json)
    if args.many_command == "verify":
        _require_files(args.files)
        if len(args.files) > 1 and not args.no_chain:
            problems = verify_chain(args.files)
        else:
            problems = [f"{p}: {msg}" for p in args.files for msg in verify(p)]
        for problem in problems:
            print(problem)
        if problems:
            print(f"FAILED: {len(problems)} problem(s)", file=sys.stderr)
            return EXIT_RUNTIME
        what = "file" if len(args.files) == 1 else "files and their receipt chain"
        print(f"ok: {len(args.files)} {what} verified")
        return EXIT_OK
    raise UsageError("choose an action: serwatt many inspect FILE | serwatt many verify FILE...")
