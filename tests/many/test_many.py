"""The .many arena: round trips, layout, receipts, chains, Arena, atomic save, bad files, CLI."""

from __future__ import annotations

import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import blake3
import numpy as np
import pytest
import torch

from serwatt.profiler.many import (
    Arena,
    ManyFormatError,
    Receipt,
    RightsError,
    StaleHandleError,
    load,
    save,
    verify,
    verify_chain,
)
from serwatt.profiler.many.format import HEADER_SIZE, parse_header, receipt_digest

REPO = Path(__file__).resolve().parents[2]

NUMPY_DTYPES = [
    np.bool_,
    np.uint8,
    np.int8,
    np.uint16,
    np.int16,
    np.uint32,
    np.int32,
    np.uint64,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
]


def _state(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "model.fc1.weight": rng.standard_normal((64, 33)).astype(np.float32),
        "model.fc1.bias": rng.standard_normal(64).astype(np.float32),
        "optim.step": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 5), dtype=np.float64),
        "big": rng.standard_normal(5000),
    }


# -- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_roundtrip_every_dtype(tmp_path: Path, dtype: type) -> None:
    rng = np.random.default_rng(1)
    arr = (rng.standard_normal((3, 7)) * 100).astype(dtype)
    save(tmp_path / "a.many", {"x": arr, "scalar": arr[0, 0].reshape(())})
    with load(tmp_path / "a.many") as ckpt:
        assert ckpt["x"].dtype == np.dtype(dtype)
        np.testing.assert_array_equal(ckpt["x"], arr)
        assert ckpt["scalar"].shape == ()
    assert verify(tmp_path / "a.many") == []


def test_load_gives_read_only_zero_copy_views_into_the_mapping(tmp_path: Path) -> None:
    state = _state()
    save(tmp_path / "a.many", state, metadata={"step": 7, "note": "ünïcode"})
    ckpt = load(tmp_path / "a.many")
    assert list(ckpt) == list(state)
    assert ckpt.metadata == {"step": 7, "note": "ünïcode"}
    for name, arr in state.items():
        view = ckpt[name]
        np.testing.assert_array_equal(view, arr)
        assert not view.flags.writeable
        if arr.nbytes:
            # The view's memory is the file mapping itself, not a copy of it.
            assert isinstance(view.base, mmap.mmap)
    with pytest.raises(ValueError):
        ckpt["big"][0] = 1.0
    with pytest.raises(TypeError):
        ckpt["x"] = np.zeros(1)  # type: ignore[index]
    with pytest.raises(KeyError, match="not a slot"):
        ckpt["nope"]


def test_every_slot_is_page_aligned(tmp_path: Path) -> None:
    save(tmp_path / "a.many", _state())
    with load(tmp_path / "a.many") as ckpt:
        for info in ckpt.slots():
            assert info.offset % 4096 == 0
            if info.length:
                view = ckpt[info.name]
                base = np.frombuffer(view.base, dtype=np.uint8)
                assert view.__array_interface__["data"][0] - base.ctypes.data == info.offset
    assert os.path.getsize(tmp_path / "a.many") % 4096 == 0


def test_torch_roundtrip_bfloat16_noncontiguous_and_grad(tmp_path: Path) -> None:
    w = torch.randn(8, 6, requires_grad=True)
    state = {
        "w": w,
        "wt": torch.randn(6, 8).t(),  # non-contiguous
        "bf": torch.randn(4, 4, dtype=torch.bfloat16),
        "i": torch.arange(10, dtype=torch.int64),
        "flag": torch.tensor([True, False]),
    }
    save(tmp_path / "t.many", state)
    ckpt = load(tmp_path / "t.many")
    for name, t in state.items():
        got = ckpt.torch(name)
        assert got.dtype == t.dtype
        assert torch.equal(got, t.detach())
    # bfloat16 has no numpy dtype: numpy sees its raw bits.
    assert ckpt["bf"].dtype == np.uint16
    # torch tensors sit on a private copy-on-write mapping: writable, never written back.
    got = ckpt.torch("w")
    got.add_(1.0)
    ckpt.close()
    assert verify(tmp_path / "t.many") == []
    assert torch.equal(load(tmp_path / "t.many").torch("w"), w.detach())


def test_save_rejects_what_it_cannot_store_with_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="not a numpy array or torch tensor"):
        save(tmp_path / "a.many", {"x": [1, 2, 3]})
    with pytest.raises(TypeError, match="dtype"):
        save(tmp_path / "a.many", {"x": np.array(["a", "b"])})
    with pytest.raises(TypeError, match="JSON-serializable"):
        save(tmp_path / "a.many", {"x": np.zeros(2)}, metadata={"o": object()})
    with pytest.raises(TypeError, match="non-empty strings"):
        save(tmp_path / "a.many", {"": np.zeros(2)})
    assert not list(tmp_path.iterdir())


def test_big_endian_input_is_stored_little_endian(tmp_path: Path) -> None:
    arr = np.arange(6, dtype=">i4")
    save(tmp_path / "a.many", {"x": arr})
    got = load(tmp_path / "a.many")["x"]
    assert got.dtype == np.dtype("<i4")
    np.testing.assert_array_equal(got, arr)


# -- the byte layout, read with nothing but FORMAT.md --------------------------------------


def test_layout_matches_format_md_read_independently(tmp_path: Path) -> None:
    """A second reader written from FORMAT.md alone (struct + json) agrees with load()."""
    state = _state()
    receipt = save(tmp_path / "a.many", state, metadata={"k": 1})
    raw = (tmp_path / "a.many").read_bytes()
    assert raw[:8] == b"\x89MANY\r\n\x1a"
    major, minor, hsize, dsize, n, page = struct.unpack_from("<HHIIII", raw, 8)
    assert (major, minor, hsize, dsize, n, page) == (1, 0, 256, 64, len(state), 4096)
    table_off, table_len, state_off, state_len, file_len = struct.unpack_from("<QQQQQ", raw, 40)
    assert file_len == len(raw) and state_off % 4096 == 0 and state_off + state_len == len(raw)
    table_bytes = raw[table_off : table_off + table_len]
    assert raw[88:120] == blake3.blake3(table_bytes).digest()
    table = json.loads(table_bytes)
    assert table["names"] == list(state) and table["metadata"] == {"k": 1}
    codes = {"float32": 11, "int64": 9, "float64": 12}
    for i, arr in enumerate(state.values()):
        off, length, rights, code, flags, gen = struct.unpack_from("<QQIHHQ", raw, 256 + 64 * i)
        digest = raw[256 + 64 * i + 32 : 256 + 64 * i + 64]
        assert (length, rights, code, flags, gen) == (arr.nbytes, 3, codes[arr.dtype.name], 1, 0)
        assert table["shapes"][i] == list(arr.shape)
        data = raw[state_off + off : state_off + off + length]
        assert data == arr.tobytes()
        assert digest == blake3.blake3(data).digest()
    h = blake3.blake3(b"serwatt.many.receipt.v1\0")
    h.update(raw[120:152])
    h.update(raw[:192])
    h.update(raw[256 : 256 + 64 * n])
    assert raw[192:224] == h.digest() == receipt.digest
    assert str(receipt) == "rcpt_" + h.hexdigest()


# -- receipts and chains -------------------------------------------------------------------


def test_receipt_is_deterministic_and_covers_data_names_metadata_rights_and_prev(
    tmp_path: Path,
) -> None:
    base = _state()
    r0 = save(tmp_path / "a.many", base)
    assert save(tmp_path / "b.many", base) == r0
    changed_data = dict(base, big=base["big"] + 1)
    renamed = {("x" if k == "big" else k): v for k, v in base.items()}
    variants = [
        save(tmp_path / "c.many", changed_data),
        save(tmp_path / "d.many", renamed),
        save(tmp_path / "e.many", base, metadata={"step": 1}),
        save(tmp_path / "f.many", base, rights={"big": "r"}),
        save(tmp_path / "g.many", base, prev=r0),
    ]
    assert len({r0, *variants}) == 6
    assert str(r0).startswith("rcpt_") and Receipt.parse(str(r0)) == r0


def test_receipt_covers_descriptors_not_just_data(tmp_path: Path) -> None:
    save(tmp_path / "a.many", _state())
    raw = bytearray((tmp_path / "a.many").read_bytes())
    # Bump slot 1's generation: its bytes and hash are untouched, only the descriptor changes.
    gen_at = 256 + 64 * 1 + 24
    raw[gen_at] ^= 1
    (tmp_path / "a.many").write_bytes(bytes(raw))
    problems = verify(tmp_path / "a.many")
    assert len(problems) == 1 and "receipt mismatch" in problems[0]


def test_flipped_data_byte_names_the_slot(tmp_path: Path) -> None:
    save(tmp_path / "a.many", _state())
    info = load(tmp_path / "a.many").info("big")
    with open(tmp_path / "a.many", "r+b") as f:
        f.seek(info.offset + 100)
        b = f.read(1)
        f.seek(info.offset + 100)
        f.write(bytes([b[0] ^ 0x40]))
    problems = verify(tmp_path / "a.many")
    assert len(problems) == 1 and "slot 4 'big': content hash mismatch" in problems[0]
    with pytest.raises(ManyFormatError, match="'big': content hash mismatch"):
        load(tmp_path / "a.many", verify=True)


def test_chain_links_and_breaks(tmp_path: Path) -> None:
    paths, prev = [], None
    for step in range(3):
        p = tmp_path / f"ckpt-{step}.many"
        prev = save(p, _state(step), prev=prev, metadata={"step": step})
        paths.append(p)
    assert verify_chain(paths) == []
    assert load(paths[1]).prev_receipt == load(paths[0]).receipt
    assert load(paths[0]).prev_receipt is None
    problems = verify_chain([paths[0], paths[2]])
    assert len(problems) == 1 and problems[0].startswith(f"link {paths[0]} -> {paths[2]}")
    (paths[1]).write_bytes(paths[1].read_bytes()[:-4096])
    problems = verify_chain(paths)
    assert any(p.startswith(f"{paths[1]}: truncated") for p in problems)


def test_hash_false_is_flagged_as_unverifiable(tmp_path: Path) -> None:
    save(tmp_path / "a.many", {"x": np.ones(10)}, hash=False)
    np.testing.assert_array_equal(load(tmp_path / "a.many")["x"], np.ones(10))
    problems = verify(tmp_path / "a.many")
    assert problems == [
        "slot 0 'x': no content hash (saved with hash=False); its bytes cannot be verified"
    ]


# -- the live arena ------------------------------------------------------------------------


def test_arena_update_in_place_generations_and_commit(tmp_path: Path) -> None:
    path = tmp_path / "a.many"
    r0 = save(path, _state())
    size_before = path.stat().st_size
    with Arena(path) as arena:
        h = arena.handle("model.fc1.bias")
        assert h.generation == 0
        new_bias = np.full(64, 3.0, dtype=np.float32)
        h1 = arena.update(h, new_bias)
        assert h1.generation == 1
        np.testing.assert_array_equal(arena["model.fc1.bias"], new_bias)
        # Updated but not committed: the file says so.
        problems = verify(path)
        assert any("uncommitted" in p for p in problems)
        assert any("receipt mismatch" in p for p in problems)
        with pytest.raises(StaleHandleError, match="generation 0 but the slot is at generation 1"):
            arena.update(h, new_bias)
        arena.update(h1, new_bias * 2)
        arena.update("optim.step", np.array(8, dtype=np.int64))
        r1 = arena.commit()
    assert path.stat().st_size == size_before
    assert verify(path) == []
    ckpt = load(path)
    assert ckpt.prev_receipt == r0 and ckpt.receipt == r1 and ckpt.header.commit_seq == 1
    assert ckpt.info("model.fc1.bias").generation == 2
    assert ckpt.info("model.fc1.weight").generation == 0
    np.testing.assert_array_equal(ckpt["model.fc1.bias"], new_bias * 2)
    assert int(ckpt["optim.step"]) == 8
    # The arena's commits form a chain with the file before them.
    save(tmp_path / "before.many", _state())
    assert verify_chain([tmp_path / "before.many", path]) == []


def test_arena_refuses_missing_rights_and_layout_changes(tmp_path: Path) -> None:
    path = tmp_path / "a.many"
    save(
        path,
        {"frozen": np.ones(4), "w": np.ones(4), "wo": np.ones(4)},
        rights={"frozen": "r", "wo": "w"},
    )
    with Arena(path) as arena:
        with pytest.raises(RightsError, match="'frozen'.*write right"):
            arena.update("frozen", np.zeros(4))
        with pytest.raises(
            ValueError, match="float64 \\[4\\]; cannot update it in place with float32"
        ):
            arena.update("w", np.zeros(4, dtype=np.float32))
        with pytest.raises(ValueError, match="with float64 \\[5\\]"):
            arena.update("w", np.zeros(5))
        with pytest.raises(RightsError, match="read right"):
            arena["wo"]
        arena.update("wo", np.zeros(4))
        arena.commit()
    with pytest.raises(RightsError):
        load(path)["wo"]
    np.testing.assert_array_equal(load(path)["frozen"], np.ones(4))
    assert verify(path) == []


def test_arena_create_lays_out_a_sparse_zero_file(tmp_path: Path) -> None:
    path = tmp_path / "big.many"
    specs = {f"layer{i}": ((1024, 1024), np.float32) for i in range(64)}  # 256 MiB
    specs["bf"] = ((8,), "bfloat16")  # type: ignore[assignment]
    with Arena.create(path, specs, metadata={"kind": "layout"}) as arena:
        assert arena.info("layer3").shape == (1024, 1024)
        arena.update("layer3", np.ones((1024, 1024), dtype=np.float32))
        arena.commit()
    assert path.stat().st_size > 256 << 20
    assert path.stat().st_blocks * 512 < 32 << 20  # holes, not written zeros
    assert verify(path) == []
    ckpt = load(path)
    assert float(ckpt["layer3"].sum()) == 1024 * 1024 and float(ckpt["layer4"][0, 0]) == 0.0


def test_arena_update_from_torch_tensor(tmp_path: Path) -> None:
    path = tmp_path / "a.many"
    save(path, {"bf": torch.zeros(3, dtype=torch.bfloat16), "w": torch.zeros(2, 2)})
    with Arena(path) as arena:
        arena.update("bf", torch.ones(3, dtype=torch.bfloat16))
        arena.update("w", torch.eye(2, requires_grad=True))
        arena.commit()
    ckpt = load(path)
    assert torch.equal(ckpt.torch("bf"), torch.ones(3, dtype=torch.bfloat16))
    assert torch.equal(ckpt.torch("w"), torch.eye(2))


# -- atomic save -------------------------------------------------------------------------


def test_failed_save_leaves_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.many"
    r0 = save(path, _state(0))

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="Input/output"):
        save(path, _state(1))
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["a.many"]
    assert load(path).receipt == r0 and verify(path) == []


CRASH_WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    from serwatt.profiler.many import save
    path = sys.argv[1]
    i = 0
    print("ready", flush=True)
    while True:
        v = float(i % 2)
        save(path, {f"t{k}": np.full(1 << 20, v, dtype=np.float32) for k in range(8)},
             metadata={"version": i % 2})
        i += 1
    """
)


def test_sigkill_at_random_points_leaves_old_or_new(tmp_path: Path) -> None:
    """A writer saving 32 MiB checkpoints in a loop is SIGKILLed at random moments; each time
    the target is a complete, verifying checkpoint holding one version or the other."""
    path = tmp_path / "ckpt.many"
    save(
        path,
        {f"t{k}": np.full(1 << 20, 1.0, dtype=np.float32) for k in range(8)},
        metadata={"version": 1},
    )
    rng = np.random.default_rng(5)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for _ in range(6):
        proc = subprocess.Popen(
            [sys.executable, "-c", CRASH_WRITER, str(path)],
            stdout=subprocess.PIPE,
            env=env,
            cwd=tmp_path,
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(float(rng.uniform(0.05, 0.6)))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert verify(path) == []
        ckpt = load(path)
        version = ckpt.metadata["version"]
        assert all(float(ckpt[f"t{k}"][0]) == float(version) for k in range(8))
        assert float(ckpt["t7"][-1]) == float(version)
        ckpt.close()
        # Dead writers may leave a temp file behind; never the target's name.
        for leftover in tmp_path.glob(".ckpt.many.tmp-*"):
            leftover.unlink()


# -- malformed files ------------------------------------------------------------------------


def _rewrite(
    path: Path, *, header: dict | None = None, desc: dict | None = None, table: dict | None = None
) -> None:
    """Edit a valid file, then re-seal table hash and receipt so deeper checks are reached."""
    raw = bytearray(path.read_bytes())
    h = parse_header(bytes(raw[:HEADER_SIZE]), len(raw))
    n = h.slot_count
    if table is not None:
        tbytes = json.dumps(table).encode()
        raw[h.table_offset : h.table_offset + h.table_length] = bytes(h.table_length)
        raw[h.table_offset : h.table_offset + len(tbytes)] = tbytes
        h = replace(h, table_length=len(tbytes), table_hash=blake3.blake3(tbytes).digest())
    for (i, field), value in (desc or {}).items():
        fmt, off = {
            "offset": ("<Q", 0),
            "length": ("<Q", 8),
            "rights": ("<I", 16),
            "dtype": ("<H", 20),
        }[field]
        struct.pack_into(fmt, raw, 256 + 64 * i + off, value)
    h = replace(h, **(header or {}))
    packed = h.pack()
    packed = packed[:192] + receipt_digest(packed, bytes(raw[256 : 256 + 64 * n])) + packed[224:]
    raw[:256] = packed
    path.write_bytes(bytes(raw))


def _two_slot_file(tmp_path: Path) -> Path:
    path = tmp_path / "m.many"
    save(path, {"a": np.ones(2048, dtype=np.float32), "b": np.ones(1024, dtype=np.float64)})
    return path


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda p: p.write_bytes(b"PK\x03\x04" + p.read_bytes()[4:]), "bad magic"),
        (lambda p: p.write_bytes(p.read_bytes()[:100]), "truncated: file is 100 bytes"),
        (lambda p: p.write_bytes(p.read_bytes()[:-4096]), "truncated: header file_length"),
        (lambda p: p.write_bytes(p.read_bytes() + b"x"), "trailing bytes"),
        (lambda p: p.write_bytes(b""), "truncated: file is 0 bytes"),
        (
            lambda p: _rewrite(p, header={"version_minor": 0, "slot_count": 2**32 - 1}),
            "slot_count 4294967295",
        ),
        (lambda p: _rewrite(p, desc={(1, "offset"): 2**63}), "past the end"),
        (lambda p: _rewrite(p, desc={(1, "offset"): 2**64 - 4096}), "past the end"),
        (lambda p: _rewrite(p, desc={(0, "length"): 2**64 - 1}), "past the end"),
        (lambda p: _rewrite(p, desc={(1, "offset"): 0}), "overlap"),
        (lambda p: _rewrite(p, desc={(1, "offset"): 100}), "not page-aligned"),
        (lambda p: _rewrite(p, desc={(1, "dtype"): 99}), "unknown dtype code 99"),
        (lambda p: _rewrite(p, desc={(0, "rights"): 0x80}), "unknown rights bits"),
        (
            lambda p: _rewrite(p, table={"names": ["a", "a"], "shapes": [[2048], [1024]]}),
            "duplicate slot name 'a'",
        ),
        (lambda p: _rewrite(p, table={"names": ["a"], "shapes": [[2048]]}), "lists 1 names"),
        (
            lambda p: _rewrite(p, table={"names": ["a", 5], "shapes": [[2048], [1024]]}),
            "slot 1 has no name",
        ),
        (lambda p: _rewrite(p, table=[1, 2]), "must be a JSON object"),  # type: ignore[arg-type]
    ],
    ids=[
        "magic",
        "shorter-than-header",
        "truncated",
        "appended",
        "empty",
        "absurd-slot-count",
        "offset-huge",
        "offset-wraps",
        "length-huge",
        "overlap",
        "misaligned",
        "dtype",
        "rights",
        "duplicate-name",
        "slot-count-mismatch",
        "name-not-string",
        "table-not-object",
    ],
)
def test_malformed_files_raise_one_error_type_naming_the_problem(
    tmp_path: Path, edit, message: str
) -> None:
    path = _two_slot_file(tmp_path)
    edit(path)
    with pytest.raises(ManyFormatError, match=message):
        ckpt = load(path)
        for name in ckpt:
            ckpt[name]
    problems = verify(path)
    assert problems and any(message.split(" ")[0] in p for p in problems), problems


@pytest.mark.parametrize(
    "shape, message",
    [
        ([4096], "needs 32768 bytes, descriptor says 8192"),
        ([-1, -2048], "non-negative"),
        (["x"], "non-negative"),
        ([1] * 40, "at most 32"),
    ],
)
def test_bad_shapes_are_caught_at_bind_and_by_verify(
    tmp_path: Path, shape: list, message: str
) -> None:
    path = _two_slot_file(tmp_path)
    _rewrite(path, table={"names": ["a", "b"], "shapes": [[2048], shape]})
    ckpt = load(path)  # structure is sound; slot b's shape is checked when it is bound
    np.testing.assert_array_equal(ckpt["a"], np.ones(2048, dtype=np.float32))
    with pytest.raises(ManyFormatError, match=message):
        ckpt["b"]
    assert any(message in p for p in verify(path))
    with pytest.raises(ManyFormatError, match=message):
        Arena(path)


def test_corrupt_table_is_caught_by_its_hash(tmp_path: Path) -> None:
    path = _two_slot_file(tmp_path)
    raw = bytearray(path.read_bytes())
    h = parse_header(bytes(raw[:256]), len(raw))
    raw[h.table_offset + 3] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(ManyFormatError, match="name table hash does not match"):
        load(path)


def test_directory_and_missing_files(tmp_path: Path) -> None:
    assert verify(tmp_path)[0].endswith("is a directory, not a .many file")
    assert "cannot read" in verify(tmp_path / "missing.many")[0]
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing.many")


# -- CLI -----------------------------------------------------------------------------------


def _serwatt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "serwatt", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_cli_inspect_and_verify(tmp_path: Path) -> None:
    a, b = tmp_path / "a.many", tmp_path / "b.many"
    ra = save(a, _state(), metadata={"step": 3})
    save(b, _state(1), prev=ra)
    out = _serwatt("many", "inspect", str(a))
    assert out.returncode == 0, out.stderr
    assert str(ra) in out.stdout and "model.fc1.weight" in out.stdout and "64x33" in out.stdout
    doc = json.loads(_serwatt("many", "inspect", "--json", str(b)).stdout)
    assert doc["prev_receipt"] == str(ra) and len(doc["slots"]) == 5
    ok = _serwatt("many", "verify", str(a), str(b))
    assert ok.returncode == 0 and "ok: 2 files" in ok.stdout
    broken = _serwatt("many", "verify", str(b), str(a))
    assert broken.returncode == 1 and f"link {b} -> {a}" in broken.stdout
    info = load(a).info("big")
    with open(a, "r+b") as f:
        f.seek(info.offset)
        f.write(b"\0\0\0\0")
    bad = _serwatt("many", "verify", str(a))
    assert bad.returncode == 1 and "slot 4 'big': content hash mismatch" in bad.stdout
    missing = _serwatt("many", "verify", str(tmp_path / "nope.many"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
    (tmp_path / "junk.many").write_bytes(b"not a checkpoint at all" * 20)
    junk = _serwatt("many", "inspect", str(tmp_path / "junk.many"))
    assert junk.returncode == 1 and "bad magic" in junk.stderr
