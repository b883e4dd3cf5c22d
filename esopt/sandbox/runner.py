"""The parent side: start the contained child, feed it the request, collect its result, kill it."""

from __future__ import annotations

import json
import marshal
import os
import shutil
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

from esopt.sandbox import bwrap
from esopt.sandbox.bwrap import IsolationUnavailable
from esopt.sandbox.child import BOOTSTRAP, to_jsonable
from esopt.sandbox.trusted import shipped_modules, site_dirs

ISOLATIONS = ("bwrap", "python")


@dataclass
class Limits:
    """Resource limits and containment of one sandboxed run."""

    timeout_s: float = 10.0
    """Wall-clock limit of the whole child process (start-up included); it is killed after it."""
    memory_mb: int = 1024
    """Address-space limit (RLIMIT_AS) of the child, in MiB. The interpreter plus numpy take ~150."""
    max_output_chars: int = 20000
    """Captured stdout and stderr are each truncated to this many characters."""
    max_file_mb: int = 64
    """Largest file (stdout/stderr included) the child may write (RLIMIT_FSIZE), in MiB; under bwrap
    also the size of its private working directory."""
    isolation: str = "bwrap"
    """How the child is contained. "bwrap": OS isolation (namespaces, a read-only view of only the
    interpreter and its packages, no network, an unprivileged uid, seccomp) plus the in-process layer;
    LLM-written code is refused when bwrap cannot be set up. "python": the in-process layer alone
    (audit hook and rlimits): not a security boundary, only for trusted code or a machine that
    cannot run bubblewrap."""


@dataclass
class SandboxResult:
    ok: bool
    value: Any = None
    """`call_in_sandbox`: the entry function's return value (JSON round-tripped). `run_script`: None."""
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    """One line saying why it failed ("timeout after 10.0s", "memory limit exceeded",
    "SyntaxError: ... (line 3)", "blocked: network access", ...); None when ok."""
    duration_s: float = 0.0
    exit_code: int | None = None
    isolation: str = "bwrap"
    """The containment it ran under (Limits.isolation)."""


_RESULT_LIMIT_BYTES = 256 * 1024 * 1024
_verified: set[str] = set()
_verify_lock = threading.Lock()


def require_isolation(isolation: str) -> None:
    """Raise IsolationUnavailable (one line naming the fix) unless `isolation` works on this machine.

    "bwrap" is checked once per process by running an empty script under it; "python" always works."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"sandbox isolation must be one of {', '.join(ISOLATIONS)}, got {isolation!r}")
    if isolation in _verified or isolation == "python":
        return
    with _verify_lock:
        if isolation in _verified:
            return
        bwrap.executable()
        bwrap.interpreter()
        res = _run({"mode": "script", "code": "pass"}, Limits(timeout_s=60.0, isolation=isolation), "")
        if not res.ok:
            said = [ln.strip() for ln in res.stderr.splitlines() if ln.startswith("bwrap:")]
            if said:
                raise IsolationUnavailable(
                    f"cannot run LLM-written code: bwrap could not set up the sandbox ({said[-1]}); allow "
                    "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1) or set isolation: python")
            raise IsolationUnavailable(
                f"cannot run LLM-written code: the sandbox failed its self-test under bwrap ({res.error}); "
                "set isolation: python to run without OS isolation")
        _verified.add(isolation)


def run_script(code: str, limits: Limits | None = None, stdin: str = "") -> SandboxResult:
    """Run `code` as a script (`__name__ == "__main__"`) in the sandbox; stdout/stderr come back.

    ok is False on a timeout, a limit, a blocked operation, an uncaught exception, a non-zero
    `sys.exit` or an exit that skips the script's end (os._exit); `error` says which in one line, and
    the traceback is in `stderr`. Raises IsolationUnavailable when limits.isolation cannot be set up.
    """
    limits = limits or Limits()
    require_isolation(limits.isolation)
    return _run({"mode": "script", "code": code}, limits, stdin)


def call_in_sandbox(user_code: str, entry: str, payload: Any, limits: Limits | None = None) -> SandboxResult:
    """Exec `user_code` in a fresh namespace in the sandbox, then call trusted
    `entry` ("package.module:function") as `function(namespace_dict, payload)`.

    `payload` must be JSON-serialisable after `to_jsonable` (numpy arrays become lists);
    the return value comes back the same way in `value`. An exception anywhere (in the
    user code at exec time, or raised by the entry function) gives ok=False with
    "ExcType: message" in `error`; so does exiting (sys.exit, os._exit) before the entry returns.
    Raises IsolationUnavailable when limits.isolation cannot be set up.
    """
    if ":" not in entry:
        raise ValueError(f"entry must look like 'package.module:function', got {entry!r}")
    try:
        payload = to_jsonable(payload)
    except TypeError as e:
        raise TypeError(f"payload for call_in_sandbox: {e}") from None
    limits = limits or Limits()
    require_isolation(limits.isolation)
    return _run({"mode": "call", "code": user_code, "entry": entry, "payload": payload}, limits, "")


# --------------------------------------------------------------------------- one run


def _sandbox_env(home: str, isolated: bool) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "NUMEXPR_NUM_THREADS": "1",
        "VECLIB_MAXIMUM_THREADS": "1",
    }
    if isolated:
        env.update(bwrap.environment())
    return env


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [truncated, {len(text) - limit} more characters]"


def _read_capped(f, limit_chars: int) -> str:
    f.seek(0)
    raw = f.read(max(4 * limit_chars, 1024) + 4)
    more = f.read(1) != b""
    text = raw.decode("utf-8", errors="replace")
    if more and len(text) <= limit_chars:
        text += "\n... [truncated]"
    return _truncate(text, limit_chars)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


class _Drain(threading.Thread):
    """Reads a pipe to its end in the background, keeping at most `limit` bytes."""

    def __init__(self, fd: int, limit: int):
        super().__init__(daemon=True)
        self.fd, self.limit, self.chunks, self.total = fd, limit, [], 0

    def run(self) -> None:
        while True:
            try:
                b = os.read(self.fd, 1 << 16)
            except OSError:
                break
            if not b:
                break
            self.total += len(b)
            if self.total <= self.limit:
                self.chunks.append(b)

    def data(self) -> bytes:
        return b"".join(self.chunks)


def _namespace_pid(info: bytes) -> int | None:
    """Host pid of the sandbox's pid-namespace init, from bwrap's --info-fd report."""
    try:
        return int(json.loads(info.decode("utf-8"))["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def _end_namespace(init: int, kill: bool) -> None:
    """Wait (at most a few seconds) until the pid namespace whose init has host pid `init` is gone,
    killing that init first if `kill`, or if it lingers. A pidfd pins the process, and one that is
    not a bwrap process is not ours: its pid was reused after our init had already been reaped."""
    try:
        fd = os.pidfd_open(init)
    except ProcessLookupError:
        return
    try:
        try:
            with open(f"/proc/{init}/comm") as f:
                if f.read().strip() != "bwrap":
                    return
        except OSError:
            return
        for attempt in range(2):
            if kill or attempt:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                except ProcessLookupError:
                    return
            if select.select([fd], [], [], 5.0)[0]:
                return
    finally:
        os.close(fd)


def _end(proc: subprocess.Popen, info: _Drain | None) -> None:
    """Kill the child unless it has exited, and make sure nothing it started is left.

    Under bwrap everything runs in a pid namespace whose init (a bwrap process) takes every process
    in the namespace with it when it dies. bwrap itself may exit before that init is gone, so the
    init is killed (if need be) and awaited here, and the run ends only once the namespace is empty."""
    if info is not None:
        info.join(timeout=1.0)  # bwrap closes its end right after reporting
        init = _namespace_pid(info.data())
        if init is not None:
            _end_namespace(init, kill=proc.poll() is None)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _run(request: dict, limits: Limits, stdin: str) -> SandboxResult:
    start = time.monotonic()
    isolated = limits.isolation == "bwrap"
    nonce = os.urandom(16).hex()
    host_dir = None if isolated else os.path.realpath(tempfile.mkdtemp(prefix="esopt-sbx-"))
    root = bwrap.WORK_DIR if isolated else host_dir
    sites = site_dirs()
    entry_module = request["entry"].partition(":")[0] if request.get("entry") else None
    request = dict(request, nonce=nonce, root=root, seccomp=isolated,
                   modules=shipped_modules(entry_module),
                   site_paths=bwrap.site_paths(len(sites)) if isolated else sites,
                   limits={"timeout_s": float(limits.timeout_s), "memory_mb": int(limits.memory_mb),
                           "max_file_mb": int(limits.max_file_mb)})
    result_r = result_w = info_r = info_w = None
    proc = None
    files = []
    try:
        req_f, in_f, out_f, err_f = (tempfile.TemporaryFile() for _ in range(4))
        files = [req_f, in_f, out_f, err_f]
        marshal.dump(request, req_f)
        req_f.seek(0)
        in_f.write(stdin.encode("utf-8"))
        in_f.seek(0)
        result_r, result_w = os.pipe()
        pass_fds = [req_f.fileno(), result_w]
        if isolated:
            info_r, info_w = os.pipe()
            pass_fds.append(info_w)
            argv = bwrap.command(sites, limits.max_file_mb, info_w) + [bwrap.interpreter()[1]]
        else:
            argv = [sys.executable]
        argv += ["-I", "-S", "-c", BOOTSTRAP, str(req_f.fileno()), str(result_w)]
        try:
            proc = subprocess.Popen(
                argv, stdin=in_f, stdout=out_f, stderr=err_f, cwd=host_dir or "/",
                env=_sandbox_env(root, isolated), pass_fds=pass_fds, start_new_session=True, close_fds=True)
        except OSError as e:
            return SandboxResult(ok=False, error=f"could not start sandbox process: {e}",
                                 duration_s=time.monotonic() - start, isolation=limits.isolation)
        for fd in (result_w, info_w):
            if fd is not None:
                os.close(fd)
        result_w = info_w = None
        req_f.close()  # the child has its own descriptor; the file is unlinked already

        result = _Drain(result_r, _RESULT_LIMIT_BYTES)
        result.start()
        info = _Drain(info_r, 4096) if info_r is not None else None
        if info is not None:
            info.start()
        timed_out = False
        try:
            proc.wait(timeout=max(0.01, float(limits.timeout_s)))
        except subprocess.TimeoutExpired:
            timed_out = True
        _end(proc, info)
        result.join(timeout=5.0)
        duration = time.monotonic() - start
        stdout = _read_capped(out_f, limits.max_output_chars)
        stderr = _read_capped(err_f, limits.max_output_chars)
        rc = proc.returncode
        res = SandboxResult(ok=False, stdout=stdout, stderr=stderr, duration_s=duration, exit_code=rc,
                            isolation=limits.isolation)
        if timed_out:
            res.error = f"timeout after {float(limits.timeout_s)}s"
            return res
        payload = None
        blob = result.data()
        prefix = (nonce + "\n").encode()
        if blob:
            if blob.startswith(prefix):
                try:
                    payload = json.loads(blob[len(prefix):].decode("utf-8"))
                except ValueError:
                    payload = None
            if payload is None:
                res.error = "corrupted result channel (the candidate wrote to the sandbox's result pipe?)"
                return res
        if payload is not None:
            res.ok = bool(payload.get("ok"))
            res.value = payload.get("value")
            res.error = payload.get("error")
            if not res.ok and not res.error:
                res.error = "failed without a reason"
            return res
        res.error = _death_reason(rc, stderr, limits, isolated)
        return res
    finally:
        for fd in (result_r, result_w, info_r, info_w):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        for f in files:
            f.close()
        if proc is not None and proc.poll() is None:
            _end(proc, None)
        if host_dir is not None:
            shutil.rmtree(host_dir, ignore_errors=True)


def _death_reason(rc: int | None, stderr: str, limits: Limits, isolated: bool) -> str:
    """Why a child that sent no result ended."""
    sig = None
    if rc is not None and rc < 0:
        sig = -rc
    elif isolated and rc is not None and rc > 128:  # bwrap reports a child killed by signal N as 128 + N
        sig = rc - 128
    if isolated and rc == 1 and stderr.lstrip().startswith("bwrap:"):
        return f"sandbox setup failed: {_last_line(stderr)}"
    if sig is not None:
        if sig == signal.SIGXCPU:
            return f"timeout after {float(limits.timeout_s)}s (CPU time limit)"
        if sig == signal.SIGXFSZ:
            return f"file size limit exceeded ({limits.max_file_mb} MiB, stdout included)"
        if sig == signal.SIGKILL and "MemoryError" in stderr:
            return "memory limit exceeded"
        if sig == signal.SIGKILL:
            return "killed (SIGKILL; out of memory?)"
        if sig == signal.SIGSYS:
            return "killed by the seccomp filter (a system call through a foreign ABI)"
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"crashed with signal {name}"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr or "std::bad_alloc" in stderr:
        return "memory limit exceeded"
    last = _last_line(stderr)
    detail = f": {last}" if last else ""
    return f"process exited with code {rc} before returning a result{detail}"
