"""`serwatt ab --swap torch` on a damaged torch.save zip (issue 45 item 14): whatever the zip
or its pickle does wrong (a compression method that is not there, an encryption flag, a
bad CRC, a cut-off file, a damaged pickle), the A/B refuses with the file's name and the fix,
never a traceback. The pickle is only scanned (pickletools), never unpickled."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from serwatt.profiler.exitcodes import EXIT_USAGE
from serwatt.profiler.profile.pickle_scan import unsupported_by_swap

PY = sys.executable
REPO = Path(__file__).resolve().parents[2]


def _pkl_entry(raw: bytes) -> tuple[int, int]:
    """(local header offset, central directory header offset) of the data.pkl member."""
    with zipfile.ZipFile(__import__("io").BytesIO(raw)) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith("data.pkl"))
    name = info.filename.encode()
    central = raw.index(b"PK\x01\x02", info.header_offset + 30)
    while raw[central + 46 : central + 46 + len(name)] != name:
        central = raw.index(b"PK\x01\x02", central + 4)
    return info.header_offset, central


def _set_method(method: int) -> Callable[[bytes], bytes]:
    def damage(raw: bytes) -> bytes:
        local, central = _pkl_entry(raw)
        out = bytearray(raw)
        struct.pack_into("<H", out, local + 8, method)
        struct.pack_into("<H", out, central + 10, method)
        return bytes(out)

    return damage


def _encrypted(raw: bytes) -> bytes:
    local, central = _pkl_entry(raw)
    out = bytearray(raw)
    for at in (local + 6, central + 8):
        (flags,) = struct.unpack_from("<H", out, at)
        struct.pack_into("<H", out, at, flags | 0x1)
    return bytes(out)


def _bad_crc(raw: bytes) -> bytes:
    local, _central = _pkl_entry(raw)
    (name_len, extra_len) = struct.unpack_from("<HH", raw, local + 26)
    at = local + 30 + name_len + extra_len + 3  # a byte of the pickle itself
    out = bytearray(raw)
    out[at] ^= 0xFF
    return bytes(out)


def _damaged_pickle(raw: bytes) -> bytes:
    """The pickle cut short, with its CRC and sizes fixed so the zip itself is sound."""
    import io

    src = zipfile.ZipFile(io.BytesIO(raw))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):
                data = data[: len(data) // 2]
            dst.writestr(info.filename, data)
    return buf.getvalue()


DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "deflate-over-stored": _set_method(zipfile.ZIP_DEFLATED),  # zlib.error
    "unknown-method": _set_method(99),  # NotImplementedError
    "lzma-over-stored": _set_method(zipfile.ZIP_LZMA),  # lzma.LZMAError
    "bzip2-over-stored": _set_method(zipfile.ZIP_BZIP2),  # OSError
    "encrypted": _encrypted,  # RuntimeError
    "bad-crc": _bad_crc,  # BadZipFile
    "truncated": lambda raw: raw[: len(raw) - 40],  # BadZipFile
    "damaged-pickle": _damaged_pickle,  # ValueError from pickletools
}


def _damaged(tmp_path: Path, how: str) -> Path:
    good = tmp_path / "good.pt"
    torch.save({"w": torch.arange(64.0), "step": 3}, good)
    bad = tmp_path / "ckpt.pt"
    bad.write_bytes(DAMAGE[how](good.read_bytes()))
    return bad


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_zip_is_a_refusal_naming_the_file(tmp_path: Path, how: str) -> None:
    bad = _damaged(tmp_path, how)
    problems = unsupported_by_swap([str(bad)])
    assert len(problems) == 1, problems
    assert problems[0].startswith("ckpt.pt: a damaged torch.save file"), problems
    assert "torch.load" in problems[0] and "--candidate" in problems[0], problems


def test_ab_swap_on_a_damaged_zip_refuses_without_a_traceback(tmp_path: Path) -> None:
    bad = _damaged(tmp_path, "deflate-over-stored")
    (tmp_path / "ck").mkdir()
    copy = f"import shutil, sys, time; time.sleep(1); shutil.copy({str(bad)!r}, sys.argv[1])"
    r = subprocess.run(
        [
            PY, "-m", "serwatt", "ab", "--swap", "torch", "--repeats", "2",
            "--checkpoints", "ck", "--record", "r.sqlite",
            "--", PY, "-c", copy, "{dir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == EXIT_USAGE, r.stderr
    assert "--swap torch" in r.stderr and "ckpt.pt: a damaged torch.save file" in r.stderr
