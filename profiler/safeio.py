"""The one way serwatt writes an output file and reads a file argument; it runs as root.

Writing (`write_text`, `write_bytes`, `check_output_path`): the directory that will hold
the file is reached by a walk that follows a symbolic link only where no other user could
have planted it (the link is ours or root's, in a directory no other user can write), and
must itself be writable by no other user, unless it is root's or ours with the sticky bit
(like /tmp). The file is written to a new temp file of a random name, created with
O_CREAT|O_EXCL|O_NOFOLLOW relative to that directory's fd, fsynced and renamed over the
final name within the same fd. A final name that is a link, or exists and is not a regular
file, is refused. So a link another user put at any name serwatt uses is never written
through, and the file serwatt leaves is root's, whole, with the name it was given.

The run record is SQLite's, which opens it and its -journal, -wal and -shm by name,
resolving every link in the name first, so no descriptor can stand in for the name
(SQLite resolves /proc/self/fd/N back to a name). `sqlite_name` gives SQLite a name that
cannot be swapped: every directory on the way is one no other user can change (nor, in
a sticky one, its entry on the way); in a directory other users can write, the record
and its side files are opened without following links and must be serwatt's own (made
now, or already root's or ours with one link), which the sticky bit then keeps.

Reading (`read_bounded`, `read_json`): a regular file only, opened with O_NONBLOCK so a
FIFO cannot block the open, fstat'd before reading so a device is never read, and read to
at most its bound + 1 bytes, so a file growing under us is refused too. A file the job
wrote (a checkpoint: its magic bytes, its page cache, a torch.save zip's pickle) is
opened by `open_regular`, the same open with no link followed, and `read_head` reads its
first bytes through it.

Outside the layers, like profiler/exitcodes.py: every layer may import it, profiler/many
excepted (it stands alone and has its own writer).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAX_JSON_BYTES = 64 * 1024 * 1024  # a report of many runs is a few MB; this is not one
NO_SUCH_FILE = "no such file"  # InputFileError.problem of a missing file
_MAX_LINK_HOPS = 40  # the kernel's own limit (MAXSYMLINKS)
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FIX = (
    "write into a directory that only root or you can write (or a root-owned one with the "
    "sticky bit, like /tmp)"
)


class UnsafePathError(OSError):
    """An output path another user could redirect; the message names it and the fix.

    An OSError, so that every writer's existing 'cannot write' handling applies to it."""


class InputFileError(ValueError):
    """A file argument that cannot be read as the file it should be: `problem` says why."""

    def __init__(self, path: os.PathLike[str] | str, problem: str) -> None:
        super().__init__(f"{os.fspath(path)}: {problem}")
        self.path = Path(path)
        self.problem = problem


def _size(n: int) -> str:
    return f"{n / 1024 / 1024:g} MiB" if n >= 1024 * 1024 else f"{n / 1024:g} KiB"


# ------------------------------------------------------------------------ writing


def _dir_problem(info: os.stat_result) -> str | None:
    """Why another user could change the entries of a directory, or None when none can."""
    if info.st_uid not in (os.geteuid(), 0):
        return f"is owned by uid {info.st_uid}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        return "other users can write it and it has no sticky bit"
    return None


def _follow_problem(link: os.stat_result, holder: os.stat_result) -> str | None:
    """Why a symbolic link may have been planted by another user, or None."""
    if link.st_uid not in (os.geteuid(), 0):
        return f"is a symbolic link owned by uid {link.st_uid}"
    if _dir_problem(holder) is not None:
        return "is a symbolic link in a directory other users can write"
    return None


def _open_dir(directory: Path, shown: Path, *, make: bool = False) -> int:
    """An O_PATH fd of `directory`, reached without following any link another user could
    have planted (with `make`, a missing directory on the way is made, mode 0755, by the
    same walk); raises UnsafePathError, or OSError (e.g. a missing directory)."""
    fd = os.open("/" if directory.is_absolute() else ".", _DIR_FLAGS)
    pending = list(reversed(directory.parts[1:] if directory.is_absolute() else directory.parts))
    walked = Path(directory.anchor)
    hops = 0
    try:
        while pending:
            name = pending.pop()
            if name in ("", "."):
                continue
            try:
                try:
                    nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not make:
                        raise
                    with contextlib.suppress(FileExistsError):  # made meanwhile: opened below
                        os.mkdir(name, 0o755, dir_fd=fd)
                    nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(info.st_mode):
                    raise
                why = _follow_problem(info, os.fstat(fd))
                if why is not None:
                    raise UnsafePathError(
                        f"{shown}: {walked / name} {why}, so it may lead anywhere; give the "
                        "directory it points to, once you have checked it"
                    ) from None
                hops += 1
                if hops > _MAX_LINK_HOPS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(shown)) from None
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _DIR_FLAGS)
                    walked = Path("/")
                pending.extend(reversed(target.split("/")))
                continue
            os.close(fd)
            fd = nfd
            walked = walked / name
        why = _dir_problem(os.fstat(fd))
        if why is not None:
            raise UnsafePathError(
                f"{shown}: the directory {directory} {why}, so another user could put a link "
                f"where serwatt writes; {_FIX}"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_final(path: Path, dir_fd: int) -> None:
    if not path.name or path.name in (".", ".."):
        raise UnsafePathError(f"{path}: not a file name; give the file to write")
    try:
        info = os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePathError(
            f"{path}: is a symbolic link; serwatt does not write through links (another user "
            "may have planted it): remove it or give another name"
        )
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePathError(
            f"{path}: not a regular file (a directory, FIFO or device); give a file name"
        )


def _open_checked(path: os.PathLike[str] | str) -> tuple[Path, int]:
    """(path, an O_PATH fd of its directory) once both pass every check."""
    path = Path(path)
    dir_fd = _open_dir(path.parent, path)
    try:
        _check_final(path, dir_fd)
    except BaseException:
        os.close(dir_fd)
        raise
    return path, dir_fd


def check_output_path(path: os.PathLike[str] | str) -> None:
    """Raise UnsafePathError (or OSError) now if `path` could not be written safely:
    for checking an output option before any work starts."""
    _path, dir_fd = _open_checked(path)
    os.close(dir_fd)


SQLITE_SIDES = ("-journal", "-wal", "-shm")  # what SQLite makes beside a database, by name


def _shared(info: os.stat_result) -> bool:
    return bool(info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _fixed_path(dir_fd: int, shown: Path) -> str:
    """The path of the directory `dir_fd`, with no link in it, once no other user can
    change what any part of it names; raises UnsafePathError."""
    real = os.readlink(f"/proc/self/fd/{dir_fd}")
    if not real.startswith("/") or real.endswith(" (deleted)"):
        raise UnsafePathError(f"{shown}: its directory has no path ({real}); give another")
    walked, parent = "/", os.lstat("/")
    for part in Path(real).parts[1:]:
        child_path = os.path.join(walked, part)
        child = os.lstat(child_path)
        why = _dir_problem(parent)
        if why is None and _shared(parent) and child.st_uid not in (os.geteuid(), 0):
            why = f"is shared, and {part} in it is owned by uid {child.st_uid}"
        if why is not None:
            raise UnsafePathError(
                f"{shown}: the directory {walked} on the way to it {why}, so another user "
                "could swap what the name leads to, and SQLite opens the record and its "
                f"-journal, -wal and -shm by name: {_FIX}"
            )
        walked, parent = child_path, child
    here, there = os.fstat(dir_fd), os.stat(real)
    if (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
        raise UnsafePathError(f"{shown}: its directory moved while it was checked; try again")
    return real


def _own_file(dir_fd: int, name: str, shown: Path, *, create: bool, made: list[str]) -> None:
    """Open `name` in `dir_fd` without following a link (made now when `create`), and
    check it is a regular file no other user can have made or linked; raises
    UnsafePathError or OSError."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    where = shown.with_name(name)
    try:
        if create:
            try:
                fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
                made.append(name)
            except FileExistsError:
                fd = os.open(name, flags, dir_fd=dir_fd)
        else:
            fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePathError(
                f"{where}: is a symbolic link; serwatt does not let SQLite open a link (another "
                "user may have planted it): remove it or give the record another name"
            ) from None
        raise
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePathError(f"{where}: not a regular file (a FIFO, device or directory)")
    if info.st_uid not in (os.geteuid(), 0):
        raise UnsafePathError(
            f"{where}: is owned by uid {info.st_uid} in a directory other users can write: "
            "they may change it or put a link in its place (a journal of theirs would be "
            "rolled into the record); remove it, or give the record another name"
        )
    if info.st_nlink != 1:
        raise UnsafePathError(
            f"{where}: has {info.st_nlink} hard links in a directory other users can write "
            "(another name may be theirs); remove it, or give the record another name"
        )


def sqlite_name(path: os.PathLike[str] | str, *, create: bool) -> str:
    """The name to give SQLite for the database `path` (made now, empty, when `create`
    and missing): `path` with no link in it, on a path no other user can change; in a
    directory other users can write, the database and its SQLITE_SIDES are root's or
    ours, one link each (made now, empty, when missing, so no one else can make them).
    Raises UnsafePathError or OSError, having removed what it made."""
    path, dir_fd = _open_checked(path)
    made: list[str] = []
    try:
        real_dir = _fixed_path(dir_fd, path)
        shared = _shared(os.fstat(dir_fd))
        _own_file(dir_fd, path.name, path, create=create, made=made)
        if not shared:
            return os.path.join(real_dir, path.name)
        for side in SQLITE_SIDES:
            try:
                _own_file(dir_fd, path.name + side, path, create=True, made=made)
            except OSError as exc:
                if create or exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                # a reader that may not write here: SQLite cannot make it either
        return os.path.join(real_dir, path.name)
    except BaseException:
        for name in reversed(made):
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
        raise
    finally:
        os.close(dir_fd)


def make_dirs(directory: os.PathLike[str] | str) -> None:
    """Make `directory` and any missing parent (mode 0755), by the walk `_open_dir` takes:
    no link another user could have planted is followed, and nothing is made where one
    points. Raises UnsafePathError or OSError."""
    os.close(_open_dir(Path(directory), Path(directory), make=True))


def drop_empty_journal(path: os.PathLike[str] | str) -> None:
    """Remove the empty -journal `sqlite_name` made beside a database SQLite now runs in
    WAL mode (it reads no journal then); one another user made, or with content, stays."""
    path, dir_fd = _open_checked(path)
    name = path.name + "-journal"
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISREG(info.st_mode) and info.st_size == 0 and info.st_uid in (os.geteuid(), 0):
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    finally:
        os.close(dir_fd)


def write_bytes(
    path: os.PathLike[str] | str, data: bytes, *, mode: int = 0o666, durable: bool = True
) -> None:
    """Write `data` to `path` whole (a reader sees the old file or the new one) and durably.

    `mode` is masked by the umask, as open() does. `durable=False` skips the fsyncs: for a
    cache, whose reader treats a file a crash left empty or short as missing. Raises
    UnsafePathError or OSError; on any failure the temp file is removed and an existing
    file at `path` is untouched.
    """
    path, dir_fd = _open_checked(path)
    try:
        for _ in range(100):
            tmp = f".{path.name[:200]}.{secrets.token_hex(8)}.tmp"
            try:
                fd = os.open(
                    tmp,
                    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    mode,
                    dir_fd=dir_fd,
                )
                break
            except FileExistsError:
                continue
        else:
            raise UnsafePathError(f"{path}: cannot make a temp file of a new name beside it")
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        # the rename is durable once the directory is; an O_PATH fd cannot be fsynced
        if durable:
            with contextlib.suppress(OSError):
                sync_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
                try:
                    os.fsync(sync_fd)
                finally:
                    os.close(sync_fd)
    finally:
        os.close(dir_fd)


def write_text(path: os.PathLike[str] | str, text: str, *, mode: int = 0o666) -> None:
    """`write_bytes` of UTF-8 text."""
    write_bytes(path, text.encode("utf-8"), mode=mode)


# ------------------------------------------------------------------------ reading


@contextlib.contextmanager
def open_regular(path: os.PathLike[str] | str) -> Iterator[int]:
    """A read-only fd of a regular file the job wrote: no link followed, O_NONBLOCK so a
    FIFO cannot block, fstat'd before use. Raises OSError (a link, a FIFO or device, gone)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        yield fd
    finally:
        os.close(fd)


def read_head(path: os.PathLike[str] | str, n: int) -> bytes:
    """The first `n` bytes (fewer when the file is shorter) of a regular file, through
    `open_regular`. Raises OSError."""
    with open_regular(path) as fd:
        return os.pread(fd, n, 0)


def read_bounded(
    path: os.PathLike[str] | str, *, max_bytes: int, follow_links: bool = True
) -> bytes:
    """The bytes of a regular file of at most `max_bytes`; raises InputFileError.

    `follow_links=False` where a link is not expected: a link is then refused, not read.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InputFileError(path, NO_SUCH_FILE) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise InputFileError(path, "is a symbolic link; give the file itself") from None
        raise InputFileError(path, f"cannot read the file: {exc.strerror or exc}") from None
    limit = f"serwatt reads at most {max_bytes} bytes ({_size(max_bytes)}) here"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(
                path, "not a regular file (a FIFO, device or directory); give the file itself"
            )
        if info.st_size > max_bytes:
            raise InputFileError(path, f"the file is {info.st_size} bytes; {limit}")
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise InputFileError(path, f"cannot read the file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise InputFileError(
            path, f"the file grew past {max_bytes} bytes while it was read; {limit}"
        )
    return data


def parse_json(data: bytes, path: os.PathLike[str] | str) -> Any:
    """The JSON document in `data` (read from `path`); raises InputFileError."""
    try:
        return json.loads(data)
    except RecursionError:
        raise InputFileError(path, "not a usable JSON document: nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise InputFileError(path, f"not JSON: not UTF-8 text ({exc.reason})") from None
    except ValueError as exc:
        raise InputFileError(path, f"not JSON: {exc}") from None


def read_json(path: os.PathLike[str] | str, *, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """A JSON file argument, bounded and parsed; raises InputFileError."""
    return parse_json(read_bounded(path, max_bytes=max_bytes), path)
