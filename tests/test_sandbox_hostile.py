"""A corpus of hostile snippets run through esopt.sandbox under OS isolation (bwrap), as root.

Each snippet must fail with its named reason (a regular expression over `SandboxResult.error`), and
after the whole corpus has run, the host must show no trace: no file named with the corpus's mark
anywhere it could write, no change to the victim files or the project, and no process left behind
(this test process is made a child subreaper, so anything that escaped by double fork or setsid
would be reparented to it). The last tests run a few escapes under isolation="python" (the
in-process layer alone) and check that the same detectors do see those escapes.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from esopt.sandbox import Limits, call_in_sandbox, run_script

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the hostile corpus is checked as root, like the CI runs it")

PROJECT = Path(__file__).resolve().parents[1]
MARK = f"esopt-escape-{uuid.uuid4().hex[:12]}"
SECRET = f"secret-{uuid.uuid4().hex}"
LIMITS = Limits(timeout_s=3.0, memory_mb=512, max_file_mb=16, max_output_chars=2000)
BLOCKED_PROCESS = r"^blocked: process creation"
NO_PERMISSION = r"PermissionError: \[Errno 1\] Operation not permitted"
NOT_VISIBLE = r"(FileNotFoundError|No such file or directory)"
BLOCKED_WRITE = r"^blocked: file write outside sandbox"
BLOCKED_PROC = r"^(blocked: /proc access|blocked: file write outside sandbox|FileNotFoundError)"
# The victim directory lies under the host's /tmp, which inside the sandbox is its own empty tmpfs:
# the in-process layer counts such paths as inside, the OS layer shows nothing there.
VICTIM_GONE = NOT_VISIBLE


@dataclass(frozen=True)
class Hostile:
    name: str
    code: str
    reason: str
    """Regular expression the one-line error must match."""
    mode: str = "script"
    """"script" (run_script) or "call" (call_in_sandbox with call_function's `f`)."""


CORPUS = [
    # ---- process creation, by every route
    Hostile("os.system", "import os\nos.system('touch /tmp/@MARK@')", BLOCKED_PROCESS),
    Hostile("subprocess.run", "import subprocess\nsubprocess.run(['touch', '/tmp/@MARK@'])", BLOCKED_PROCESS),
    Hostile("subprocess shell", "import subprocess\nsubprocess.check_output('touch /tmp/@MARK@', shell=True)", BLOCKED_PROCESS),
    Hostile("os.popen", "import os\nos.popen('touch /tmp/@MARK@').read()", BLOCKED_PROCESS),
    Hostile("os.fork", "import os\nif os.fork() == 0:\n    open('/tmp/@MARK@', 'w')", BLOCKED_PROCESS),
    Hostile("os.forkpty", "import os\nos.forkpty()", BLOCKED_PROCESS),
    Hostile("pty.fork", "import pty\npty.fork()", BLOCKED_PROCESS),
    Hostile("pty.spawn", "import pty\npty.spawn(['/bin/sh', '-c', 'touch /tmp/@MARK@'])", BLOCKED_PROCESS),
    Hostile("os.execv", "import os\nos.execv('/bin/sh', ['sh', '-c', 'touch /tmp/@MARK@'])", BLOCKED_PROCESS),
    Hostile("os.execve", "import os\nos.execve('/bin/sh', ['sh', '-c', 'touch /tmp/@MARK@'], {})", BLOCKED_PROCESS),
    Hostile("os.spawnv", "import os\nos.spawnv(os.P_WAIT, '/bin/sh', ['sh', '-c', 'touch /tmp/@MARK@'])", BLOCKED_PROCESS),
    Hostile("os.posix_spawn", "import os\nos.posix_spawn('/bin/sh', ['sh', '-c', 'touch /tmp/@MARK@'], {})", BLOCKED_PROCESS),
    Hostile("os.posix_spawnp", "import os\nos.posix_spawnp('sh', ['sh', '-c', 'touch /tmp/@MARK@'], {})", BLOCKED_PROCESS),
    Hostile("_posixsubprocess.fork_exec (no audit event)",
            "import _posixsubprocess, os\nr, w = os.pipe()\n"
            "_posixsubprocess.fork_exec([b'/bin/sh', b'-c', b'touch /tmp/@MARK@'], [b'/bin/sh'], True, (), None, None,"
            " -1, -1, -1, -1, -1, -1, r, w, False, False, -1, None, None, None, -1, None, False)", NO_PERMISSION),
    Hostile("multiprocessing spawnv_passfds (C level)",
            "from multiprocessing.util import spawnv_passfds\n"
            "spawnv_passfds(b'/bin/sh', ['/bin/sh', '-c', 'sleep 30; : @MARK@'], ())", NO_PERMISSION),
    Hostile("multiprocessing spawn context",
            "import multiprocessing as mp\nmp.get_context('spawn').Process(target=print, args=('@MARK@',)).start()",
            rf"({NO_PERMISSION}|^blocked:)"),
    Hostile("multiprocessing fork context",
            "import multiprocessing as mp\nmp.get_context('fork').Process(target=print, args=('@MARK@',)).start()",
            BLOCKED_PROCESS),
    Hostile("ProcessPoolExecutor",
            "from concurrent.futures import ProcessPoolExecutor\nProcessPoolExecutor(2).submit(print, '@MARK@').result()",
            r"^blocked:|Errno 30\] Read-only file system"),
    Hostile("asyncio subprocess",
            "import asyncio\nasyncio.run(asyncio.create_subprocess_exec('/bin/sh', '-c', 'touch /tmp/@MARK@'))",
            rf"^blocked:|{NO_PERMISSION}"),
    Hostile("ctypes libc.system", "import ctypes\nctypes.CDLL(None).system(b'touch /tmp/@MARK@')", r"^blocked: ctypes"),
    Hostile("ctypes via pythonapi", "import ctypes\nctypes.pythonapi.fork()", r"^blocked: ctypes"),
    Hostile("_ctypes.dlopen", "import _ctypes\n_ctypes.dlopen(None)", r"^blocked: ctypes"),
    Hostile("cffi when installed",
            "import cffi\nffi = cffi.FFI()\nffi.cdef('int system(const char *);')\nffi.dlopen(None).system(b'touch /tmp/@MARK@')",
            rf"(ModuleNotFoundError: No module named 'cffi'|{NO_PERMISSION}|^blocked:)"),
    Hostile("fork bomb (os.fork)", "import os\nwhile True:\n    os.fork()", BLOCKED_PROCESS),
    Hostile("fork bomb (C level)",
            "from multiprocessing.util import spawnv_passfds\nwhile True:\n"
            "    spawnv_passfds(b'/bin/sh', ['/bin/sh', '-c', ': @MARK@'], ())", NO_PERMISSION),
    Hostile("double fork + setsid", "import os\nif os.fork() == 0:\n    os.setsid()\n    os.fork()", BLOCKED_PROCESS),
    Hostile("outlive the timeout (C-level spawn in a new session)",
            "import _posixsubprocess, os\nr, w = os.pipe()\n"
            "_posixsubprocess.fork_exec([b'/bin/sh', b'-c', b'sleep 60; : @MARK@'], [b'/bin/sh'], True, (), None, None,"
            " -1, -1, -1, -1, -1, -1, r, w, False, True, -1, None, None, None, -1, None, False)", NO_PERMISSION),
    Hostile("thread bomb", "import threading\nwhile True:\n    threading.Thread(target=lambda: None).start()", r"^blocked: threads|can't start new thread"),
    # ---- reading secrets and the project
    Hostile("/etc/passwd", "print(open('/etc/passwd').read())", NOT_VISIBLE),
    Hostile("/etc/shadow", "print(open('/etc/shadow').read())", NOT_VISIBLE),
    Hostile("list /root", "import os\nprint(os.listdir('/root'))", NOT_VISIBLE),
    Hostile("ssh keys", "print(open('/root/.ssh/id_rsa').read())", NOT_VISIBLE),
    Hostile("list /home", "import os\nprint(os.listdir('/home'))", NOT_VISIBLE),
    Hostile("victim secret", "print(open('@SECRET_FILE@').read())", NOT_VISIBLE),
    Hostile("victim secret (os.open)", "import os\nprint(os.read(os.open('@SECRET_FILE@', os.O_RDONLY), 100))", NOT_VISIBLE),
    Hostile("project README", "print(open('@PROJECT@/README.md').read())", NOT_VISIBLE),
    Hostile("list project", "import os\nprint(os.listdir('@PROJECT@'))", NOT_VISIBLE),
    Hostile("project runs", "import os\nprint(os.listdir('@PROJECT@/runs'))", NOT_VISIBLE),
    Hostile("project via the editable-install path",
            "import sys\nsrc = [l for p in sys.path for l in [p + '/../../../../esopt/__init__.py']]\nprint(open(src[-1]).read())",
            NOT_VISIBLE),
    Hostile("dir_fd read of /etc", "import os\nfd = os.open('/', os.O_RDONLY)\nprint(os.read(os.open('etc/hostname', os.O_RDONLY, dir_fd=fd), 99))",
            NOT_VISIBLE),
    Hostile("parent's environment (scrubbed)", "import os\nprint(os.environ['ESOPT_HOSTILE_SECRET'])", r"^KeyError"),
    Hostile("/proc/self/environ", "print(open('/proc/self/environ').read())", BLOCKED_PROC),
    Hostile("/proc/<parent pid>/environ", "print(open('/proc/@PARENT_PID@/environ').read())", BLOCKED_PROC),
    Hostile("/proc/<parent pid>/mem", "import os\nos.open('/proc/@PARENT_PID@/mem', os.O_RDWR)", BLOCKED_PROC),
    Hostile("/proc/self/mem", "f = open('/proc/self/mem', 'rb')\nf.seek(4096)\nprint(f.read(64))", BLOCKED_PROC),
    Hostile("list /proc", "import os\nprint(os.listdir('/proc'))", BLOCKED_PROC),
    Hostile("/proc/1/root escape", "import os\nprint(os.listdir('/proc/1/root/root'))", BLOCKED_PROC),
    # ---- writes, deletes, chmod
    Hostile("write project canary", "open('@CANARY@', 'w').write('@MARK@')", BLOCKED_WRITE),
    Hostile("append project canary", "open('@CANARY@', 'a').write('@MARK@')", BLOCKED_WRITE),
    Hostile("os.open project canary", "import os\nos.write(os.open('@CANARY@', os.O_WRONLY), b'@MARK@')", BLOCKED_WRITE),
    Hostile("delete project canary", "import os\nos.remove('@CANARY@')", BLOCKED_WRITE),
    Hostile("chmod project canary", "import os\nos.chmod('@CANARY@', 0o777)", BLOCKED_WRITE),
    Hostile("rename victim", "import os\nos.rename('@VICTIM@/keep.txt', '@VICTIM@/@MARK@')", VICTIM_GONE),
    Hostile("rmtree victim", "import shutil\nshutil.rmtree('@VICTIM@')", VICTIM_GONE),
    Hostile("truncate victim", "import os\nos.truncate('@VICTIM@/keep.txt', 0)", VICTIM_GONE),
    Hostile("utime victim", "import os\nos.utime('@VICTIM@/keep.txt', (0, 0))", VICTIM_GONE),
    Hostile("write /etc", "open('/etc/@MARK@', 'w').write('x')", BLOCKED_WRITE),
    Hostile("write host /var/tmp", "import tempfile\ntempfile.mkstemp(dir='/var/tmp', prefix='@MARK@')", BLOCKED_WRITE),
    Hostile("write /dev/shm", "open('/dev/shm/@MARK@', 'w').write('x')", BLOCKED_WRITE),
    Hostile("mkdir via dir_fd (passes the hook)",
            "import os\nfd = os.open('@VICTIM@', os.O_RDONLY)\nos.mkdir('@MARK@', dir_fd=fd)", VICTIM_GONE),
    Hostile("mkdir in /usr/lib via dir_fd (passes the hook)",
            "import os\nfd = os.open('/usr/lib', os.O_RDONLY)\nos.mkdir('@MARK@', dir_fd=fd)",
            r"OSError: \[Errno 30\] Read-only file system"),
    Hostile("fchmod via descriptor (passes the hook)",
            "import os\nfd = os.open('/usr/lib', os.O_RDONLY)\nos.fchmod(fd, 0o777)",
            r"(Errno 30\] Read-only file system|Errno 1\] Operation not permitted)"),
    Hostile("symlink to a secret", "import os\nos.symlink('/etc/shadow', 'x')\nprint(open('x').read())", r"^blocked: creating links"),
    Hostile("hard link", "import os\nos.link('/usr/lib/os-release', 'x')", r"^blocked: creating links"),
    Hostile("sqlite outside", "import sqlite3\nsqlite3.connect('/etc/@MARK@.db')", BLOCKED_WRITE),
    Hostile("mkfifo outside", "import os\nos.mkfifo('/etc/@MARK@')", rf"{BLOCKED_WRITE}|Errno 30\] Read-only file system"),
    # ---- network
    Hostile("tcp to loopback", "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)", r"^blocked: network access"),
    Hostile("_socket (C module)", "import _socket\n_socket.socket(_socket.AF_INET, _socket.SOCK_STREAM).connect(('127.0.0.1', 22))",
            r"^blocked: network access"),
    Hostile("udp out", "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('8.8.8.8', 53))",
            r"^blocked: network access"),
    Hostile("unix socket", "import socket\nsocket.socket(socket.AF_UNIX).connect('/run/systemd/private')", r"^blocked: network access"),
    Hostile("abstract unix socket", "import socket\nsocket.socket(socket.AF_UNIX).connect('\\0@MARK@')", r"^blocked: network access"),
    Hostile("urllib", "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:8000/', timeout=1)", r"^blocked: network access"),
    Hostile("ctypes socket", "import ctypes\nctypes.CDLL(None).socket(2, 1, 0)", r"^blocked: ctypes"),
    # ---- memory, CPU, disk and output bombs
    Hostile("memory bomb", "x = bytearray(8 * 1024 ** 3)", r"^memory limit exceeded"),
    Hostile("numpy memory bomb", "import numpy as np\nx = np.ones(10 ** 10)", r"^memory limit exceeded"),
    Hostile("doubling string", "s = 'a'\nwhile True:\n    s = s + s", r"^memory limit exceeded"),
    Hostile("CPU bomb", "while True:\n    pass", r"^timeout after"),
    Hostile("never returns (call)", "def f():\n    import time\n    time.sleep(60)", r"^timeout after", mode="call"),
    Hostile("disk bomb (one file)", "f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * 2 ** 20)",
            r"(No space left on device|file size limit exceeded)"),
    Hostile("disk bomb (many files)", "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'x' * 2 ** 19)\n    i += 1",
            r"(No space left on device|file size limit exceeded)"),
    Hostile("output bomb", "while True:\n    print('x' * 10000)", r"^file size limit exceeded"),
    Hostile("stderr bomb", "import sys\nwhile True:\n    sys.stderr.write('x' * 10000)", r"^file size limit exceeded"),
    Hostile("raise rlimits", "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))", r"^blocked: changing resource limits"),
    # ---- signals
    Hostile("kill the namespace init", "import os, signal\nos.kill(1, signal.SIGKILL)", BLOCKED_PROCESS),
    Hostile("kill the parent", "import os, signal\nos.kill(@PARENT_PID@, signal.SIGTERM)", BLOCKED_PROCESS),
    Hostile("killpg", "import os, signal\nos.killpg(0, signal.SIGKILL)", BLOCKED_PROCESS),
    Hostile("pthread_kill", "import signal, threading\nsignal.pthread_kill(threading.main_thread().ident, signal.SIGKILL)",
            BLOCKED_PROCESS),
    Hostile("ignore termination and spin",
            "import signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGXCPU, signal.SIGHUP):\n"
            "    signal.signal(s, signal.SIG_IGN)\nwhile True:\n    pass", r"^timeout after"),
    Hostile("alarm", "import signal\nsignal.alarm(1)\nwhile True:\n    pass", r"^crashed with signal SIGALRM"),
    # ---- the result channel
    Hostile("forge on every descriptor then _exit",
            "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'{\"ok\": true, \"value\": 42}')\n"
            "    except OSError:\n        pass\nos._exit(0)\ndef f():\n    return 1",
            r"(corrupted result channel|before returning a result)", mode="call"),
    Hostile("forge on stdout then _exit", "print('{\"ok\": true, \"value\": 42}')\nimport os\nos._exit(0)\ndef f():\n    return 1",
            r"before returning a result", mode="call"),
    Hostile("sys.exit(0) in a candidate", "import sys\nsys.exit(0)\ndef f():\n    return 1", r"before returning a result",
            mode="call"),
    Hostile("sys.exit(0) in the function", "def f():\n    import sys\n    sys.exit(0)", r"before returning a result", mode="call"),
    Hostile("close the result pipe", "import os\nos.closerange(3, 64)\ndef f():\n    return 1",
            r"before returning a result", mode="call"),
    Hostile("redirect the result pipe",
            "import os\nsink = open('sink', 'wb')\nt = sink.fileno()\nfor fd in range(3, 64):\n    if fd != t:\n"
            "        try:\n            os.dup2(t, fd)\n        except OSError:\n            pass\ndef f():\n    return 1",
            r"before returning a result", mode="call"),
    Hostile("read the request for the nonce",
            "import os\nleaks = []\nfor fd in range(3, 64):\n    try:\n        os.lseek(fd, 0, 0)\n"
            "        leaks.append(os.read(fd, 1 << 20))\n    except OSError:\n        pass\n"
            "raise SystemExit(f'readable descriptors: {len(leaks)}')", r"^SystemExit: readable descriptors: 0$"),
    Hostile("frames to the trusted caller", "import sys\nprint(sys._getframe(1).f_locals)", r"^blocked: frame"),
    Hostile("gc to the trusted caller", "import gc\nprint(len(gc.get_objects()))", r"^blocked: frame"),
]


def _code(h: Hostile, victim: Path, canary: Path) -> str:
    subs = {"@MARK@": MARK, "@VICTIM@": str(victim), "@SECRET_FILE@": str(victim / "secret.txt"),
            "@PROJECT@": str(PROJECT), "@CANARY@": str(canary), "@PARENT_PID@": str(os.getpid())}
    code = h.code
    for k, v in subs.items():
        code = code.replace(k, v)
    return code


def _run(h: Hostile, victim: Path, canary: Path, isolation: str = "bwrap"):
    limits = Limits(**{**LIMITS.__dict__, "isolation": isolation})
    code = _code(h, victim, canary)
    if h.mode == "call":
        return call_in_sandbox(code, "esopt.sandbox:call_function", {"function": "f"}, limits)
    return run_script(code, limits)


# --------------------------------------------------------------------------- host snapshots

_WATCHED_DIRS = ["/", "/tmp", "/var/tmp", "/root", "/home", "/etc", "/dev", "/dev/shm", "/usr/lib", str(PROJECT)]


def _file_state(paths: list[Path]) -> dict:
    state = {}
    for root in paths:
        for p in [root, *root.rglob("*")] if root.is_dir() else [root]:
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            state[str(p)] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return state


def _marked_paths(victim: Path) -> list[str]:
    found = [str(p) for p in victim.rglob(f"*{MARK}*")]
    for d in _WATCHED_DIRS:
        try:
            found += [os.path.join(d, n) for n in os.listdir(d) if MARK in n]
        except OSError:
            pass
    return found


def _marked_processes() -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if MARK in cmdline:
                found.append(f"{pid}: {cmdline[:200]}")
    return found


def _children() -> list[int]:
    """Processes whose parent is this one (with the subreaper flag set, orphans of children too)."""
    me, out = os.getpid(), []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            state, ppid = stat.rpartition(")")[2].split()[:2]
            if int(ppid) == me and state != "Z":  # zombies are dead; the fixture reaps them
                out.append(int(pid))
    return out


_PR_SET_CHILD_SUBREAPER = 36


def _set_subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(_PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(int(on)), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)) == 0


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """The victim files, the project canary, and the host's state before anything ran."""
    victim = tmp_path_factory.mktemp("victim")
    (victim / "secret.txt").write_text(SECRET)
    (victim / "secret.txt").chmod(0o600)
    (victim / "keep.txt").write_text("keep")
    (victim / "open").mkdir()
    (victim / "open").chmod(0o777)
    canary = PROJECT / f".esopt-canary-{uuid.uuid4().hex[:12]}"  # a project file the corpus tries to change
    canary.write_text("canary")
    os.environ["ESOPT_HOSTILE_SECRET"] = SECRET
    _set_subreaper(True)
    try:
        yield {"victim": victim, "canary": canary,
               "before": _file_state([victim, canary, PROJECT / "README.md"])}
    finally:
        _set_subreaper(False)
        while True:  # reap anything that was reparented here
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        del os.environ["ESOPT_HOSTILE_SECRET"]
        canary.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def corpus_results(host):
    """Every snippet's result under bwrap, run a few at a time."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda h: _run(h, host["victim"], host["canary"]), CORPUS))
    return dict(zip([h.name for h in CORPUS], results))


def test_corpus_is_large_and_names_unique():
    assert len(CORPUS) >= 60
    assert len({h.name for h in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("hostile", CORPUS, ids=[h.name for h in CORPUS])
def test_contained_with_reason(hostile, corpus_results):
    r = corpus_results[hostile.name]
    assert r.isolation == "bwrap"
    assert not r.ok, f"{hostile.name} was not stopped: stdout={r.stdout[:300]!r}"
    assert r.value is None
    assert r.error and re.search(hostile.reason, r.error), f"{hostile.name}: {r.error!r} (stderr {r.stderr[-300:]!r})"
    assert SECRET not in r.stdout + r.stderr


def test_corpus_left_no_trace(host, corpus_results):
    assert corpus_results  # the corpus ran before this snapshot
    assert _file_state([host["victim"], host["canary"], PROJECT / "README.md"]) == host["before"]
    assert _marked_paths(host["victim"]) == []
    assert _marked_processes() == []
    assert _children() == []


# --------------------------------------------------------------------------- the detectors work


def _by_name(name: str) -> Hostile:
    return next(h for h in CORPUS if h.name == name)


def test_in_process_layer_alone_lets_escapes_through_and_the_checks_see_them(host, corpus_results):
    """isolation="python" (no OS isolation): a C-level spawn, a hook-bypassing write and a read of a
    secret get through, and the same checks that passed for the corpus catch each of them."""
    victim, canary = host["victim"], host["canary"]
    r = _run(_by_name("victim secret"), victim, canary, isolation="python")
    assert r.ok and SECRET in r.stdout

    r = _run(_by_name("mkdir via dir_fd (passes the hook)"), victim, canary, isolation="python")
    assert r.ok and (victim / MARK).is_dir()
    assert _marked_paths(victim) == [str(victim / MARK)]
    (victim / MARK).rmdir()

    r = _run(_by_name("outlive the timeout (C-level spawn in a new session)"), victim, canary, isolation="python")
    assert r.ok, r.error
    deadline = time.monotonic() + 5.0
    while not _marked_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    escaped = _marked_processes()
    assert escaped, "the spawned process should have outlived its sandbox under isolation=python"
    assert _children(), "an orphan of the sandbox should have been reparented to this (subreaper) process"
    for line in escaped:
        os.kill(int(line.split(":")[0]), signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while _marked_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _marked_processes() == []
