"""Hostile and ordinary code through esopt.sandbox: every failure is a clear error, never a crash here."""

from __future__ import annotations

import os
import uuid

import pytest

from esopt.sandbox import Limits, SandboxResult, call_in_sandbox, run_script

FAST = Limits(timeout_s=2.0, memory_mb=512)


def test_normal_script_stdout_and_stdin():
    r = run_script("import sys\nprint('hello', sys.stdin.read().strip())\nprint(2 + 3)", FAST, stdin="world")
    assert isinstance(r, SandboxResult)
    assert r.ok, r.error
    assert r.stdout == "hello world\n5\n"
    assert r.error is None
    assert r.duration_s > 0


def test_script_can_use_numpy():
    r = run_script("import numpy as np\nprint(int(np.arange(10).sum()))", FAST)
    assert r.ok, r.error
    assert r.stdout.strip() == "45"


def test_infinite_loop_times_out():
    r = run_script("while True:\n    pass", Limits(timeout_s=1.0))
    assert not r.ok
    assert r.error == "timeout after 1.0s"


def test_sleep_times_out():
    r = run_script("import time\ntime.sleep(60)", Limits(timeout_s=0.5))
    assert not r.ok and r.error.startswith("timeout")


@pytest.mark.parametrize("code", [
    "x = bytearray(8 * 1024 ** 3)",
    "x = [0] * (10 ** 10)",
    "import numpy as np\nx = np.ones(10 ** 10)",
    "s = 'a'\nwhile True:\n    s = s + s",
])
def test_memory_bomb(code):
    r = run_script(code, Limits(timeout_s=5.0, memory_mb=400))
    assert not r.ok
    assert r.error == "memory limit exceeded"


def test_os_system_blocked():
    r = run_script("import os\nos.system('echo hi')", FAST)
    assert not r.ok
    assert r.error.startswith("blocked: process creation")
    assert "hi" not in r.stdout


@pytest.mark.parametrize("code", [
    "import subprocess\nsubprocess.run(['echo', 'hi'])",
    "import subprocess\nsubprocess.check_output('echo hi', shell=True)",
    "import os\nos.fork()",
    "import os\nos.execv('/bin/echo', ['echo', 'hi'])",
    "import os\nos.popen('echo hi').read()",
    "import pty\npty.spawn('/bin/sh')",
])
def test_process_creation_blocked(code):
    r = run_script(code, FAST)
    assert not r.ok
    assert r.error.startswith("blocked: process creation"), r.error
    assert "hi" not in r.stdout


def test_socket_blocked():
    code = "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\ns.connect(('127.0.0.1', 80))"
    r = run_script(code, FAST)
    assert not r.ok
    assert r.error == "blocked: network access"


def test_socket_via_urllib_blocked():
    r = run_script("import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9/')", FAST)
    assert not r.ok
    assert r.error == "blocked: network access"


@pytest.mark.parametrize("how", [
    "open({p!r}, 'w').write('x')",
    "open({p!r}, 'a').write('x')",
    "import pathlib\npathlib.Path({p!r}).write_text('x')",
    "import os\nos.open({p!r}, os.O_WRONLY | os.O_CREAT)",
    "open('../' + {p!r}.split('/')[-1], 'w').write('x')",
    "import shutil\nshutil.copyfile('/etc/hostname' if False else __import__('os').devnull, {p!r})",
])
def test_write_outside_blocked(how):
    path = f"/tmp/xyz_escape_{uuid.uuid4().hex}"
    r = run_script(how.format(p=path), FAST)
    try:
        assert not r.ok
        assert r.error == "blocked: file write outside sandbox", r.error
        assert not os.path.exists(path)
    finally:
        if os.path.exists(path):
            os.remove(path)


def test_remove_outside_blocked(tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("keep")
    r = run_script(f"import os\nos.remove({str(victim)!r})", FAST)
    assert not r.ok and r.error == "blocked: file write outside sandbox"
    assert victim.read_text() == "keep"


def test_write_inside_cwd_allowed_and_cleaned_up():
    code = ("import os\nopen('out.txt', 'w').write('data')\nos.mkdir('sub')\n"
            "open('sub/x', 'w').write('y')\nprint(open('out.txt').read(), os.getcwd())")
    r = run_script(code, FAST)
    assert r.ok, r.error
    text, cwd = r.stdout.split()
    assert text == "data"
    assert not os.path.exists(cwd)  # the temporary directory is deleted afterwards


def test_environment_scrubbed():
    os.environ["ESOPT_SECRET_FOR_TEST"] = "hunter2"
    try:
        r = run_script("import os\nprint(sorted(os.environ))\nprint(os.environ.get('ESOPT_SECRET_FOR_TEST'))", FAST)
    finally:
        del os.environ["ESOPT_SECRET_FOR_TEST"]
    assert r.ok, r.error
    assert "hunter2" not in r.stdout
    assert "OMP_NUM_THREADS" in r.stdout


def test_syntax_error_is_clear():
    r = run_script("x = 1\ndef f(:\n    pass", FAST)
    assert not r.ok
    assert r.error.startswith("SyntaxError:")
    assert "line 2" in r.error


def test_runtime_exception_is_clear():
    r = run_script("x = 1\ny = x / 0", FAST)
    assert not r.ok
    assert r.error == "ZeroDivisionError: division by zero (line 2)"
    assert "ZeroDivisionError" in r.stderr


def test_nonzero_exit_is_failure_zero_exit_is_ok():
    assert run_script("import sys\nsys.exit(3)", FAST).error == "SystemExit: 3"
    r = run_script("import sys\nprint('bye')\nsys.exit(0)", FAST)
    assert r.ok and r.stdout == "bye\n"


def test_output_truncated():
    r = run_script("print('x' * 100000)", Limits(timeout_s=2.0, max_output_chars=1000))
    assert r.ok
    assert len(r.stdout) < 1100
    assert "truncated" in r.stdout


def test_stdlib_helpers_that_probe_frames_still_work():
    code = ("import collections, enum, dataclasses, typing\n"
            "P = collections.namedtuple('P', 'x y')\n"
            "class E(enum.Enum):\n    A = 1\n"
            "@dataclasses.dataclass\nclass D:\n    v: int = 2\n"
            "class T(typing.NamedTuple):\n    a: int\n"
            "print(P(1, 2).x, E.A.value, D().v, T(4).a)")
    r = run_script(code, FAST)
    assert r.ok, (r.error, r.stderr)
    assert r.stdout.split() == ["1", "1", "2", "4"]


def test_frame_introspection_blocked():
    r = run_script("import sys\nprint(sys._getframe(0).f_back)", FAST)
    assert not r.ok and r.error.startswith("blocked: frame")


def test_call_in_sandbox_returns_value():
    code = "import numpy as np\ndef double(x):\n    return {'v': np.arange(x) * 2, 't': (1, 2.5)}"
    r = call_in_sandbox(code, "esopt.sandbox:call_function", {"function": "double", "args": [3]}, FAST)
    assert r.ok, r.error
    assert r.value == {"v": [0, 2, 4], "t": [1, 2.5]}


def test_call_in_sandbox_payload_numpy_and_errors():
    import numpy as np

    code = "def total(xs):\n    return sum(xs)"
    r = call_in_sandbox(code, "esopt.sandbox:call_function", {"function": "total", "args": [np.arange(4)]}, FAST)
    assert r.ok and r.value == 6
    r = call_in_sandbox("def total(xs):\n    raise ValueError('nope')", "esopt.sandbox:call_function",
                        {"function": "total", "args": [[1]]}, FAST)
    assert not r.ok and r.error == "ValueError: nope (line 2)"
    r = call_in_sandbox("x = 1", "esopt.sandbox:call_function", {"function": "total", "args": []}, FAST)
    assert not r.ok and "does not define 'total'" in r.error
    r = call_in_sandbox("def total():\n    return object()", "esopt.sandbox:call_function",
                        {"function": "total"}, FAST)
    assert not r.ok and "not JSON-serialisable" in r.error
    r = call_in_sandbox("def total():\n    while True: pass", "esopt.sandbox:call_function",
                        {"function": "total"}, Limits(timeout_s=1.0))
    assert not r.ok and r.error == "timeout after 1.0s"


def test_candidate_cannot_forge_result():
    # writing to every inherited descriptor and exiting early must not produce a value
    code = ("import os\nfor fd in range(3, 20):\n    try:\n        os.write(fd, b'{\"ok\": true, \"value\": 1}')\n"
            "    except OSError:\n        pass\nos._exit(0)")
    r = call_in_sandbox(code, "esopt.sandbox:call_function", {"function": "f"}, FAST)
    assert not r.ok
    assert r.value is None
