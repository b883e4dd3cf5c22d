"""Env plugins: a package with an `esopt.envs` entry point adds an env with no change to esopt; a broken
one is a one-line message naming it and harms no other env."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from esopt.cli import main as cli
from esopt.confutil import ConfigError
from esopt.envs import env_class, env_names, env_origin, make_env

ROOT = Path(__file__).resolve().parents[1]


def _fake_distribution(directory: Path, name: str, entry_points: str) -> None:
    """The installed metadata of a package whose entry points are `entry_points` (as in entry_points.txt)."""
    info = directory / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)


@pytest.fixture
def broken_plugins(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, "broken-envs", "[esopt.envs]\nmissing = no_such_module_anywhere:Env\nnotanenv = json:dumps\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def test_broken_plugins_are_one_line_errors_naming_them(broken_plugins, capsys, tmp_path):
    assert {"missing", "notanenv", "sudoku"} <= set(env_names())
    with pytest.raises(ConfigError, match=r"plugin 'missing' \(no_such_module_anywhere:Env, from package broken-envs\) could not be loaded: ModuleNotFoundError"):
        env_class("missing")
    with pytest.raises(ConfigError, match="plugin 'notanenv'.* not a subclass of esopt.envs.Env"):
        env_class("notanenv")
    assert make_env("sudoku").tasks("train", 1, 0)  # the other envs are untouched
    assert cli(["envs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("missing: unavailable (plugin 'missing'") for line in lines)
    assert "sudoku:" in lines and "  --env.empty_cells" in "\n".join(lines)
    assert cli(["train", "--env", "missing", "--runs_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "plugin 'missing'" in err[0] and "broken-envs" in err[0]


def test_a_plugin_never_replaces_a_built_in_env(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, "impostor", "[esopt.envs]\nsudoku = json:dumps\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(UserWarning, match="ignoring plugin 'sudoku'.* from package impostor"):
        assert env_names().count("sudoku") == 1
    assert env_class("sudoku").__module__.startswith("esopt.envs.sudoku") and env_origin("sudoku") == "built-in env 'sudoku'"


def test_module_class_references_and_their_errors():
    assert env_class("esopt.envs.sudoku:SudokuEnv") is env_class("sudoku")
    with pytest.raises(ConfigError, match="unknown env 'chess'.*module:Class"):
        env_class("chess")
    with pytest.raises(ConfigError, match="env reference 'esopt.envs.sudoku:NoSuchEnv' could not be loaded"):
        env_class("esopt.envs.sudoku:NoSuchEnv")


def test_plugin_package_installs_lists_trains_and_meets_the_contract(tmp_path, tiny_model_dir):
    """pip-installs examples/plugin_env into a directory of its own (no esopt change, no network), then
    uses its env through the CLI and runs the env contract over it."""
    source = tmp_path / "plugin_env"
    shutil.copytree(ROOT / "examples" / "plugin_env", source)  # pip builds in the source tree: keep the repo clean
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(source)]
    subprocess.run(pip, check=True, capture_output=True, text=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT)])}

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout

    listed = run("-m", "esopt.cli", "envs")
    assert "reverse: plugin 'reverse' (esopt_reverse_env:ReverseEnv, from package esopt-reverse-env)" in listed
    assert "--env.length (default 5)" in listed
    run("-m", "esopt.cli", "train", "--env", "reverse", "--env.length", "4", "--model.path", str(tiny_model_dir),
        "--steps", "1", "--tasks_per_step", "2", "--eval_tasks", "2", "--es.population", "2",
        "--runs_dir", str(tmp_path / "runs"), "--run_name", "reverse")
    assert len((tmp_path / "runs" / "reverse" / "history.jsonl").read_text().splitlines()) == 1
    assert "name: reverse" in (tmp_path / "runs" / "reverse" / "config.yaml").read_text()
    contract = run("-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "test_env_contract.py"), "-k", "reverse")
    assert "\n6 passed" in "\n" + contract, contract  # every contract check, the oracle included, ran on the plugin
