"""Run code written by an LLM in a contained child process.

Two entry points:

* `run_script(code, limits, stdin)` runs `code` as a script and returns its
  captured stdout/stderr.
* `call_in_sandbox(user_code, entry, payload, limits)` execs `user_code` into a
  fresh module namespace in the child, imports the *trusted* function named by
  `entry` ("package.module:function") and calls `function(namespace, payload)`;
  its JSON-serialisable return value comes back in `SandboxResult.value`. A
  whole evaluation (many calls of an LLM-written heuristic) thus costs one
  process start.

Containment, all set up in the child before the untrusted code runs:

* a separate isolated interpreter (`python -I`) in its own session/process
  group, killed as a group (SIGKILL) at the wall-clock timeout;
* resource limits: RLIMIT_AS (memory), RLIMIT_CPU (timeout + 1 s),
  RLIMIT_FSIZE (largest file it may write), RLIMIT_NPROC = 0 (effective for
  non-root users; for root the audit hook below is what stops fork/exec), and
  RLIMIT_CORE = 0;
* the working directory is a fresh temporary directory, deleted afterwards;
  HOME and TMPDIR point there;
* the environment is scrubbed (only PATH, HOME, TMPDIR, LANG and the
  single-thread settings OMP/MKL/OPENBLAS/NUMEXPR_NUM_THREADS=1 survive);
* an audit hook (PEP 578) rejects: every `socket.*` event (no network),
  process creation (`subprocess.Popen`, `os.system`, `os.exec*`, `os.fork*`,
  `os.spawn*`, `os.posix_spawn`, `pty.spawn`), `os.kill`, new threads,
  `ctypes`, `resource.setrlimit`, `os.chdir`, symlinks/hard links, any open()
  for writing and any remove/rename/mkdir/chmod/... outside the temporary
  directory, and frame/garbage-collector introspection (`sys._getframe`,
  `tb_frame`, `gc.get_objects`, ...), so LLM code cannot reach the trusted
  caller's state through the stack.

Data crosses the boundary as JSON: the request through a file in the temp
directory (read and deleted by the child before user code runs), the result
through an inherited pipe, prefixed by a random nonce the user code never sees,
so a candidate cannot forge a result by printing or writing one. numpy arrays
and scalars in a returned value are converted to lists / Python numbers.

Threat model: this stops accidents and the usual escape attempts of generated
code (shelling out, network, writing files, fork bombs, memory or CPU bombs,
infinite loops, huge outputs). It is not a security boundary against a
determined attacker with arbitrary native-code execution (a process sandbox
such as a container or seccomp is). Trusted `entry` functions share the
interpreter with the untrusted code, which can monkeypatch modules it imports;
evaluators whose score matters should return *solutions* and recompute the
score in the parent (the AHD envs do).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Limits", "SandboxResult", "run_script", "call_in_sandbox", "call_function", "to_jsonable"]


@dataclass
class Limits:
    """Resource limits of one sandboxed run."""

    timeout_s: float = 10.0
    """Wall-clock limit of the whole child process (start-up included); it is killed after it."""
    memory_mb: int = 1024
    """Address-space limit (RLIMIT_AS) of the child, in MiB. The interpreter plus numpy take ~150."""
    max_output_chars: int = 20000
    """Captured stdout and stderr are each truncated to this many characters."""
    max_file_mb: int = 64
    """Largest file (stdout/stderr included) the child may write (RLIMIT_FSIZE), in MiB."""


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


# --------------------------------------------------------------------------- parent side

_CHILD_STUB = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from esopt.sandbox import _child_main; _child_main(sys.argv[2], int(sys.argv[3]))"
)
_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RESULT_LIMIT_BYTES = 256 * 1024 * 1024


def to_jsonable(obj: Any) -> Any:
    """Convert numpy arrays/scalars, tuples and sets into plain JSON types (recursively)."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj)
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return [to_jsonable(v) for v in sorted(obj, key=repr)]
    tolist = getattr(obj, "tolist", None)  # numpy arrays and numpy scalars
    if callable(tolist) and type(obj).__module__.startswith("numpy"):
        return to_jsonable(tolist())
    raise TypeError(f"value of type {type(obj).__name__} is not JSON-serialisable")


def _scrubbed_env(tmpdir: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": tmpdir,
        "TMPDIR": tmpdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "NUMEXPR_NUM_THREADS": "1",
        "VECLIB_MAXIMUM_THREADS": "1",
    }


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


def _run(request: dict, limits: Limits, stdin: str) -> SandboxResult:
    start = time.monotonic()
    tmpdir = os.path.realpath(tempfile.mkdtemp(prefix="esopt-sbx-"))
    nonce = secrets.token_hex(16)
    request = dict(request, nonce=nonce, root=tmpdir, limits={
        "timeout_s": float(limits.timeout_s), "memory_mb": int(limits.memory_mb),
        "max_file_mb": int(limits.max_file_mb)})
    req_path = os.path.join(tmpdir, ".esopt_request.json")
    r_fd = w_fd = None
    proc = None
    chunks: list[bytes] = []
    try:
        with open(req_path, "w") as f:
            json.dump(request, f)
        r_fd, w_fd = os.pipe()
        out_f = tempfile.TemporaryFile()
        err_f = tempfile.TemporaryFile()
        in_f = tempfile.TemporaryFile()
        in_f.write(stdin.encode("utf-8"))
        in_f.seek(0)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", _CHILD_STUB, _PKG_ROOT, req_path, str(w_fd)],
                stdin=in_f, stdout=out_f, stderr=err_f, cwd=tmpdir, env=_scrubbed_env(tmpdir),
                pass_fds=(w_fd,), start_new_session=True, close_fds=True,
            )
        except OSError as e:
            return SandboxResult(ok=False, error=f"could not start sandbox process: {e}",
                                 duration_s=time.monotonic() - start)
        os.close(w_fd)
        w_fd = None

        def reader(fd=r_fd):
            total = 0
            while True:
                try:
                    b = os.read(fd, 1 << 16)
                except OSError:
                    break
                if not b:
                    break
                total += len(b)
                if total <= _RESULT_LIMIT_BYTES:
                    chunks.append(b)

        th = threading.Thread(target=reader, daemon=True)
        th.start()
        timed_out = False
        try:
            proc.wait(timeout=max(0.01, float(limits.timeout_s)))
        except subprocess.TimeoutExpired:
            timed_out = True
        # kill whatever is left of the group (the child itself on timeout, strays otherwise)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        th.join(timeout=5.0)
        duration = time.monotonic() - start
        stdout = _read_capped(out_f, limits.max_output_chars)
        stderr = _read_capped(err_f, limits.max_output_chars)
        for f in (out_f, err_f, in_f):
            f.close()
        rc = proc.returncode
        res = SandboxResult(ok=False, stdout=stdout, stderr=stderr, duration_s=duration, exit_code=rc)
        if timed_out:
            res.error = f"timeout after {float(limits.timeout_s)}s"
            return res
        payload = None
        blob = b"".join(chunks)
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
        # no result: the process died or exited early
        res.error = _death_reason(rc, stderr, request.get("mode"), limits)
        if res.error is None:
            res.ok = True
        return res
    finally:
        for fd in (r_fd, w_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        shutil.rmtree(tmpdir, ignore_errors=True)


def _death_reason(rc: int | None, stderr: str, mode: str | None, limits: Limits) -> str | None:
    if rc is not None and rc < 0:
        sig = -rc
        if sig == signal.SIGXCPU:
            return f"timeout after {float(limits.timeout_s)}s (CPU time limit)"
        if sig == signal.SIGXFSZ:
            return f"file size limit exceeded ({limits.max_file_mb} MiB, stdout included)"
        if sig == signal.SIGKILL and "MemoryError" in stderr:
            return "memory limit exceeded"
        if sig == signal.SIGKILL:
            return "killed (SIGKILL; out of memory?)"
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"crashed with signal {name}"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr or "std::bad_alloc" in stderr:
        return "memory limit exceeded"
    if mode == "script" and rc == 0:
        return None  # os._exit(0): a normal (if abrupt) end of a script
    last = _last_line(stderr)
    detail = f": {last}" if last else ""
    return f"process exited with code {rc} before returning a result{detail}"


def run_script(code: str, limits: Limits | None = None, stdin: str = "") -> SandboxResult:
    """Run `code` as a script (`__name__ == "__main__"`) in the sandbox; stdout/stderr come back.

    ok is False on a timeout, a limit, a blocked operation, an uncaught exception or a
    non-zero `sys.exit`; `error` says which in one line, and the traceback is in `stderr`.
    """
    return _run({"mode": "script", "code": code}, limits or Limits(), stdin)


def call_in_sandbox(user_code: str, entry: str, payload: Any, limits: Limits | None = None) -> SandboxResult:
    """Exec `user_code` in a fresh namespace in the sandbox, then call trusted
    `entry` ("package.module:function") as `function(namespace_dict, payload)`.

    `payload` must be JSON-serialisable after `to_jsonable` (numpy arrays become lists);
    the return value comes back the same way in `value`. An exception anywhere (in the
    user code at exec time, or raised by the entry function) gives ok=False with
    "ExcType: message" in `error`.
    """
    if ":" not in entry:
        raise ValueError(f"entry must look like 'package.module:function', got {entry!r}")
    try:
        payload = to_jsonable(payload)
    except TypeError as e:
        raise TypeError(f"payload for call_in_sandbox: {e}") from None
    return _run({"mode": "call", "code": user_code, "entry": entry, "payload": payload},
                limits or Limits(), "")


def call_function(namespace: dict, payload: dict) -> Any:
    """A generic trusted entry for `call_in_sandbox`: call the function the user code defined.

    payload: {"function": name, "args": [...], "kwargs": {...}}. Use it as
    `call_in_sandbox(code, "esopt.sandbox:call_function", {"function": "solve", "args": [3]})`.
    """
    name = payload["function"]
    fn = namespace.get(name)
    if fn is None:
        raise NameError(f"the code does not define {name!r}")
    if not callable(fn):
        raise TypeError(f"{name!r} is not a function")
    return fn(*payload.get("args", []), **payload.get("kwargs", {}))


# --------------------------------------------------------------------------- child side


class SandboxViolation(PermissionError):
    """Raised inside the sandbox when the candidate code attempts a blocked operation."""


class _FrameAccessBlocked(AttributeError):
    """Frame introspection is blocked; an AttributeError so stdlib helpers that probe
    the caller's frame (namedtuple, enum, typing) fall back gracefully."""


_PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.fork", "os.forkpty",
                   "os.spawn", "os.posix_spawn", "pty.spawn", "os.startfile", "os.kill",
                   "os.killpg", "signal.pthread_kill")
_FRAME_EVENTS = ("sys._getframe", "sys._current_frames", "sys._current_exceptions",
                 "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.setprofile",
                 "sys.settrace", "sys._getframemodulename")
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_globals",
                          "f_locals", "gi_code", "cr_code"})
_PROTECTED_MODULES = frozenset({"pathlib", "builtins", "posixpath", "os", "io", "_io", "json",
                                "json.encoder", "esopt.sandbox"})
# event -> positions of path arguments that must lie inside the sandbox directory
_PATH_EVENTS = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
    "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,),
    "os.mkfifo": (0,), "os.mknod": (0,), "os.setxattr": (0,), "os.removexattr": (0,),
    "os.chflags": (0,), "os.lchflags": (0,), "shutil.rmtree": (0,), "shutil.move": (0, 1),
    "shutil.copyfile": (1,), "shutil.copymode": (1,), "shutil.copystat": (1,),
    "shutil.chown": (0,), "shutil.make_archive": (0,), "shutil.unpack_archive": (1,),
}


def _make_hook(root: str):
    import pathlib

    trusted = [False]  # reachable only through this closure (frames and gc are blocked)
    sep_root = root.rstrip("/") + "/"
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    pathlike_ok = (pathlib.PosixPath, pathlib.PurePosixPath)
    fspath, fsdecode, normpath, join, isabs = os.fspath, os.fsdecode, os.path.normpath, os.path.join, os.path.isabs

    def inside(p, relative_ok=True) -> bool:
        if isinstance(p, int) or p is None:
            return True  # an already-open descriptor (its opening was checked)
        if type(p) not in (str, bytes) and type(p) not in pathlike_ok:
            return False  # custom PathLike objects could answer differently on a second call
        s = fsdecode(fspath(p))
        if "\x00" in s:
            return False
        if not isabs(s):
            if not relative_ok:
                return False
            s = join(root, s)
        s = normpath(s)
        return s == root or s.startswith(sep_root) or s == "/dev/null"

    def hook(event: str, args: tuple) -> None:
        if trusted[0]:
            return
        if event.startswith("socket."):
            raise SandboxViolation("blocked: network access")
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, 0))[:3]
            if isinstance(mode, str):
                writing = any(c in mode for c in "wax+")
                rel_ok = True
            else:  # os.open: mode is None, flags carry the intent; dir_fd is invisible here
                writing = bool((flags or 0) & write_flags)
                rel_ok = False
            if writing and not inside(path, rel_ok):
                raise SandboxViolation("blocked: file write outside sandbox")
            return
        if event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and not inside(args[i]):
                    raise SandboxViolation("blocked: file write outside sandbox")
            return
        if event.startswith(_PROCESS_EVENTS):
            raise SandboxViolation(f"blocked: process creation ({event})")
        if event in ("os.symlink", "os.link"):
            raise SandboxViolation("blocked: creating links")
        if event == "os.chdir" or event == "os.fchdir" or event == "os.chroot":
            raise SandboxViolation("blocked: changing directory")
        if event.startswith("ctypes."):
            raise SandboxViolation("blocked: ctypes")
        if event in ("_thread.start_new_thread", "threading.Thread.start"):
            raise SandboxViolation("blocked: threads")
        if event.startswith("resource."):
            raise SandboxViolation("blocked: changing resource limits")
        if event == "sqlite3.connect":
            if args and args[0] not in (":memory:", b":memory:") and not inside(args[0]):
                raise SandboxViolation("blocked: file write outside sandbox")
            return
        if event in _FRAME_EVENTS:
            raise _FrameAccessBlocked(f"blocked: frame/interpreter introspection ({event})")
        if event == "object.__getattr__" and len(args) >= 2 and args[1] in _FRAME_ATTRS:
            raise _FrameAccessBlocked(f"blocked: frame introspection ({args[1]})")
        if event == "object.__setattr__" and args and isinstance(args[0], type) \
                and getattr(args[0], "__module__", "") in _PROTECTED_MODULES:
            raise SandboxViolation("blocked: patching built-in types")

    return hook, trusted


def _set_limits(lim: dict) -> None:
    import resource

    def setl(which, soft, hard=None):
        hard = soft if hard is None else hard
        try:
            cur_soft, cur_hard = resource.getrlimit(which)
            if cur_hard != resource.RLIM_INFINITY:
                soft, hard = min(soft, cur_hard), min(hard, cur_hard)
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError):
            pass

    mem = int(lim["memory_mb"]) * 1024 * 1024
    setl(resource.RLIMIT_AS, mem)
    cpu = int(math.ceil(float(lim["timeout_s"]))) + 1
    setl(resource.RLIMIT_CPU, cpu, cpu + 2)
    setl(resource.RLIMIT_FSIZE, int(lim["max_file_mb"]) * 1024 * 1024)
    setl(resource.RLIMIT_CORE, 0)
    if hasattr(resource, "RLIMIT_NPROC"):
        setl(resource.RLIMIT_NPROC, 0)


def _tb_entries(exc: BaseException, trusted: list) -> list[tuple[str, str, int]]:
    """(filename, function, line) of each traceback entry, read with the hook relaxed.

    Only attribute reads on interpreter objects happen while relaxed: no code the
    candidate could have patched runs then."""
    out = []
    trusted[0] = True
    try:
        tb = exc.__traceback__
        while tb is not None and len(out) < 200:
            code = tb.tb_frame.f_code
            out.append((code.co_filename, code.co_name, tb.tb_lineno))
            tb = tb.tb_next
    except BaseException:  # noqa: BLE001
        pass
    finally:
        trusted[0] = False
    return out


def _describe(exc: BaseException, filename: str, entries: list) -> str:
    if isinstance(exc, MemoryError):
        return "memory limit exceeded"
    if isinstance(exc, (SandboxViolation, _FrameAccessBlocked)):
        return str(exc)
    if isinstance(exc, SyntaxError):
        msg = f"{type(exc).__name__}: {exc.msg}"
        line = exc.lineno if exc.filename == filename else None
    else:
        try:
            text = str(exc).strip().splitlines()
        except BaseException:  # noqa: BLE001
            text = []
        msg = type(exc).__name__ + (f": {text[0]}" if text else "")
        lines = [ln for fn, _, ln in entries if fn == filename]
        line = lines[-1] if lines else None
    if line is not None:
        msg += f" (line {line})"
    return msg[:1000]


def _format_tb(exc: BaseException, entries: list, filename: str, source: str) -> str:
    src = source.splitlines()
    parts = ["Traceback (most recent call last):\n"]
    here = __file__
    for fn, name, ln in entries:
        if fn == here:
            continue
        parts.append(f'  File "{fn}", line {ln}, in {name}\n')
        if fn == filename and 0 < ln <= len(src):
            parts.append(f"    {src[ln - 1].strip()}\n")
    if isinstance(exc, SyntaxError):
        parts = [f'  File "{exc.filename}", line {exc.lineno}\n']
        if exc.text:
            parts.append(f"    {exc.text.strip()}\n")
    try:
        msg = str(exc)
    except BaseException:  # noqa: BLE001
        msg = "<unprintable>"
    parts.append(f"{type(exc).__name__}: {msg}\n" if msg else f"{type(exc).__name__}\n")
    return "".join(parts)


def _find_violation(exc: BaseException | None) -> BaseException | None:
    """A blocked operation may surface wrapped in another exception; find it in the chain."""
    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, (SandboxViolation, _FrameAccessBlocked)):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _child_main(req_path: str, result_fd: int) -> None:  # pragma: no cover - runs in the child
    import builtins
    import importlib
    import types

    sys.dont_write_bytecode = True
    with open(req_path) as f:
        req = json.load(f)
    os.remove(req_path)
    nonce = req.pop("nonce")
    root = req["root"]
    mode = req["mode"]
    filename = "<candidate>" if mode == "call" else "<script>"
    dumps, fdopen, encode = json.dumps, os.fdopen, str.encode

    def send(obj: dict) -> None:
        try:
            data = dumps(obj, allow_nan=True)
        except (TypeError, ValueError) as e:
            data = dumps({"ok": False, "error": f"return value is not JSON-serialisable: {e}"})
        with fdopen(result_fd, "wb", closefd=True) as w:
            w.write(encode(nonce + "\n" + data, "utf-8"))

    # trusted imports happen before any limit or hook
    fn = None
    try:
        try:
            import numpy  # noqa: F401  (so candidate code can use it under the hook)
        except ImportError:
            pass
        if mode == "call":
            mod_name, _, fn_name = req["entry"].partition(":")
            fn = getattr(importlib.import_module(mod_name), fn_name)
    except BaseException as e:  # noqa: BLE001
        send({"ok": False, "error": f"sandbox setup failed: {type(e).__name__}: {e}"})
        return

    _set_limits(req["limits"])
    hook, trusted = _make_hook(root)
    sys.addaudithook(hook)
    payload = req.get("payload")
    code = req["code"]
    del req

    module = types.ModuleType("__main__" if mode == "script" else "candidate")
    module.__dict__["__builtins__"] = builtins
    result: dict
    try:
        compiled = compile(code, filename, "exec", dont_inherit=True)
        sys.modules[module.__name__] = module
        exec(compiled, module.__dict__)
        if mode == "call":
            value = fn(module.__dict__, payload)
            try:
                result = {"ok": True, "value": to_jsonable(value)}
            except TypeError as e:
                result = {"ok": False, "error": f"return value is not JSON-serialisable: {e}"}
        else:
            result = {"ok": True, "value": None}
    except SystemExit as e:
        if mode == "script" and (e.code is None or e.code == 0):
            result = {"ok": True, "value": None}
        else:
            result = {"ok": False, "error": f"SystemExit: {e.code}"}
    except BaseException as e:  # noqa: BLE001
        v = _find_violation(e)
        if isinstance(e, MemoryError):
            entries = []
        else:
            entries = _tb_entries(v if v is not None else e, trusted)
        err = str(v) if v is not None else _describe(e, filename, entries)
        result = {"ok": False, "error": err}
        if not isinstance(e, MemoryError):
            try:
                sys.__stderr__.write(_format_tb(v if v is not None else e, entries, filename, code))
            except BaseException:  # noqa: BLE001
                pass
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    send(result)
