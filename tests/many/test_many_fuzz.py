"""Fuzz the `.many` reader: any bytes give a checkpoint or ManyError, never a crash, hang or
huge allocation.

Mutations start from a valid file (so they reach the deep checks), and a second strategy
builds headers field by field with absurd values. For each input: `load`, bind every slot,
read one byte of it, `verify`, and `Arena(...)`; only `ManyError` may escape, and traced
Python memory (numpy reports its buffers to tracemalloc) must stay small.
"""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serwatt.profiler.many import Arena, ManyError, load, save, verify
from serwatt.profiler.many.format import HEADER_SIZE, parse_header

MAX_TRACED_BYTES = 8 << 20  # the inputs are < 64 KiB; anything near this is a runaway allocation

FUZZ = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)


@pytest.fixture(scope="module")
def seed_file(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("seed") / "seed.many"
    save(
        path,
        {
            "a": np.arange(1000, dtype=np.float32),
            "b": np.ones((3, 5), dtype=np.int16),
            "e": np.zeros((0,), dtype=np.float64),
            "c": np.arange(20, dtype=np.complex64),
        },
        metadata={"step": 1},
    )
    return path.read_bytes()


def _exercise(path: Path) -> None:
    tracemalloc.start()
    try:
        try:
            ckpt = load(path)
        except ManyError:
            pass
        else:
            for name in list(ckpt):
                try:
                    view = ckpt[name]
                    if view.size:
                        view.reshape(-1)[:1].tobytes()
                except ManyError:
                    pass
            ckpt.close()
        problems = verify(path)
        assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)
        try:
            Arena(path).close()
        except ManyError:
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MAX_TRACED_BYTES, (
        f"reader allocated {peak} bytes on a {path.stat().st_size}-byte file"
    )


# Positions weighted towards the header, descriptors and table: where structure lives.
edits = st.lists(
    st.tuples(
        st.one_of(st.integers(0, 255), st.integers(0, 767), st.integers(0, 20000)),
        st.integers(0, 255),
    ),
    min_size=1,
    max_size=8,
)


@FUZZ
@given(edits=edits, cut=st.one_of(st.none(), st.integers(0, 20480)))
def test_mutated_files_fail_cleanly(tmp_path: Path, seed_file: bytes, edits, cut) -> None:
    raw = bytearray(seed_file)
    for pos, value in edits:
        if pos < len(raw):
            raw[pos] = value
    if cut is not None:
        raw = raw[:cut]
    path = tmp_path / "f.many"
    path.write_bytes(bytes(raw))
    _exercise(path)


u64 = st.one_of(st.integers(0, 1 << 16), st.just(2**64 - 1), st.integers(0, 2**64 - 1))
u32 = st.one_of(st.integers(0, 300), st.just(2**32 - 1), st.integers(0, 2**32 - 1))


@FUZZ
@given(
    slot_count=u32,
    table_offset=u64,
    table_length=u64,
    state_offset=u64,
    state_length=u64,
    descriptors=st.binary(min_size=0, max_size=64 * 8),
    tail=st.binary(min_size=0, max_size=512),
)
def test_crafted_headers_fail_cleanly(
    tmp_path: Path,
    seed_file: bytes,
    slot_count: int,
    table_offset: int,
    table_length: int,
    state_offset: int,
    state_length: int,
    descriptors: bytes,
    tail: bytes,
) -> None:
    body = descriptors + tail
    file_length = HEADER_SIZE + len(body)
    header = bytearray(seed_file[:HEADER_SIZE])
    struct.pack_into("<I", header, 20, slot_count)
    struct.pack_into(
        "<QQQQQ", header, 40, table_offset, table_length, state_offset, state_length, file_length
    )
    path = tmp_path / "h.many"
    path.write_bytes(bytes(header) + body)
    _exercise(path)


def test_fuzz_seed_is_valid(seed_file: bytes, tmp_path: Path) -> None:
    """The mutations start from a sound file: otherwise they would only test the magic check."""
    path = tmp_path / "seed.many"
    path.write_bytes(seed_file)
    assert verify(path) == []
    assert parse_header(seed_file[:HEADER_SIZE], len(seed_file)).slot_count == 4


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)
shapes = st.one_of(
    json_values,
    st.lists(st.one_of(st.integers(-3, 5000), st.just(2**63), json_values), max_size=40),
)
tables = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {
            # The seed's own names (and 4 shapes) often, so the shape checks are reached.
            "names": st.one_of(
                st.just(["a", "b", "e", "c"]),
                st.lists(st.one_of(st.text(max_size=4), json_values), max_size=6),
                json_values,
            ),
            "shapes": st.one_of(
                st.lists(shapes, min_size=4, max_size=4), st.lists(shapes, max_size=6), json_values
            ),
        },
        optional={"metadata": json_values},
    ),
)


@FUZZ
@given(
    table=tables,
    desc_edits=st.lists(st.tuples(st.integers(0, 255), st.integers(0, 255)), max_size=6),
)
def test_sealed_tables_and_descriptors_fail_cleanly(
    tmp_path: Path, seed_file: bytes, table, desc_edits
) -> None:
    """Table and descriptors re-sealed with a correct table hash and receipt, so the JSON and
    shape checks themselves are fuzzed rather than stopped at the table hash."""
    import json

    import blake3

    from serwatt.profiler.many.format import receipt_digest

    raw = bytearray(seed_file)
    header = parse_header(bytes(raw[:HEADER_SIZE]), len(raw))
    for pos, value in desc_edits:
        raw[HEADER_SIZE + pos] = value
    tbytes = json.dumps(table).encode()
    room = header.state_offset - header.table_offset
    if len(tbytes) > room:
        tbytes = tbytes[:room]
    raw[header.table_offset : header.state_offset] = tbytes + bytes(room - len(tbytes))
    struct.pack_into("<Q", raw, 48, len(tbytes))
    raw[88:120] = blake3.blake3(tbytes).digest()
    raw[192:224] = receipt_digest(bytes(raw[:256]), bytes(raw[256 : 256 + 64 * header.slot_count]))
    path = tmp_path / "t.many"
    path.write_bytes(bytes(raw))
    _exercise(path)
