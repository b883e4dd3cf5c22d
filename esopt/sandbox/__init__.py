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

Containment, all in place before the untrusted code runs (details in `bwrap`, `seccomp`, `child`):

* OS isolation (`Limits.isolation = "bwrap"`, the default): the child runs under bubblewrap in
  fresh user, pid, network, ipc, uts and cgroup namespaces as uid 65534 with no capabilities,
  sees a read-only root holding only the system libraries, the interpreter and its site-packages,
  works in a private tmpfs (its cwd, HOME and TMPDIR) of `max_file_mb`, has no /proc, no network
  beyond its own loopback and no way to create user namespaces, and dies with its parent. It
  installs a seccomp filter on itself that denies process creation (fork, clone, execve), sockets,
  namespaces, mounts, ptrace and other kernel interfaces it has no use for. The child needs no view
  of the project: the trusted modules it runs are shipped to it as compiled code (`trusted`).
  When bubblewrap is missing or cannot set up the namespaces, `run_script` and `call_in_sandbox`
  raise `IsolationUnavailable` (one line naming the fix) instead of running the code.
* The in-process layer (always; alone with `isolation="python"`, which is not a security
  boundary): a separate isolated interpreter (`python -I -S`) in its own session, killed with all
  it started at the wall-clock timeout; rlimits (RLIMIT_AS memory, RLIMIT_CPU timeout + 1 s,
  RLIMIT_FSIZE, RLIMIT_NPROC = 0, RLIMIT_CORE = 0); a scrubbed environment (PATH, HOME, TMPDIR,
  LANG and single-thread settings for OpenMP/MKL/OpenBLAS/numexpr); and an audit hook (PEP 578)
  that rejects sockets, process creation, signals to other processes, threads, ctypes, rlimit
  changes, chdir, links, /proc, writes/removes/renames/chmods outside the sandbox directory, and
  frame/garbage-collector introspection, so LLM code cannot reach the trusted caller's state.

Data crosses the boundary through inherited descriptors: the request (a marshal blob with the
trusted modules' code, the user code and the payload) through an already unlinked file that the
child reads and closes before user code runs, the result as JSON through a pipe, prefixed by a
random nonce the user code never sees, so a candidate cannot forge a result by printing, writing
to descriptors or exiting early: a child that ends without sending its result (sys.exit in a
call, os._exit, a signal, a timeout) is reported as failed with its reason. numpy arrays and
scalars in a returned value are converted to lists / Python numbers.

Trusted `entry` functions share the interpreter with the untrusted code, which can monkeypatch
modules it imports; evaluators whose score matters return *solutions* and recompute the score in
the parent (the AHD envs do).
"""

from esopt.sandbox.bwrap import IsolationUnavailable
from esopt.sandbox.child import SandboxViolation, call_function, to_jsonable
from esopt.sandbox.runner import ISOLATIONS, Limits, SandboxResult, call_in_sandbox, require_isolation, run_script

__all__ = ["ISOLATIONS", "IsolationUnavailable", "Limits", "SandboxResult", "SandboxViolation", "call_function",
           "call_in_sandbox", "require_isolation", "run_script", "to_jsonable"]
