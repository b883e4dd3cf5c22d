"""The sandbox's callers: AHD runs and the math env's python tool choose, record and enforce the isolation."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import pytest

from esopt.confutil import ConfigError
from esopt.envs import make_env
from esopt.ahd.tasks import get_task
from esopt.sandbox import Limits
from esopt.ahd.config import AHDConfig
from esopt.ahd.loops import run_ahd
from test_ahd_loops import NN, ScriptedPolicy

NO_BWRAP_ENV = {"PATH": "/nonexistent", "HOME": tempfile.gettempdir()}


def _ahd_config(tmp_path, **kw) -> AHDConfig:
    cfg = AHDConfig(task="tsp20", method="sample", budget=2, population=2, eval_instances=1, eval_workers=1,
                    runs_dir=str(tmp_path), run_name="run", **kw)
    cfg.sampling.max_new_tokens = 16
    return cfg


@pytest.mark.parametrize("isolation", ["bwrap", "python"])
def test_ahd_run_records_and_reports_its_isolation(tmp_path, isolation):
    summary = run_ahd(_ahd_config(tmp_path, isolation=isolation), policy=ScriptedPolicy([f"```python\n{NN}```"] * 2))
    assert summary["best_objective"] is not None
    assert summary["isolation"] == isolation
    run_dir = tmp_path / "run"
    assert json.loads((run_dir / "summary.json").read_text())["isolation"] == isolation
    assert f"isolation: {isolation}" in (run_dir / "config.yaml").read_text()
    assert f"Candidates ran in the sandbox with isolation: {isolation}." in (run_dir / "report.md").read_text()


def test_ahd_evaluation_says_which_isolation_ran():
    task = get_task("tsp20")
    for isolation in ("bwrap", "python"):
        ev = task.evaluate(NN, n_instances=1, limits=Limits(timeout_s=30.0, isolation=isolation))
        assert ev.valid and ev.isolation == isolation


def test_ahd_config_rejects_an_unknown_isolation(tmp_path):
    with pytest.raises(ConfigError, match="isolation must be one of bwrap, python"):
        _ahd_config(tmp_path, isolation="container").validate()


def test_ahd_run_is_refused_in_one_line_without_bwrap(tmp_path):
    done = subprocess.run([sys.executable, "-m", "esopt.cli", "ahd", "run", "--task", "tsp20", "--budget", "1",
                           "--runs_dir", str(tmp_path)], capture_output=True, text=True, timeout=300, env=NO_BWRAP_ENV)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "esopt: error: cannot run LLM-written code: bubblewrap (bwrap) is not installed; install bubblewrap 0.8 "
        "or newer (apt-get install bubblewrap) or set isolation: python"]
    assert list(tmp_path.iterdir()) == []  # refused before a run directory or a model


def _python_step(env):
    task = env.tasks("train", 1, 0)[0]
    return env.start(task).step("python:\n```python\nprint(6 * 7)\n```")


@pytest.mark.parametrize("isolation", ["bwrap", "python"])
def test_math_python_tool_records_its_isolation(isolation):
    r = _python_step(make_env("math", {"python_timeout_s": 5.0, "python_isolation": isolation}))
    assert r.info["tool_ok"] and "42" in r.observation
    assert r.info["isolation"] == isolation


def test_math_env_rejects_an_unknown_isolation():
    with pytest.raises(ConfigError, match="math.python_isolation must be one of bwrap, python"):
        make_env("math", {"python_isolation": "none"})


def test_math_env_with_python_tool_is_refused_without_bwrap():
    probe = ("from esopt.envs import make_env\n"
             "make_env('math', {'tools': ['calculator']})\n"  # no python tool: nothing to contain
             "make_env('math', {'python_isolation': 'python'})\n"  # chosen explicitly
             "try:\n    make_env('math')\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=NO_BWRAP_ENV)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "ConfigError math.python_isolation: cannot run LLM-written code: bubblewrap (bwrap) is not installed; "
        "install bubblewrap 0.8 or newer (apt-get install bubblewrap) or set isolation: python")
