"""The sandboxed child: everything here runs in the child process, set up before the untrusted code.

The parent starts the interpreter with `BOOTSTRAP` (python -I -S -c BOOTSTRAP REQUEST_FD RESULT_FD).
The request (a marshal blob read from an inherited, already unlinked file) carries this module and
every other trusted module the child needs as compiled code, so the child needs no view of the
project directory. `main` then imports numpy and the trusted entry function, installs the seccomp
filter (under bwrap), lowers the rlimits, adds the audit hook and only then runs the untrusted code.
"""

from __future__ import annotations

import errno
import json
import math
import os
import sys
from typing import Any

# Runs as `python -I -S -c BOOTSTRAP REQUEST_FD RESULT_FD`: loads this module from the request and
# hands over. `main` empties the request dict, so nothing in it stays reachable from `__main__`.
BOOTSTRAP = (
    "import marshal, os, sys, types\n"
    "with os.fdopen(int(sys.argv[1]), 'rb') as f:\n"
    "    request = marshal.load(f)\n"
    "filename, _, code = request['modules']['esopt.sandbox.child']\n"
    "child = types.ModuleType('esopt.sandbox.child')\n"
    "child.__file__ = filename\n"
    "sys.modules[child.__name__] = child\n"
    "exec(code, child.__dict__)\n"
    "child.main(request, int(sys.argv[2]))\n"
)


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


class SandboxViolation(PermissionError):
    """Raised inside the sandbox when the candidate code attempts a blocked operation."""


class _FrameAccessBlocked(AttributeError):
    """Frame introspection is blocked; an AttributeError so stdlib helpers that probe
    the caller's frame (namedtuple, enum, typing) fall back gracefully."""


class ShippedModules:
    """Import finder for the trusted modules the parent shipped as code objects in the request.

    Each entry is (filename, is_package, code); code None stands for a package whose `__init__` the
    shipped modules do not need (it is not run, so importing a driver does not import a registry)."""

    def __init__(self, modules: dict):
        from importlib.machinery import ModuleSpec  # not inside find_spec: that would recurse

        self.modules = modules
        self.spec = ModuleSpec

    def find_spec(self, name, path=None, target=None):
        entry = self.modules.get(name)
        if entry is None:
            return None
        return self.spec(name, self, origin=entry[0], is_package=entry[1])

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        filename, _, code = self.modules[module.__name__]
        module.__file__ = filename
        if code is not None:
            exec(code, module.__dict__)


# --------------------------------------------------------------------------- the audit hook

_PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.fork", "os.forkpty",
                   "os.spawn", "os.posix_spawn", "pty.spawn", "os.startfile", "os.kill",
                   "os.killpg", "signal.pthread_kill")
_FRAME_EVENTS = ("sys._getframe", "sys._current_frames", "sys._current_exceptions",
                 "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.setprofile",
                 "sys.settrace", "sys._getframemodulename")
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_globals",
                          "f_locals", "gi_code", "cr_code"})
_PROTECTED_MODULES = frozenset({"pathlib", "builtins", "posixpath", "os", "io", "_io", "json",
                                "json.encoder", "esopt.sandbox.child"})
# event -> positions of path arguments that must lie inside the sandbox directory
_PATH_EVENTS = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
    "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,),
    "os.mkfifo": (0,), "os.mknod": (0,), "os.setxattr": (0,), "os.removexattr": (0,),
    "os.chflags": (0,), "os.lchflags": (0,), "shutil.rmtree": (0,), "shutil.move": (0, 1),
    "shutil.copyfile": (1,), "shutil.copymode": (1,), "shutil.copystat": (1,),
    "shutil.chown": (0,), "shutil.make_archive": (0,), "shutil.unpack_archive": (1,),
}
# Other processes' memory and environment (secrets of the parent) live under /proc.
_LISTING_EVENTS = ("os.listdir", "os.scandir")


def _make_hook(root: str):
    import pathlib

    trusted = [False]  # reachable only through this closure (frames and gc are blocked)
    sep_root = root.rstrip("/") + "/"
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    pathlike_ok = (pathlib.PosixPath, pathlib.PurePosixPath)
    fspath, fsdecode, normpath, join, isabs = os.fspath, os.fsdecode, os.path.normpath, os.path.join, os.path.isabs

    def resolved(p, relative_ok=True) -> str | None:
        """The normalised absolute path, or None when it cannot be judged safely."""
        if type(p) not in (str, bytes) and type(p) not in pathlike_ok:
            return None  # custom PathLike objects could answer differently on a second call
        s = fsdecode(fspath(p))
        if "\x00" in s:
            return None
        if not isabs(s):
            if not relative_ok:
                return None
            s = join(root, s)
        return normpath(s)

    def inside(p, relative_ok=True) -> bool:
        if isinstance(p, int) or p is None:
            return True  # an already-open descriptor (its opening was checked)
        s = resolved(p, relative_ok)
        return s is not None and (s == root or s.startswith(sep_root) or s == "/dev/null")

    def in_proc(p) -> bool:
        if isinstance(p, int) or p is None:
            return False
        s = resolved(p)
        return s is not None and (s == "/proc" or s.startswith("/proc/"))

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
            if in_proc(path):
                raise SandboxViolation("blocked: /proc access")
            return
        if event in _LISTING_EVENTS:
            if args and in_proc(args[0]):
                raise SandboxViolation("blocked: /proc access")
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
        setl(resource.RLIMIT_NPROC, 0)  # no effect for (host) root; seccomp covers that case


# --------------------------------------------------------------------------- error reports


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
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:  # Python ignores SIGXFSZ: writes fail instead
        return "file size limit exceeded (stdout included)"
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


# --------------------------------------------------------------------------- main


def main(request: dict, result_fd: int) -> None:  # pragma: no cover - runs in the child
    import builtins
    import importlib
    import types

    sys.dont_write_bytecode = True
    sys.meta_path.insert(0, ShippedModules(request["modules"]))
    sys.path.extend(request["site_paths"])
    nonce, root, mode = request["nonce"], request["root"], request["mode"]
    limits, seccomp, code = request["limits"], request["seccomp"], request["code"]
    entry, payload = request.get("entry"), request.get("payload")
    request.clear()
    filename = "<candidate>" if mode == "call" else "<script>"
    dumps, fdopen, encode = json.dumps, os.fdopen, str.encode

    def send(obj: dict) -> None:
        try:
            data = dumps(obj, allow_nan=True)
        except (TypeError, ValueError) as e:
            data = dumps({"ok": False, "error": f"return value is not JSON-serialisable: {e}"})
        with fdopen(result_fd, "wb", closefd=True) as w:
            w.write(encode(nonce + "\n" + data, "utf-8"))

    # trusted imports and the seccomp filter happen before any limit or hook
    fn = None
    try:
        try:
            import numpy  # noqa: F401  (so candidate code can use it under the hook)
        except ImportError:
            pass
        if mode == "call":
            mod_name, _, fn_name = entry.partition(":")
            fn = getattr(importlib.import_module(mod_name), fn_name)
        if seccomp:
            from esopt.sandbox.seccomp import forbid_escape_syscalls

            forbid_escape_syscalls()
    except BaseException as e:  # noqa: BLE001
        send({"ok": False, "error": f"sandbox setup failed: {type(e).__name__}: {e}"})
        return

    _set_limits(limits)
    hook, trusted = _make_hook(root)
    sys.addaudithook(hook)

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
            result = {"ok": True, "value": None}  # a script's normal way to end early
        elif mode == "script":
            result = {"ok": False, "error": f"SystemExit: {e.code}"}
        else:
            result = {"ok": False, "error": f"exited before returning a result (SystemExit: {e.code})"}
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
