""".many files made by an attacker or damaged under a reader: FIFOs, truncation while a real
process reads, a file replaced after load, hostile names and tables in `serwatt many inspect`.

Every case runs the real reader (or the real CLI) in a child process, so a hang is a timeout
and a SIGBUS is a return code, not a dead test runner.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import blake3
import numpy as np
import pytest
import torch

from serwatt.profiler.many import ManyError, ManyFormatError, load, save, verify
from serwatt.profiler.many.format import receipt_digest

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(REPO))
HANG_S = 15  # a reader that has not refused a FIFO by now is blocked in open(2) or read(2)
SIGBUS_CODES = (-signal.SIGBUS, 128 + signal.SIGBUS)


def _python(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=REPO,
        timeout=timeout,
    )


def _serwatt(
    *args: str, timeout: float = 60, prefix: Sequence[str] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "serwatt", *args],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=REPO,
        timeout=timeout,
    )


def reseal(raw: bytearray) -> bytes:
    """Recompute table hash and receipt after an edit, as anyone without a key can (FORMAT.md)."""
    (n,) = struct.unpack_from("<I", raw, 20)
    table_offset, table_length = struct.unpack_from("<QQ", raw, 40)
    raw[88:120] = blake3.blake3(bytes(raw[table_offset : table_offset + table_length])).digest()
    raw[192:224] = receipt_digest(bytes(raw[:256]), bytes(raw[256 : 256 + 64 * n]))
    return bytes(raw)


def replace_table(path: Path, table: bytes) -> None:
    """Put `table` (raw bytes, any encoding) in place of the name table and reseal the file."""
    raw = bytearray(path.read_bytes())
    table_offset, table_length, state_offset = struct.unpack_from("<QQQ", raw, 40)
    assert table_offset + len(table) <= state_offset, "test table does not fit the padding"
    raw[table_offset:state_offset] = table + bytes(state_offset - table_offset - len(table))
    struct.pack_into("<Q", raw, 48, len(table))
    path.write_bytes(reseal(raw))


# -- 5. FIFOs -------------------------------------------------------------------------------

FIFO_API = {
    "load": "from serwatt.profiler.many import load\ntry:\n    load(sys.argv[1])\n"
    "except Exception as exc:\n    print(type(exc).__name__, exc)",
    "verify": "from serwatt.profiler.many import verify\nprint(verify(sys.argv[1]))",
    "verify_chain": "from serwatt.profiler.many import verify_chain\n"
    "print(verify_chain([sys.argv[1], sys.argv[1]]))",
    "arena": "from serwatt.profiler.many import Arena\ntry:\n    Arena(sys.argv[1])\n"
    "except Exception as exc:\n    print(type(exc).__name__, exc)",
    # issue 45 item 13: torch_compat's hint for torch.save files peeked with a plain open
    "torch_compat": "from serwatt.profiler.many import torch_compat\ntry:\n"
    "    torch_compat.load(sys.argv[1])\nexcept Exception as exc:\n"
    "    print(type(exc).__name__, exc)",
    "load_state": "from serwatt.profiler.many import load_state\ntry:\n    "
    "load_state(sys.argv[1])\n"
    "except Exception as exc:\n    print(type(exc).__name__, exc)",
    "read_receipts": "from serwatt.profiler.many.verify import read_receipts\ntry:\n"
    "    read_receipts(sys.argv[1])\nexcept Exception as exc:\n"
    "    print(type(exc).__name__, exc)",
    "chain_head": "from serwatt.profiler.many import chain_head\nprint(chain_head([sys.argv[1]]))",
}


@pytest.mark.parametrize("how", [*FIFO_API, "cli-inspect", "cli-verify"])
def test_fifo_is_refused_without_blocking(tmp_path: Path, how: str) -> None:
    fifo = tmp_path / "ckpt.many"
    os.mkfifo(fifo)
    try:
        if how.startswith("cli-"):
            out = _serwatt("many", how[4:], str(fifo), timeout=HANG_S)
        else:
            out = _python("import sys\n" + FIFO_API[how], str(fifo), timeout=HANG_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{how} blocked on a FIFO for {HANG_S} s instead of refusing it")
    text = out.stdout + out.stderr
    assert "Traceback" not in text, text
    assert "FIFO" in text, text
    if how != "verify":  # verify() returns one file's problems; everything else names the file
        assert str(fifo) in text, text
    if how in ("load", "arena", "torch_compat", "load_state", "read_receipts"):
        assert out.stdout.startswith("ManyFormatError"), text
    if how.startswith("cli-"):
        assert out.returncode == 2, text  # the wrong kind of file is bad input


def test_device_node_is_refused(tmp_path: Path) -> None:
    for path in ("/dev/null", "/dev/zero"):
        with pytest.raises(ManyFormatError, match="character device"):
            load(path)
        assert any("character device" in p for p in verify(path))


# -- 6. truncation under a reader -------------------------------------------------------------

# blake3 is wrapped only to stop the verifier, deterministically, between opening the file and
# hashing the first slot: the moment a real truncation does damage.
GATED_VERIFY = r"""
import json, sys
import blake3

_real = blake3.blake3


class GatedHasher:
    AUTO = _real.AUTO
    fired = False

    def __init__(self, data=b"", **kw):
        self._h = _real(**kw)
        if len(memoryview(data)):
            self.update(data)

    def update(self, data):
        if not GatedHasher.fired and memoryview(data).nbytes >= 1 << 20:
            GatedHasher.fired = True
            print("hashing", flush=True)
            sys.stdin.readline()
        self._h.update(data)
        return self

    def digest(self, *a, **kw):
        return self._h.digest(*a, **kw)


blake3.blake3 = GatedHasher
from serwatt.profiler.many import verify

print(json.dumps(verify(sys.argv[1])), flush=True)
"""

TRUNCATE = "import os, sys\nos.truncate(sys.argv[1], int(sys.argv[2]))"

LOAD_THEN_TOUCH = r"""
import sys
from serwatt.profiler.many import ManyError, load

ckpt = load(sys.argv[1])
print("loaded", flush=True)
sys.stdin.readline()
for what in ("view", "torch"):
    try:
        x = ckpt["big"] if what == "view" else ckpt.torch("big")
        print(what, "bound", float(x.sum()), flush=True)
    except ManyError as exc:
        print(what, "refused:", exc, flush=True)
print("alive", len(ckpt.slots()), ckpt.receipt)
"""


def _big_file(tmp_path: Path) -> Path:
    path = tmp_path / "big.many"
    save(
        path,
        {
            "big": np.arange(4 << 20, dtype=np.float32),  # 16 MiB: several read chunks
            "small": np.ones(1000),
        },
    )
    return path


def _run_with_truncation(script: str, path: Path, ready: str, size: int) -> tuple[int, str]:
    """Start `script` on `path`; once it prints `ready`, a second process truncates the file."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=REPO,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline().strip()
        assert line == ready, (line, proc.stderr.read() if proc.stderr else "")
        cut = _python(TRUNCATE, str(path), str(size))
        assert cut.returncode == 0, cut.stderr
        assert path.stat().st_size == size
        out, err = proc.communicate("go\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode not in SIGBUS_CODES, f"reader died of SIGBUS:\n{err}"
    assert proc.returncode == 0, err
    return proc.returncode, out


def test_verify_reports_a_file_truncated_while_it_reads(tmp_path: Path) -> None:
    path = _big_file(tmp_path)
    _, out = _run_with_truncation(GATED_VERIFY, path, "hashing", 8192)
    problems = json.loads(out.splitlines()[-1])
    assert any("truncated" in p for p in problems), problems
    assert any(str(8192) in p for p in problems), problems


def test_load_refuses_to_bind_after_truncation_instead_of_crashing(tmp_path: Path) -> None:
    path = _big_file(tmp_path)
    _, out = _run_with_truncation(LOAD_THEN_TOUCH, path, "loaded", 8192)
    lines = out.splitlines()
    assert lines[0].startswith("view refused:") and "truncated" in lines[0], out
    assert str(path) in lines[0] and "8192" in lines[0], out
    assert lines[1].startswith("torch refused:") and "truncated" in lines[1], out
    assert lines[2].startswith("alive 2 rcpt_"), out


def test_load_verify_reads_through_the_descriptor(tmp_path: Path) -> None:
    """load(verify=True) checks the bytes it maps; a file shorter than its header says is named."""
    path = _big_file(tmp_path)
    with load(path, verify=True) as ckpt:
        assert float(ckpt["big"][-1]) == float((4 << 20) - 1)
    os.truncate(path, 8192)
    with pytest.raises(ManyFormatError, match="truncated"):
        load(path, verify=True)


# -- 7. torch() bound to the file opened at load ---------------------------------------------


def test_torch_tensor_comes_from_the_file_opened_at_load(tmp_path: Path) -> None:
    path = tmp_path / "c.many"
    old = np.arange(4096, dtype=np.float32)
    save(path, {"w": old, "h": old.astype(np.float16)})
    ckpt = load(path)
    view = ckpt["w"]
    # Another writer saves over the same path (atomic rename: a new file under the old name).
    writer = _python(
        "import sys, numpy as np\nfrom serwatt.profiler.many import save\n"
        "save(sys.argv[1], {'w': np.full(4096, 1000, np.float32),"
        " 'h': np.zeros(4096, np.float16)})",
        str(path),
    )
    assert writer.returncode == 0, writer.stderr
    t = ckpt.torch("w")
    np.testing.assert_array_equal(view, old)
    assert torch.equal(t, torch.from_numpy(old)), "torch() read the new file, numpy the old"
    assert torch.equal(ckpt.torch("h"), torch.from_numpy(old.astype(np.float16)))
    # The tensor is a private copy-on-write page: writing it touches no file.
    t[0] = -1.0
    assert float(view[0]) == 0.0
    with load(path) as new:
        assert float(new["w"][0]) == 1000.0
    ckpt.close()


def test_torch_works_after_the_file_is_unlinked(tmp_path: Path) -> None:
    path = tmp_path / "gone.many"
    save(path, {"w": np.arange(10, dtype=np.int64)})
    ckpt = load(path)
    path.unlink()
    assert ckpt.torch("w").tolist() == list(range(10))
    ckpt.close()


def _gapped_state() -> dict[str, np.ndarray]:
    return {
        "a": np.arange(1000, dtype=np.float32),  # 4000 bytes: a 96-byte gap follows it
        "b": np.full(100, 3.0),  # last slot: 800 bytes, then zeros to the page end
    }


# -- 8c. bytes the format says are zero ---------------------------------------------------


def test_bytes_the_format_says_are_zero_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "z.many"
    save(path, _gapped_state())
    clean = path.read_bytes()
    with load(path) as ckpt:
        a, b = ckpt.info("a"), ckpt.info("b")
        table_end = ckpt.header.table_offset + ckpt.header.table_length
    edits = {
        "padding between the name table and the state region": table_end + 5,
        "gap after slot 0 'a'": a.offset + a.length + 3,
        "after the last slot, 1 'b'": b.offset + b.length + 100,
    }
    raw = bytearray(clean)
    for where, at in edits.items():
        one = bytearray(clean)
        one[at] = 0x41
        path.write_bytes(bytes(one))
        problems = verify(path)
        assert len(problems) == 1 and where in problems[0] and "not zero" in problems[0], problems
        raw[at] = 0x41
    path.write_bytes(bytes(raw))
    assert len(verify(path)) == 3
    # A descriptor hash of an unhashed slot must be zero too.
    save(path, _gapped_state(), hash=False)
    raw = bytearray(path.read_bytes())
    raw[256 + 32] = 1
    path.write_bytes(reseal(raw))
    assert any("hash field is not zero" in p for p in verify(path))
    # Reserved header bytes (already checked before signing existed).
    save(path, _gapped_state())
    raw = bytearray(path.read_bytes())
    raw[160] = 1
    path.write_bytes(reseal(raw))
    assert any("reserved" in p for p in verify(path))


# -- 12. inspect on hostile names and tables -------------------------------------------------


def test_inspect_escapes_control_characters_in_names(tmp_path: Path) -> None:
    path = tmp_path / "esc.many"
    names = ["\x1b]0;owned\x07", "\x1b[2Jclear", "tab\tnew\nline", "\u202eevil", "plain"]
    save(path, {n: np.ones(3, dtype=np.float32) for n in names}, metadata={"m": "\x1b[31m"})
    for args in (["inspect", str(path)], ["inspect", "--json", str(path)]):
        out = _serwatt("many", *args)
        assert out.returncode == 0, out.stderr
        for bad in ("\x1b", "\x07", "\u202e", "\t"):
            assert bad not in out.stdout, (bad, out.stdout)
    text = _serwatt("many", "inspect", str(path)).stdout
    assert "\\x1b]0;owned\\x07" in text and "tab\\tnew\\nline" in text and "\\u202eevil" in text
    # The JSON document still carries the exact names.
    doc = json.loads(_serwatt("many", "inspect", "--json", str(path)).stdout)
    assert [s["name"] for s in doc["slots"]] == names
    # Problems that name a slot are escaped too.
    raw = bytearray(path.read_bytes())
    info = load(path).info("\x1b[2Jclear")
    raw[info.offset] ^= 0xFF
    path.write_bytes(bytes(raw))
    bad = _serwatt("many", "verify", str(path))
    assert bad.returncode == 1 and "content hash mismatch" in bad.stdout
    assert "\x1b" not in bad.stdout + bad.stderr


def test_inspect_output_is_linear_in_name_length(tmp_path: Path) -> None:
    path = tmp_path / "long.many"
    slots = 300
    long_name = "n" * 200_000
    state = {f"s{i}": np.zeros(0, dtype=np.float32) for i in range(slots - 1)}
    state[long_name] = np.zeros(0, dtype=np.float32)
    save(path, state)
    out = _serwatt("many", "inspect", str(path))
    assert out.returncode == 0, out.stderr
    assert len(out.stdout) < slots * 200 + 2000, len(out.stdout)
    long_line = next(line for line in out.stdout.splitlines() if "nnnn" in line)
    assert "200000" in long_line and len(long_line) < 200, long_line


def _nan_file(tmp_path: Path) -> Path:
    path = tmp_path / "nan.many"
    save(path, {"a": np.ones(4, dtype=np.float32)})
    table = json.dumps(
        {"names": ["a"], "shapes": [[4]], "metadata": {"x": float("nan"), "y": [float("inf")]}}
    ).encode()
    assert b"NaN" in table and b"Infinity" in table
    replace_table(path, table)
    return path


def test_inspect_json_is_strict_json(tmp_path: Path) -> None:
    path = _nan_file(tmp_path)
    out = _serwatt("many", "inspect", "--json", str(path))
    assert out.returncode == 0, out.stderr

    def refuse(constant: str) -> None:
        raise AssertionError(f"inspect --json printed the non-JSON constant {constant}")

    doc = json.loads(out.stdout, parse_constant=refuse)
    assert doc["metadata"] == {"x": "NaN", "y": ["Infinity"]}


def test_utf16_name_table_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "u16.many"
    save(path, {"a": np.ones(4, dtype=np.float32)})
    replace_table(path, json.dumps({"names": ["a"], "shapes": [[4]]}).encode("utf-16"))
    with pytest.raises(ManyFormatError, match="UTF-8"):
        load(path)
    assert any("UTF-8" in p for p in verify(path))
    out = _serwatt("many", "inspect", str(path))
    assert out.returncode == 1 and "UTF-8" in out.stderr and "Traceback" not in out.stderr


@pytest.fixture
def unreadable_file() -> Iterator[tuple[Path, list[str]]]:
    """A real .many file this test's child cannot open (as root: run the child as nobody)."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot make a file unreadable")
        prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    top = Path(tempfile.mkdtemp(prefix="many-perm-"))
    try:
        top.chmod(0o755)
        path = top / "secret.many"
        save(path, {"a": np.ones(4, dtype=np.float32)})
        path.chmod(0)
        yield path, prefix
    finally:
        shutil.rmtree(top)


def test_unreadable_file_is_one_error_line(unreadable_file: tuple[Path, list[str]]) -> None:
    path, prefix = unreadable_file
    for action in ("inspect", "verify"):
        out = _serwatt("many", action, str(path), prefix=prefix)
        assert out.returncode == 1, (action, out.stdout, out.stderr)
        assert "Traceback" not in out.stderr, out.stderr
        lines = [line for line in (out.stdout + out.stderr).splitlines() if str(path) in line]
        assert len(lines) == 1 and "ermission denied" in lines[0], (action, out.stdout, out.stderr)


def test_missing_and_directory_are_usage_errors(tmp_path: Path) -> None:
    for target, message in ((tmp_path / "nope.many", "no such file"), (tmp_path, "directory")):
        out = _serwatt("many", "inspect", str(target))
        assert out.returncode == 2 and message in out.stderr and str(target) in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_bad_magic_does_not_echo_the_file(tmp_path: Path) -> None:
    path = tmp_path / "junk.many"
    path.write_bytes(b"\x1b[31mEVIL-CONTENT" + bytes(300))
    out = _serwatt("many", "inspect", str(path))
    assert out.returncode == 1 and "bad magic" in out.stderr
    assert "EVIL" not in out.stderr and "31mEV" not in out.stderr and "\x1b" not in out.stderr
    assert "89 4d 41 4e 59 0d 0a 1a" in out.stderr, out.stderr
    with pytest.raises(ManyError, match="bad magic"):
        load(path)
