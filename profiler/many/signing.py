"""Ed25519 signatures over `.many` receipts: what turns a consistent chain into an authentic one.

A receipt is a hash anyone can recompute after changing a file; a signature over it can only
be made with the private key. The signature block's layout is in FORMAT.md; this module
makes and checks signatures and reads key files. `cryptography` is imported on first use,
so reading unsigned files never pays for it.

Key files: a private key is PEM PKCS#8 (`serwatt many keygen`, or
`openssl genpkey -algorithm ed25519`) or 64 hex digits (the raw 32-byte seed); a public key
is PEM SubjectPublicKeyInfo (`openssl pkey -pubout`), an OpenSSH `ssh-ed25519` line, or 64
hex digits.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serwatt.profiler.many.format import pack_signature_block, signed_message

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

_HEX_KEY = re.compile(r"[0-9a-fA-F]{64}")
_MAX_KEY_FILE = 64 << 10  # a key file is a few hundred bytes; refuse to slurp anything big


@dataclass(frozen=True)
class SignatureInfo:
    """A file's signature: the raw Ed25519 public key it names, and whether the signature
    matches the file's stored receipt under that key."""

    public_key: bytes
    valid: bool

    @property
    def key_id(self) -> str:
        return key_id(self.public_key)


def key_id(public_key: bytes) -> str:
    """Short printable name of a public key: `ed25519:` and its first 8 bytes in hex."""
    return f"ed25519:{public_key[:8].hex()}"


def coerce_signing_key(key: Any) -> Ed25519PrivateKey:
    """An Ed25519 private key object from itself or its raw 32-byte seed."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if isinstance(key, Ed25519PrivateKey):
        return key
    if isinstance(key, bytes | bytearray) and len(key) == 32:
        return Ed25519PrivateKey.from_private_bytes(bytes(key))
    raise TypeError(
        "signing_key must be an Ed25519PrivateKey (see many.load_signing_key) or its raw "
        f"32-byte seed, not {type(key).__name__}"
    )


def public_key_bytes(key: Any) -> bytes:
    """The raw 32 bytes of an Ed25519 public key given as an object or as bytes."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if isinstance(key, Ed25519PublicKey):
        return key.public_bytes_raw()
    if isinstance(key, bytes | bytearray) and len(key) == 32:
        return bytes(key)
    raise TypeError(
        "key must be an Ed25519PublicKey (see many.load_public_key) or its raw 32 bytes, "
        f"not {type(key).__name__}"
    )


def signature_block(key: Any, receipt: bytes) -> bytes:
    """The 128-byte signature block signing `receipt` (a 32-byte digest) with `key`."""
    private = coerce_signing_key(key)
    signature = private.sign(signed_message(receipt))
    return pack_signature_block(private.public_key().public_bytes_raw(), signature)


def signature_valid(public_key: bytes, signature: bytes, receipt: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, signed_message(receipt))
    except (InvalidSignature, ValueError):
        return False
    return True


def _read_key_file(path: str | os.PathLike[str]) -> bytes:
    # O_NONBLOCK and a regular file only: a FIFO would block the open, a device never end
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{os.fspath(path)}: not a regular file (a FIFO, device or directory)")
        raw = f.read(_MAX_KEY_FILE + 1)
    if len(raw) > _MAX_KEY_FILE:
        raise ValueError(f"{os.fspath(path)}: {_MAX_KEY_FILE}+ bytes is too big for a key file")
    return raw


def load_signing_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM PKCS#8 file (unencrypted) or 64 hex digits.

    Raises ValueError naming the file when it holds anything else.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    raw = _read_key_file(path)
    text = raw.strip()
    if _HEX_KEY.fullmatch(text.decode("ascii", "replace")):
        return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(text.decode()))
    try:
        key = load_pem_private_key(raw, password=None)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"{os.fspath(path)}: not an Ed25519 private key (expected an unencrypted PEM "
            f"PKCS#8 file from `serwatt many keygen`, or 64 hex digits): {exc}"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{os.fspath(path)}: a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file, an OpenSSH `ssh-ed25519` line or 64 hex digits.

    Raises ValueError naming the file when it holds anything else.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import (
        load_pem_public_key,
        load_ssh_public_key,
    )

    raw = _read_key_file(path)
    text = raw.strip()
    what = (
        f"{os.fspath(path)}: not an Ed25519 public key (expected a PEM 'PUBLIC KEY' file "
        "such as `serwatt many keygen` writes to NAME.pub, an ssh-ed25519 line, or 64 hex digits)"
    )
    key: object
    if _HEX_KEY.fullmatch(text.decode("ascii", "replace")):
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(text.decode()))
    try:
        key = load_ssh_public_key(text) if text.startswith(b"ssh-") else load_pem_public_key(raw)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{what}: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{what}: it holds a {type(key).__name__}")
    return key


def generate_signing_key(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write a new Ed25519 key: private at `path` (PEM PKCS#8, mode 0600), public at
    `path.pub` (PEM). Never overwrites: FileExistsError when either exists."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        PublicFormat,
    )

    private_path = Path(path)
    public_path = Path(f"{private_path}.pub")
    for p in (private_path, public_path):
        if os.path.lexists(p):
            raise FileExistsError(f"{p} exists; keygen never overwrites a key")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    pub = key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    for p, data, mode in ((private_path, pem, 0o600), (public_path, pub, 0o644)):
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    return private_path, public_path
