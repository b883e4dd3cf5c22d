"""OS isolation of the sandboxed child with bubblewrap (bwrap): its command line.

The child gets fresh user, pid, network, ipc, uts and cgroup namespaces and runs as uid/gid 65534
("nobody") inside them with no capabilities; it cannot create further user namespaces
(--disable-userns), has its own session (no terminal to inject keystrokes into) and is killed with
its parent (--die-with-parent). Its filesystem is an empty read-only root holding only:

    /usr/lib, /usr/lib64, /lib, /lib64, /etc/ld.so.cache   system shared libraries (read-only)
    /sbx/python                                             the interpreter's prefix (read-only)
    /sbx/site/0, /sbx/site/1, ...                           the site-packages directories (read-only)
    /dev                                                    bwrap's minimal /dev (null, zero, full, random,
                                                            urandom, tty, a private devpts), read-only
    /tmp                                                    a private tmpfs of max_file_mb: working
                                                            directory, HOME and TMPDIR

so the project, its runs, /root, /home, /etc and the rest of the machine do not exist for it, and
no /proc is mounted (no /proc/self/mem, no /proc/<pid>). The network namespace has only its own
loopback; abstract unix sockets are per network namespace, and no socket file of the host is
visible.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache

SANDBOX_UID = 65534  # "nobody", inside the child's own user namespace
PYTHON_DIR = "/sbx/python"
SITE_DIR = "/sbx/site"
WORK_DIR = "/tmp"
_SYSTEM_LIBRARIES = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/lib32", "/usr/lib32")
_REQUIRED_OPTIONS = ("--disable-userns", "--size")  # both new in bubblewrap 0.8
_NOT_AVAILABLE = "; install bubblewrap 0.8 or newer (apt-get install bubblewrap) or set isolation: python"


class IsolationUnavailable(RuntimeError):
    """OS isolation cannot be set up here, so LLM-written code is refused; the message is one line
    naming the fix."""


@lru_cache(maxsize=1)
def executable() -> str:
    """The bwrap binary, checked once for the options this sandbox relies on."""
    path = shutil.which("bwrap")
    if path is None:
        raise IsolationUnavailable("cannot run LLM-written code: bubblewrap (bwrap) is not installed" + _NOT_AVAILABLE)
    try:
        usage = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise IsolationUnavailable(f"cannot run LLM-written code: {path} --help failed ({e})" + _NOT_AVAILABLE) from None
    missing = [opt for opt in _REQUIRED_OPTIONS if opt not in usage]
    if missing:
        raise IsolationUnavailable(
            f"cannot run LLM-written code: {path} is too old (no {', '.join(missing)})" + _NOT_AVAILABLE)
    return path


@lru_cache(maxsize=1)
def interpreter() -> tuple[str, str]:
    """(prefix on the host, path of the interpreter inside the sandbox). The prefix is bound whole at
    PYTHON_DIR; Python finds its standard library relative to its executable."""
    prefix = os.path.realpath(sys.base_prefix)
    real = os.path.realpath(sys.executable)
    if not real.startswith(prefix.rstrip("/") + "/"):  # a virtualenv made with --copies: use its base
        real = os.path.realpath(os.path.join(prefix, "bin", f"python{sys.version_info[0]}.{sys.version_info[1]}"))
    if not real.startswith(prefix.rstrip("/") + "/") or not os.access(real, os.X_OK):
        raise IsolationUnavailable(
            f"cannot run LLM-written code: the interpreter {real} lies outside its prefix {prefix}, which "
            "bwrap would bind; use a standard Python install or set isolation: python")
    return prefix, PYTHON_DIR + real[len(prefix.rstrip("/")):]


def site_paths(count: int) -> list[str]:
    return [f"{SITE_DIR}/{i}" for i in range(count)]


def environment() -> dict[str, str]:
    """Extra environment of the child: a shared libpython is looked up under the prefix's new place."""
    return {"LD_LIBRARY_PATH": f"{PYTHON_DIR}/lib"}


def command(site_dirs: list[str], work_mb: int, info_fd: int) -> list[str]:
    """bwrap and its options, up to (not including) the command to run inside."""
    prefix, _ = interpreter()
    args = [
        executable(),
        "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
        "--unshare-cgroup-try", "--disable-userns",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
        "--cap-drop", "ALL", "--new-session", "--die-with-parent", "--info-fd", str(info_fd),
    ]
    for path in _SYSTEM_LIBRARIES:
        if os.path.islink(path):  # merged /usr: /lib -> usr/lib
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    args += ["--ro-bind", prefix, PYTHON_DIR]
    for inside, outside in zip(site_paths(len(site_dirs)), site_dirs):
        args += ["--ro-bind", outside, inside]
    args += [
        "--dev", "/dev", "--remount-ro", "/dev",
        "--size", str(int(work_mb) * 1024 * 1024), "--tmpfs", WORK_DIR,
        "--remount-ro", "/",
        "--chdir", WORK_DIR,
    ]
    return args
