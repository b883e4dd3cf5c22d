"""A seccomp filter for the sandboxed child, written as classic BPF by hand (no libseccomp needed).

It denies what LLM-written code has no use for and what an escape would need: creating processes
(fork, clone, execve: for root RLIMIT_NPROC does not apply, so this is what stops fork bombs),
sockets, namespaces and mounts, tracing and reading other memory, and kernel interfaces with a
history of exploits (BPF, userfaultfd, io_uring, keyrings, perf events, module loading). Denied
calls fail with EPERM, so the code sees an ordinary error; clone3 fails with ENOSYS so that C
libraries fall back to clone, which is denied too. A syscall made through another ABI (32-bit x86
on x86_64, x32) kills the process, since its numbers would bypass the table.

The child installs it on itself after its trusted imports: bwrap's --seccomp would apply before
the interpreter's own execve, which the filter denies. Only x86_64 and aarch64 tables are known;
elsewhere the child runs without it (namespaces and rlimits still apply).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

_DENIED_NAMES = (
    "fork", "vfork", "clone", "execve", "execveat",
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
    "socket", "socketpair",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "mount_setattr",
    "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree",
    "open_by_handle_at", "name_to_handle_at",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "kexec_load", "kexec_file_load", "init_module", "finit_module",
)

# Syscall numbers from the kernel's unistd headers (asm/unistd_64.h, asm-generic/unistd.h).
_TABLES = {
    "x86_64": {
        "audit_arch": 0xC000003E, "seccomp": 317, "clone3": 435, "foreign_abi_from": 0x40000000,
        "numbers": {
            "fork": 57, "vfork": 58, "clone": 56, "execve": 59, "execveat": 322,
            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438,
            "socket": 41, "socketpair": 53,
            "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
            "mount_setattr": 442, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
            "move_mount": 429, "open_tree": 428, "open_by_handle_at": 304, "name_to_handle_at": 303,
            "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248,
            "request_key": 249, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
            "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313,
        },
    },
    "aarch64": {
        "audit_arch": 0xC00000B7, "seccomp": 277, "clone3": 435, "foreign_abi_from": None,
        "numbers": {  # aarch64 has no fork/vfork: glibc forks through clone
            "clone": 220, "execve": 221, "execveat": 281,
            "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438,
            "socket": 198, "socketpair": 199,
            "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
            "mount_setattr": 442, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
            "move_mount": 429, "open_tree": 428, "open_by_handle_at": 265, "name_to_handle_at": 264,
            "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219, "add_key": 217,
            "request_key": 218, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
            "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
        },
    },
}

# classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h)
_LOAD_WORD_ABS, _JUMP_EQ, _JUMP_GE, _RETURN = 0x20, 0x15, 0x35, 0x06
_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_OFFSET_NR, _OFFSET_ARCH = 0, 4  # struct seccomp_data
_PR_SET_NO_NEW_PRIVS, _SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC = 38, 1, 1


def _program(table: dict) -> list[tuple[int, int, int, int]]:
    """(code, jump-if-true, jump-if-false, k) instructions of the filter."""
    checks = [(table["numbers"][name], "deny") for name in _DENIED_NAMES if name in table["numbers"]]
    checks.append((table["clone3"], "enosys"))
    head = [
        (_LOAD_WORD_ABS, 0, 0, _OFFSET_ARCH),
        (_JUMP_EQ, 1, 0, table["audit_arch"]),
        (_RETURN, 0, 0, _RET_KILL_PROCESS),
        (_LOAD_WORD_ABS, 0, 0, _OFFSET_NR),
    ]
    if table["foreign_abi_from"] is not None:
        head += [(_JUMP_GE, 0, 1, table["foreign_abi_from"]), (_RETURN, 0, 0, _RET_KILL_PROCESS)]
    # after the checks: allow, deny (EPERM), enosys (ENOSYS)
    n = len(checks)
    body = []
    for i, (number, action) in enumerate(checks):
        to_allow = n - i - 1
        body.append((_JUMP_EQ, to_allow + (1 if action == "deny" else 2), 0, number))
    tail = [(_RETURN, 0, 0, _RET_ALLOW), (_RETURN, 0, 0, _RET_ERRNO | errno.EPERM),
            (_RETURN, 0, 0, _RET_ERRNO | errno.ENOSYS)]
    return head + body + tail


def forbid_escape_syscalls() -> None:
    """Install the filter on every thread of this process (and whatever it could still start).
    Raises OSError when the kernel refuses; does nothing on an architecture without a table."""
    table = _TABLES.get(platform.machine())
    if table is None:
        return
    instructions = _program(table)
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in instructions)
    buffer = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    program = SockFprog(len(instructions), ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    ulong = ctypes.c_ulong
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, ulong(1), ulong(0), ulong(0), ulong(0)) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.syscall(ctypes.c_long(table["seccomp"]), ulong(_SECCOMP_SET_MODE_FILTER),
                    ulong(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(program)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER) failed")
