"""A seccomp filter that kills the process on mmap, munmap, brk and mremap.

Hand-built classic BPF installed with seccomp(2) through ctypes (no dependency). The filter
first checks the audit architecture of the calling convention (a syscall made through another
ABI has other numbers: it is killed too), on x86_64 also refuses the x32 ABI, then kills on
the four memory-mapping syscalls and allows everything else. SECCOMP_FILTER_FLAG_TSYNC puts
every thread of the process under the filter, so a helper thread cannot map memory either.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

# linux/audit.h, asm/unistd_64.h (x86_64), asm-generic/unistd.h (aarch64)
ARCHES: dict[str, dict[str, int]] = {
    "x86_64": {
        "audit_arch": 0xC000003E,
        "seccomp": 317,
        "mmap": 9,
        "munmap": 11,
        "brk": 12,
        "mremap": 25,
    },
    "aarch64": {
        "audit_arch": 0xC00000B7,
        "seccomp": 277,
        "mmap": 222,
        "munmap": 215,
        "brk": 214,
        "mremap": 216,
    },
}
KILLED_SYSCALLS = ("mmap", "munmap", "brk", "mremap")

_BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_BPF_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_BPF_RET_K = 0x06  # BPF_RET | BPF_K
_RET_KILL_PROCESS = 0x80000000
_RET_TRAP = 0x00030000
_RET_ALLOW = 0x7FFF0000
_X32_SYSCALL_BIT = 0x40000000
_OFF_NR, _OFF_ARCH = 0, 4  # struct seccomp_data
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def machine() -> str:
    m = platform.machine()
    if m not in ARCHES:
        raise OSError(f"no seccomp syscall table for {m}; known: {', '.join(ARCHES)}")
    return m


def build_filter(arch: str | None = None, *, trap: bool = False) -> bytes:
    """The BPF program (struct sock_filter[]) as bytes, for `arch` (default: this machine).

    `trap`: a killed call raises SIGSYS in its thread (SECCOMP_RET_TRAP) instead of killing
    the process at once, for a handler that reports the call and then dies of SIGSYS
    (tests/proofs/sigsys_report.c)."""
    arch = arch or machine()
    table = ARCHES[arch]
    prog: list[tuple[int, int, int, int]] = []
    n_kill = len(KILLED_SYSCALLS)
    x32 = arch == "x86_64"
    # Layout: [arch check][load nr][x32 check?][one JEQ per syscall][ALLOW][KILL]
    body = 1 + (1 if x32 else 0) + n_kill  # instructions between the arch check and ALLOW
    prog.append((_BPF_LD_W_ABS, 0, 0, _OFF_ARCH))
    prog.append((_BPF_JEQ_K, 0, body + 1, table["audit_arch"]))  # wrong arch -> KILL
    prog.append((_BPF_LD_W_ABS, 0, 0, _OFF_NR))
    left = n_kill + 1  # instructions after this one before KILL, minus one
    if x32:
        prog.append((_BPF_JGE_K, left, 0, _X32_SYSCALL_BIT))
    for k, name in enumerate(KILLED_SYSCALLS):
        to_kill = n_kill - k  # skip the remaining JEQs and ALLOW
        prog.append((_BPF_JEQ_K, to_kill, 0, table[name]))
    prog.append((_BPF_RET_K, 0, 0, _RET_ALLOW))
    prog.append((_BPF_RET_K, 0, 0, _RET_TRAP if trap else _RET_KILL_PROCESS))
    return b"".join(struct.pack("<HBBI", *ins) for ins in prog)


def install_kill_filter(*, trap: bool = False) -> None:
    """Install the filter on every thread. After this, mmap/munmap/brk/mremap kill (SIGSYS);
    with `trap`, through the SIGSYS handler the caller installed first."""
    arch = machine()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
    code = build_filter(arch, trap=trap)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.addressof(buf))
    rc = libc.syscall(
        ARCHES[arch]["seccomp"],
        _SECCOMP_SET_MODE_FILTER,
        _SECCOMP_FILTER_FLAG_TSYNC,
        ctypes.byref(prog),
    )
    if rc != 0:
        err = ctypes.get_errno()
        if rc > 0:
            raise OSError(f"seccomp TSYNC failed: thread {rc} cannot take the filter")
        raise OSError(err, f"seccomp(SECCOMP_SET_MODE_FILTER): {os.strerror(err)}")
