"""Receipts prove consistency; Ed25519 signatures make a chain tamper-evident.

A forger without the key can change data, recompute every hash, re-link the chain, strip the
signature or sign with a key of their own: plain `verify` cannot tell (a receipt is not a
signature), `verify --key` must. Bytes the format says are zero must be zero.
"""

from __future__ import annotations

import os
import shutil
import stat
import struct
import subprocess
from pathlib import Path

import blake3
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from serwatt.profiler.many import (
    Arena,
    ManyError,
    Receipt,
    chain_head,
    generate_signing_key,
    load,
    load_public_key,
    load_signing_key,
    save,
    verify,
    verify_chain,
)
from tests.many.test_many_hostile import _serwatt, reseal

SIG_BLOCK = 128


def _state(k: int) -> dict[str, np.ndarray]:
    return {
        "a": np.arange(1000, dtype=np.float32) + k,  # 4000 bytes: a 96-byte gap follows it
        "b": np.full(100, k, dtype=np.float64),  # last slot: 800 bytes, then zeros to 4096
    }


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    out = _serwatt("many", "keygen", str(tmp_path / "signer"))
    assert out.returncode == 0, out.stderr
    return tmp_path / "signer", tmp_path / "signer.pub"


def _chain(tmp_path: Path, key: object | None, n: int = 3) -> list[Path]:
    paths, prev = [], None
    for k in range(n):
        p = tmp_path / f"ckpt-{k}.many"
        prev = save(p, _state(k), prev=prev, signing_key=key)
        paths.append(p)
    return paths


def _forge_slot_b(path: Path, value: float, prev: Receipt | None = None) -> None:
    """Change slot b's data and recompute its hash and the receipt: what anyone can do."""
    raw = bytearray(path.read_bytes())
    info = load(path).info("b")
    raw[info.offset : info.offset + info.length] = np.full(100, value).tobytes()
    desc = 256 + 64 * info.index
    raw[desc + 32 : desc + 64] = blake3.blake3(
        raw[info.offset : info.offset + info.length]
    ).digest()
    if prev is not None:
        raw[120:152] = prev.digest
    path.write_bytes(reseal(raw))


# -- (a) what a receipt proves, and (b) what a signature adds ---------------------------------


def test_signed_chain_verifies_with_the_key(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    private, public = keys
    paths = _chain(tmp_path, load_signing_key(private))
    assert verify_chain(paths, key=load_public_key(public)) == []
    out = _serwatt("many", "verify", "--key", str(public), *map(str, paths))
    assert out.returncode == 0 and "ok: 3 files" in out.stdout, out.stdout + out.stderr
    assert "signed" in out.stdout


def test_forged_chain_passes_receipts_and_fails_the_key(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    private, public = keys
    paths = _chain(tmp_path, load_signing_key(private))
    # Forge ckpt-1, re-link ckpt-2 to the forged receipt, strip both signatures.
    _forge_slot_b(paths[1], 99.0)
    _forge_slot_b(paths[2], 2.0, prev=load(paths[1]).receipt)
    for p in paths[1:]:
        raw = bytearray(p.read_bytes())
        (state_offset,) = struct.unpack_from("<Q", raw, 56)
        raw[state_offset - SIG_BLOCK : state_offset] = bytes(SIG_BLOCK)
        p.write_bytes(bytes(raw))
    # Receipts prove consistency only: the forged chain is consistent.
    assert verify_chain(paths) == []
    out = _serwatt("many", "verify", "--key", str(public), *map(str, paths))
    assert out.returncode == 1, out.stdout
    assert f"{paths[1]}: not signed" in out.stdout and f"{paths[2]}: not signed" in out.stdout
    assert f"{paths[0]}:" not in out.stdout


def test_forged_data_under_a_kept_signature_fails_even_without_the_key(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    private, public = keys
    paths = _chain(tmp_path, load_signing_key(private), n=1)
    _forge_slot_b(paths[0], 7.0)
    assert any("signature does not match" in p for p in verify(paths[0]))
    problems = verify(paths[0], key=load_public_key(public))
    assert any("signature does not match" in p for p in problems), problems


def test_chain_resigned_with_another_key_fails(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    _, public = keys
    mallory = Ed25519PrivateKey.generate()
    paths = _chain(tmp_path, mallory)
    assert verify_chain(paths) == []  # self-consistent: signed, just not by us
    out = _serwatt("many", "verify", "--key", str(public), *map(str, paths))
    assert out.returncode == 1
    assert out.stdout.count("signed by a different key") == 3, out.stdout


def test_unsigned_chain_and_file_fail_with_key(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    _, public = keys
    paths = _chain(tmp_path, None)
    assert verify_chain(paths) == []
    for args in (map(str, paths), [str(paths[0])]):
        out = _serwatt("many", "verify", "--key", str(public), *args)
        assert out.returncode == 1 and "not signed" in out.stdout, out.stdout


def test_arena_commit_signs_and_an_unsigned_commit_drops_the_signature(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    private, public = keys
    key, pub = load_signing_key(private), load_public_key(public)
    path = tmp_path / "live.many"
    first = save(path, _state(0), signing_key=key)
    with Arena(path) as arena:
        arena.update("b", np.full(100, 5.0))
        second = arena.commit(signing_key=key)
    assert verify(path, key=pub) == []
    with load(path) as ckpt:
        assert ckpt.prev_receipt == first and ckpt.receipt == second
        assert ckpt.signer == pub.public_bytes_raw()
    with Arena(path) as arena:
        arena.update("b", np.full(100, 6.0))
        arena.commit()
    assert verify(path) == []  # consistent, and no stale signature left behind
    assert any("not signed" in p for p in verify(path, key=pub))
    with Arena(path) as arena:
        arena.update("b", np.full(100, 7.0))
        arena.commit(signing_key=key)
    assert verify(path, key=pub) == []


def test_signature_block_is_where_format_md_says(tmp_path: Path) -> None:
    """Read the signature independently: last 128 bytes before state_offset, version 1.1."""
    key = Ed25519PrivateKey.generate()
    path = tmp_path / "s.many"
    receipt = save(path, _state(0), signing_key=key)
    raw = path.read_bytes()
    major, minor = struct.unpack_from("<HH", raw, 8)
    assert (major, minor) == (1, 1)
    (state_offset,) = struct.unpack_from("<Q", raw, 56)
    block = raw[state_offset - SIG_BLOCK : state_offset]
    magic, algorithm = struct.unpack_from("<8sH", block, 0)
    assert magic == b"MANYSIG1" and algorithm == 1 and block[10:16] == bytes(6)
    public, signature = block[16:48], block[48:112]
    assert block[112:] == bytes(16)
    assert public == key.public_key().public_bytes_raw()
    Ed25519PublicKey.from_public_bytes(public).verify(
        signature, b"serwatt.many.signature.v1\0" + receipt.digest
    )


def test_version_1_0_files_stay_readable(tmp_path: Path) -> None:
    """A 1.0 file whose name table ends right before the state region (no room to sign)."""
    path = tmp_path / "old.many"
    save(path, {"a": np.ones(4, dtype=np.float32)})
    raw = bytearray(path.read_bytes())
    table_offset, _, state_offset = struct.unpack_from("<QQQ", raw, 40)
    filler = "x" * (state_offset - table_offset - 60)
    table = b'{"names":["a"],"shapes":[[4]],"metadata":{"f":"' + filler.encode() + b'"}}'
    assert state_offset - SIG_BLOCK < table_offset + len(table) <= state_offset
    raw[table_offset : table_offset + len(table)] = table
    struct.pack_into("<Q", raw, 48, len(table))
    struct.pack_into("<H", raw, 10, 0)
    path.write_bytes(reseal(raw))
    assert verify(path) == []
    with load(path) as ckpt:
        assert ckpt.header.version_minor == 0 and ckpt.signer is None
        assert ckpt["a"].tolist() == [1.0] * 4
    with Arena(path) as arena, pytest.raises(ManyError, match="no room for a signature"):
        arena.commit(signing_key=Ed25519PrivateKey.generate())


def test_key_files(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    private, public = keys
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    # keygen never overwrites a key
    again = _serwatt("many", "keygen", str(private))
    assert again.returncode == 2 and "exists" in again.stderr
    # a raw hex public key file works like the PEM one
    hex_pub = tmp_path / "signer.hex"
    hex_pub.write_text(load_public_key(public).public_bytes_raw().hex() + "\n")
    paths = _chain(tmp_path, load_signing_key(private), n=2)
    out = _serwatt("many", "verify", "--key", str(hex_pub), *map(str, paths))
    assert out.returncode == 0, out.stdout + out.stderr
    junk = tmp_path / "junk.pub"
    junk.write_text("not a key")
    bad = _serwatt("many", "verify", "--key", str(junk), *map(str, paths))
    assert bad.returncode == 2 and "Ed25519 public key" in bad.stderr and str(junk) in bad.stderr
    generated = generate_signing_key(tmp_path / "api")
    assert generated == (tmp_path / "api", tmp_path / "api.pub")
    with pytest.raises(FileExistsError):
        generate_signing_key(tmp_path / "api")


def _openssl(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["openssl", *args], input=stdin, capture_output=True, timeout=60)


def test_openssl_keys_work(tmp_path: Path) -> None:
    """A key pair made by OpenSSL signs: OpenSSL itself accepts the signature serwatt wrote
    (and makes the same one: Ed25519 is deterministic), and refuses it with one bit flipped,
    as `serwatt many verify --key` does."""
    assert shutil.which("openssl"), "openssl missing: apt-get install openssl"
    key, pub = tmp_path / "k.pem", tmp_path / "k.pub"
    assert _openssl("genpkey", "-algorithm", "ed25519", "-out", str(key)).returncode == 0
    assert _openssl("pkey", "-in", str(key), "-pubout", "-out", str(pub)).returncode == 0
    paths = _chain(tmp_path, load_signing_key(key), n=2)
    out = _serwatt("many", "verify", "--key", str(pub), *map(str, paths))
    assert out.returncode == 0 and "signed" in out.stdout, out.stdout + out.stderr

    # The signed message and the signature, where profiler/many/FORMAT.md puts them.
    raw = paths[1].read_bytes()
    (state_offset,) = struct.unpack_from("<Q", raw, 56)
    signature = raw[state_offset - SIG_BLOCK + 48 : state_offset - SIG_BLOCK + 112]
    message = tmp_path / "message"
    message.write_bytes(b"serwatt.many.signature.v1\0" + load(paths[1]).receipt.digest)
    sig_file = tmp_path / "sig"
    sig_file.write_bytes(signature)
    verify_args = ["pkeyutl", "-verify", "-pubin", "-inkey", str(pub), "-rawin"]
    verify_args += ["-in", str(message), "-sigfile", str(sig_file)]
    ok = _openssl(*verify_args)
    assert ok.returncode == 0 and b"Signature Verified Successfully" in ok.stdout, ok
    signed = _openssl("pkeyutl", "-sign", "-inkey", str(key), "-rawin", "-in", str(message))
    assert signed.returncode == 0 and signed.stdout == signature, signed

    # One bit of the signature flipped: OpenSSL refuses it, and so does serwatt.
    sig_file.write_bytes(bytes([signature[0] ^ 1]) + signature[1:])
    bad = _openssl(*verify_args)
    assert bad.returncode != 0 and b"Signature Verification Failure" in bad.stdout, bad
    tampered = bytearray(raw)
    tampered[state_offset - SIG_BLOCK + 48] ^= 1
    paths[1].write_bytes(bytes(tampered))
    out = _serwatt("many", "verify", "--key", str(pub), *map(str, paths))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"{paths[1]}: signature does not match" in out.stdout, out.stdout
    assert f"{paths[0]}:" not in out.stdout


# -- (d) anchoring a chain head -------------------------------------------------------------


def test_chain_head_names_head_length_and_first_break(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    private, public = keys
    paths = _chain(tmp_path, load_signing_key(private), n=4)
    receipts = [load(p).receipt for p in paths]
    head = chain_head(paths, key=load_public_key(public))
    assert head == (receipts[3], 4, None)
    assert verify_chain(paths, head=receipts[3]) == []
    # Rolled back: the last file is gone; the anchored head says so.
    assert any(
        "head" in p and str(receipts[3]) in p for p in verify_chain(paths[:3], head=receipts[3])
    )
    cli = _serwatt("many", "verify", "--head", str(receipts[3]), *map(str, paths[:3]))
    assert cli.returncode == 1 and str(receipts[3]) in cli.stdout
    # Broken at the third file: the head is the last sound link before it.
    save(paths[2], _state(9), prev=receipts[0], signing_key=load_signing_key(private))
    head = chain_head(paths, key=load_public_key(public))
    assert head.head == receipts[1] and head.length == 2
    assert head.first_break is not None and str(paths[2]) in head.first_break
    # A file that does not verify ends the chain too.
    os.truncate(paths[0], 4096)
    broken = chain_head(paths)
    assert broken.head is None and broken.length == 0
    assert broken.first_break is not None and str(paths[0]) in broken.first_break
    assert "truncated" in broken.first_break
