"""Safe reading of the files a target names, inside the target's root.

Every file a target names is hostile (serwatt runs as root, the target does not):
paths resolve inside the target's root (`/proc/<pid>/root`, so container targets work)
and never leave it (openat2 RESOLVE_IN_ROOT, or a component walk where the kernel
lacks it); no filesystem on the way is asked anything before the mount it is on is
known not to be FUSE (collectors/mounts.py `MountGuard`: a link into a FUSE mount that
stalls would leave the thread unkillable); only regular files are opened, never FIFOs or
device nodes; and reads are bounded (MAX_SOURCE_BYTES). docs/classification.md
"Hostile sources".
"""

from __future__ import annotations

import ctypes
import errno
import io
import os
import platform
import re
import stat
import threading
import tokenize
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from serwatt.collectors.mounts import MountGuard, OnFuse

# The largest file read. The largest .py file in the stdlib or torch 2.x is 1.4 MB
# (torch/testing/_internal/common_methods_invocations.py). Parsing peaks at up to
# ~520 bytes of memory per source byte for the densest code (the syntax tree and the
# parser's arena, freed once the index is built; the index keeps under 11 B/byte):
# docs/classification.md "Hostile sources".
MAX_SOURCE_BYTES = 1536 * 1024


_STDLIB = re.compile(r"/lib/python\d+(\.\d+)?t?/")


def is_job_file(path: str) -> bool:
    """Neither an installed package's file nor the standard library's: the job's own."""
    if "/site-packages/" in path or "/dist-packages/" in path:
        return False
    return _STDLIB.search(path) is None


class NotRegularFile(OSError):
    """A source path names a FIFO, device node, socket or directory: never read."""


# openat2(2) (Linux 5.6+): resolve a path with a directory fd as its root, so "..",
# absolute symlinks and absolute paths all stay below it; RESOLVE_NO_XDEV fails (EXDEV)
# at a mount crossing before anything on the other mount is asked.
_RESOLVE_NO_XDEV = 0x01
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
# 437 on every architecture with the unified syscall table (all 64-bit Linux ports).
_SYS_OPENAT2 = 437
_OPENAT2_ARCHES = ("x86_64", "aarch64", "arm64", "ppc64le", "s390x", "riscv64")
_MAX_SYMLINKS = 40  # the kernel's own limit (ELOOP)


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


_libc: ctypes.CDLL | None = None
# None: not probed yet; tests set False to exercise the component walk.
_OPENAT2_OK: bool | None = None


def _openat2(
    dirfd: int, path: str, flags: int, resolve: int = _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS
) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    how = _OpenHow(flags, 0, resolve)
    for _ in range(8):  # EAGAIN: a rename or mount raced the resolution; retry
        fd = _libc.syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(dirfd),
            ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            raise OSError(err, os.strerror(err), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


def openat2_available() -> bool:
    """Whether openat2 with RESOLVE_IN_ROOT works here (kernel, seccomp, arch)."""
    global _OPENAT2_OK
    if _OPENAT2_OK is None:
        ok = False
        if platform.system() == "Linux" and platform.machine() in _OPENAT2_ARCHES:
            try:
                root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.close(_openat2(root, ".", os.O_PATH | os.O_CLOEXEC))
                    ok = True
                finally:
                    os.close(root)
            except OSError:
                ok = False  # ENOSYS (before 5.6), EPERM (a seccomp filter)
        _OPENAT2_OK = ok
    return _OPENAT2_OK


# --- the target's own access ---------------------------------------------------------
#
# serwatt reads as root (or with CAP_DAC_READ_SEARCH); a target does not. A frame can name
# any path (a link to, or a compile() under the name of, a root-only file), so a file is read
# only if the target itself could have read it: every directory on the way searchable and
# the file readable under the target's fsuid, fsgid and groups, as the kernel decides from
# the mode bits. Conservative where the bits do not tell: an inode with an access ACL
# counts only for its owner, and capabilities count only in serwatt's own user namespace.

_CAP_DAC_OVERRIDE = 1
_CAP_DAC_READ_SEARCH = 2
_MAX_STATUS_BYTES = 64 * 1024
_READ, _SEARCH = 4, 1


class TargetCannotRead(PermissionError):
    """The target's own credentials could not read this path: serwatt does not either."""


@dataclass(frozen=True)
class TargetCreds:
    """What the kernel checks a target's file access against (from /proc/PID/status)."""

    fsuid: int
    fsgid: int
    groups: frozenset[int]
    bypass: bool  # CAP_DAC_OVERRIDE or CAP_DAC_READ_SEARCH, effective where it counts


def _status_fields(data: bytes) -> dict[str, str]:
    out = {}
    for line in data.decode("ascii", "replace").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
    return out


def target_creds(root: str) -> TargetCreds | None:
    """The credentials of the process whose root `root` is (`<procfs>/<pid>/root`); None
    when `root` is not such a path (a plain directory given as a root). Raises OSError when
    the process is gone or its status cannot be read."""
    proc_dir, name = os.path.split(root.rstrip("/"))
    if name != "root" or not os.path.basename(proc_dir).isdigit():
        return None
    fd = os.open(os.path.join(proc_dir, "status"), os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        data = os.read(fd, _MAX_STATUS_BYTES)
    finally:
        os.close(fd)
    f = _status_fields(data)
    try:
        uids, gids = f["Uid"].split(), f["Gid"].split()
        groups = frozenset(int(g) for g in f.get("Groups", "").split())
        caps = int(f["CapEff"], 16)
    except (KeyError, ValueError):
        raise OSError(errno.EIO, "unparsable status", os.path.join(proc_dir, "status")) from None
    own_ns = (
        os.stat(os.path.join(proc_dir, "ns", "user")).st_ino == os.stat("/proc/self/ns/user").st_ino
    )
    bypass = own_ns and bool(caps & (1 << _CAP_DAC_OVERRIDE | 1 << _CAP_DAC_READ_SEARCH))
    creds = TargetCreds(int(uids[3]), int(gids[3]), groups | {int(gids[3])}, bypass)
    _remember(root.rstrip("/"), creds)
    return creds


# A target that has exited leaves no credentials to ask (its /proc/PID is gone, or a
# zombie's root no longer resolves), yet its last window's frames are classified after,
# from host paths. So each target's credentials are remembered while it lives (every
# target_creds that answers, and remember_creds at each window's start), and a source of
# an exited target is read only if those would have let it; a target never seen alive
# has nothing read. Bounded: the oldest are forgotten first.
_MAX_REMEMBERED = 4096
_REMEMBERED: OrderedDict[str, TargetCreds] = OrderedDict()
_REMEMBERED_LOCK = threading.Lock()
_EXITED_SUFFIX = ".exited"


def _remember(root: str, creds: TargetCreds) -> None:
    with _REMEMBERED_LOCK:
        _REMEMBERED[root] = creds
        _REMEMBERED.move_to_end(root)
        while len(_REMEMBERED) > _MAX_REMEMBERED:
            _REMEMBERED.popitem(last=False)


def remember_creds(root: str) -> None:
    """Read and remember the credentials of the live process whose root `root` is
    (`<procfs>/<pid>/root`), for when its sources are read after it exits."""
    try:
        target_creds(root)  # remembers what it reads
    except OSError:
        pass  # gone already: nothing to remember, and nothing of it will be read


def exited_root(root: str) -> str:
    """The root to classify an exited target's frames under: its sources are read at
    host paths, under the credentials remembered for `root` (`<procfs>/<pid>/root`). A
    name of its own, so nothing read or memoized under the live root (reads that failed
    as it exited) is taken for it, and no other target's host reads either."""
    return root.rstrip("/") + _EXITED_SUFFIX


def is_exited_root(root: str) -> bool:
    """Whether `root` is an exited_root (sources at host paths, checked as remembered)."""
    return root.endswith(_EXITED_SUFFIX)


def _has_acl(fd: int) -> bool:
    try:
        os.getxattr(f"/proc/self/fd/{fd}", "system.posix_acl_access")
    except OSError:
        return False  # ENODATA (none), EOPNOTSUPP (no ACLs on this filesystem)
    return True


def _may(creds: TargetCreds, fd: int, st: os.stat_result, want: int) -> bool:
    """Whether the target may read (`_READ`) or search (`_SEARCH`) the inode at `fd`."""
    if creds.bypass:
        return True
    if st.st_uid == creds.fsuid:
        return bool(st.st_mode >> 6 & want)
    if _has_acl(fd):
        return False  # named entries and the mask decide; the bits do not say
    if st.st_gid in creds.groups:
        return bool(st.st_mode >> 3 & want)
    return bool(st.st_mode & want)


def _check_search(creds: TargetCreds | None, fd: int, path: str) -> None:
    if creds is not None and not _may(creds, fd, os.fstat(fd), _SEARCH):
        raise TargetCannotRead(errno.EACCES, "the target cannot search a directory of", path)


def _open_component(dirfd: int, name: str, guard: MountGuard, path: str) -> int:
    """An O_PATH fd of the one component `name` in `dirfd` (a link itself, not followed),
    checked off FUSE. With openat2, RESOLVE_NO_XDEV opens it without a check where it is
    on the directory's own mount (checked already); a mount point fails EXDEV, and only
    then is it opened across (an O_PATH open of a mount's root asks its filesystem
    nothing) and its mount checked."""
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    if openat2_available():
        try:
            return _openat2(dirfd, name, flags, _RESOLVE_NO_XDEV | _RESOLVE_NO_MAGICLINKS)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
    fd = os.open(name, flags, dir_fd=dirfd)
    try:
        guard.check(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _walk_in_root(
    rootfd: int,
    path: str,
    guard: MountGuard,
    creds: TargetCreds | None = None,
    *,
    follow_last: bool = True,
) -> int:
    """An O_PATH fd for `path` resolved with `rootfd` (checked by `guard` already) as "/":
    each component opened with O_NOFOLLOW and its mount checked before it is stat'ed
    (`_open_component`), symlinks spliced in by hand (absolute ones restart at the root),
    ".." never above the root (`follow_last=False`: a link as the last component is
    returned itself). The resolution where a mount is crossed, where openat2 is missing,
    and where `creds` (the target's) must be able to search each directory on the way."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    stack = [os.dup(rootfd)]  # the directories from the root down to the current one
    links = 0
    try:
        while parts:
            name = parts.pop(0)
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            _check_search(creds, stack[-1], path)
            fd = _open_component(stack[-1], name, guard, path)
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode) and (parts or follow_last):
                try:
                    target = os.readlink("", dir_fd=fd)
                finally:
                    os.close(fd)
                links += 1
                if links > _MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop())
                parts[:0] = [p for p in target.split("/") if p not in ("", ".")]
                continue
            if parts and not stat.S_ISDIR(mode):
                os.close(fd)
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
            stack.append(fd)
        return stack.pop() if len(stack) > 1 else os.dup(stack[0])
    finally:
        for fd in stack:
            os.close(fd)


def _proc_dir_of(root: str) -> str:
    """Whose mount namespace a path under `root` is reached in: the target's
    (`<procfs>/<pid>/root`), else serwatt's own."""
    proc_dir, name = os.path.split(root.rstrip("/"))
    if name == "root" and os.path.basename(proc_dir).isdigit():
        return proc_dir
    return "/proc/self"


def _open_path(
    path: str, root: str | None, *, follow_last: bool = True
) -> tuple[int, TargetCreds | None]:
    """An O_PATH fd (opening nothing: no FIFO, device or FUSE open is triggered), and the
    credentials of the target whose root `root` is, every directory on the way checked
    searchable under them (TargetCannotRead); None where there is no target to ask.
    Raises OnFuse where the resolution reaches a FUSE mount, before asking it anything
    (a host path, `root` None, is resolved the same way, from "/")."""
    if root is None:
        rel, root, creds = os.path.abspath(path), "/", None
    else:
        if not path.startswith(root):
            raise ValueError(f"{path!r} is not under the root {root!r}")
        rel = path[len(root) :]
        if is_exited_root(root):
            with _REMEMBERED_LOCK:
                creds = _REMEMBERED.get(root[: -len(_EXITED_SUFFIX)])
            if creds is None:
                raise TargetCannotRead(
                    errno.EACCES, "the target exited before its credentials were read", path
                )
            root = "/"
        else:
            creds = target_creds(root)
    if creds is not None and creds.bypass:
        creds = None  # the target may read whatever serwatt may: nothing more to check
    guard = MountGuard(_proc_dir_of(root))
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        guard.check(rootfd, path)
        fd = -1
        if creds is None and openat2_available():
            resolve = _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_XDEV
            flags = os.O_PATH | os.O_CLOEXEC | (0 if follow_last else os.O_NOFOLLOW)
            try:  # the whole path on the root's own mount: one call
                fd = _openat2(rootfd, rel.lstrip("/") or ".", flags, resolve)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
        if fd < 0:
            fd = _walk_in_root(rootfd, rel, guard, creds, follow_last=follow_last)
    finally:
        os.close(rootfd)
    return fd, creds


def resolve_off_fuse(path: str) -> int:
    """An O_PATH fd of the host path `path`, resolved through links with the mount of
    each component checked first; raises OnFuse where it reaches a FUSE mount, asking it
    nothing. Read the file through `/proc/self/fd/<fd>`: the very inode resolved, with no
    second resolution that a link changed meanwhile could lead into a mount."""
    return _open_path(path, None)[0]


def reaches_fuse(path: str) -> bool:
    """Whether resolving the host path `path` reaches a FUSE mount (through links too),
    asking no FUSE filesystem anything; False where it does not resolve."""
    try:
        os.close(resolve_off_fuse(path))
    except OnFuse:
        return True
    except (OSError, ValueError):
        return False
    return False


def stat_source(path: str, root: str | None = None) -> os.stat_result:
    """stat() of `path` resolved inside `root` (`path` starts with it; None: the host),
    where the target could reach it (TargetCannotRead otherwise)."""
    fd, _creds = _open_path(path, root)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def open_source(path: str, root: str | None = None, *, follow_last: bool = True) -> int:
    """A read-only, non-blocking fd of the regular file `path` names inside `root`
    (`follow_last=False`: a link as its last component is refused, not followed).

    Raises NotRegularFile for anything else (checked on the O_PATH fd before any
    open that could block or have a device's side effects), TargetCannotRead when the
    target whose root it is could not read it itself, OSError when it cannot be
    resolved inside the root."""
    pfd, creds = _open_path(path, root, follow_last=follow_last)
    try:
        st = os.fstat(pfd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", path)
        if creds is not None and not _may(creds, pfd, st, _READ):
            raise TargetCannotRead(errno.EACCES, "the target cannot read it", path)
        # reopen the very inode the O_PATH fd holds (no second path resolution)
        fd = os.open(
            f"/proc/self/fd/{pfd}",
            os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
        )
    finally:
        os.close(pfd)
    st2 = os.fstat(fd)
    if not stat.S_ISREG(st2.st_mode) or (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, "not a regular file", path)
    return fd


def read_fd(fd: int, limit: int) -> bytes:
    """At most `limit` + 1 bytes of `fd`: one past the limit, so decode_source tells a
    file over it."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def decode_source(data: bytes) -> str:
    """The text of a source file's bytes, by its coding cookie; ValueError when they
    are over MAX_SOURCE_BYTES."""
    if len(data) > MAX_SOURCE_BYTES:
        raise ValueError(f"larger than {MAX_SOURCE_BYTES} bytes")
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding)


def read_source(path: Path, root: str | None = None) -> str:
    """A Python source file's text, honouring its coding cookie; raises OSError (also
    NotRegularFile) or ValueError (too large, bad encoding)."""
    fd = open_source(str(path), root)
    try:
        data = read_fd(fd, MAX_SOURCE_BYTES)
    finally:
        os.close(fd)
    return decode_source(data)


def _is_regular_in_root(path: str, root: str | None) -> bool:
    try:
        return stat.S_ISREG(stat_source(path, root).st_mode)
    except (OSError, ValueError):
        return False


def package_of(path: Path, root: str | None = None) -> str | None:
    """The dotted package a source file belongs to, from `__init__.py` files above it
    (looked up inside `root` when given)."""
    parts: list[str] = []
    d = path.parent
    stop = len(root) if root is not None else 0
    while d.name and len(str(d)) > stop and len(parts) < 32:
        if not _is_regular_in_root(str(d / "__init__.py"), root):
            break
        parts.insert(0, d.name)
        d = d.parent
    return ".".join(parts) or None


def source_path(filename: str, proc_root: Path | None) -> str | None:
    """Where to read a frame's file: through the target's root, or None if not a file."""
    if not filename or filename.startswith("<") or not filename.endswith((".py", ".pyw")):
        return None
    if proc_root is None:
        return filename
    if not filename.startswith("/"):
        return None  # relative to the target's cwd, which we do not know
    return str(proc_root) + filename
