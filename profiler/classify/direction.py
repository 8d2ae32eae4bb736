"""Whether a serializer sample encodes or decodes, read from the names on its stack.

A codepath says which serializer ran; its direction says which way: `encode` (dump,
dumps, save, SerializeToString, packb, safe_dump, write...), `decode` (load, loads,
ParseFromString, unpackb, safe_load, open, read, from_file, get_tensor...), or `unknown`
when nothing on the stack says. It is read, never guessed:

- a rule may state it (`direction: encode | decode | unknown`, profiler/classify/rules.py);
- else a frame's name says it when its words name one direction only (`save_reduce`,
  `_Unpickler.load_build`, `JSONEncoder.iterencode`, `caffe2::serialize::
  PyTorchStreamWriter::writeRecord`); a name with words of both (`_open_zipfile_writer`:
  open, writer) or of neither (`Checkpointer.checkpoint`) says nothing;
- a call-site line says it by the called name (`pickle.dumps`, `msg.ParseFromString`).

The classifier asks the deciding frame first and then the deeper frames of the same
codepath, outermost first (profiler/classify/classifier.py): `torch.save` is an encode
even where `persistent_load`-like helpers run under it.
"""

from __future__ import annotations

import re

from serwatt.profiler.classify.codepaths import CODEPATHS, SERIALIZATION_CODEPATHS

ENCODE = "encode"
DECODE = "decode"
UNKNOWN = "unknown"
DIRECTIONS: tuple[str, ...] = (ENCODE, DECODE, UNKNOWN)


def series_directions(codepath: str) -> tuple[str, ...]:
    """The `direction` label values a codepath's series carry: all three for a
    serializer, `unknown` alone for `other` (it neither encodes nor decodes). This bounds
    the Prometheus label (docs/scaling.md)."""
    return DIRECTIONS if codepath in SERIALIZATION_CODEPATHS else (UNKNOWN,)


# (codepath, direction) of every per-codepath series, in export order
CODEPATH_DIRECTIONS: tuple[tuple[str, str], ...] = tuple(
    (cp, d) for cp in CODEPATHS for d in series_directions(cp)
)

# Words (lowercased, from splitting a name at `_`, `.`, `::` and case changes) that name
# one direction. Adjacent words are also tried joined (`Parse`+`From`+`String` ->
# `parsefromstring`, `from`+`file` -> `fromfile`), so two-word verbs need no special case.
_ENCODE_WORDS = frozenset(
    """
    dump dumps dumper save saves savez saver serialize serializer serializetostring
    serializepartialtostring pack packb packer encode encoder iterencode write writes
    writer writerecord pickler emit emitter represent representer persistent_id
    reducer_override reduce getstate getnewargs tobytes tojson todict printer
    """.split()
)
_DECODE_WORDS = frozenset(
    """
    load loads loader unpickler unpack unpackb unpacker decode decoder scanstring scanner
    scan parse parser parsefromstring mergefromstring fromstring fromfile open read
    reads reader readrecord get_tensor gettensor get_slice getslice construct
    constructor compose composer persistent_load setstate find_class rebuild
    deserialize unmarshal fromjson fromdict
    """.split()
)
_WORD_RE = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def _words(name: str) -> list[str]:
    out: list[str] = []
    for part in re.split(r"[^A-Za-z0-9]+", name):
        out.extend(w.lower() for w in _WORD_RE.findall(part))
    return out


def name_direction(name: str) -> str | None:
    """The direction a function, symbol or called name names (None: neither, or both).
    Only its last two components are read (`Class.method`, `Class::method`): a package or
    namespace (`caffe2::serialize::`) names the library, not the call."""
    words = _words(" ".join(re.split(r"\.|::", name)[-2:]))
    # the words alone, adjacent pairs and triples joined, and the dunder-free name
    # words joined by `_` (`persistent_id`, `get_tensor`)
    grams = set(words)
    for n in (2, 3):
        grams.update("".join(words[i : i + n]) for i in range(len(words) - n + 1))
    grams.update("_".join(words[i : i + 2]) for i in range(len(words) - 1))
    enc, dec = bool(grams & _ENCODE_WORDS), bool(grams & _DECODE_WORDS)
    if enc == dec:
        return None
    return ENCODE if enc else DECODE


def combined(directions: list[str | None]) -> str | None:
    """One direction for several calls on a line: theirs when they agree, else None."""
    seen = {d for d in directions if d is not None}
    return seen.pop() if len(seen) == 1 and None not in directions else None
