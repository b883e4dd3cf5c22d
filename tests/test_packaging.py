"""esopt works when installed from its wheel, outside the checkout: built-in configs resolve by name."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from esopt.confutil import ConfigError, builtin_configs, resolve_config
from esopt.train.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def test_config_names_resolve_to_the_shipped_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ here
    assert resolve_config("sudoku_demo") == builtin_configs()["sudoku_demo"]
    assert resolve_config("sudoku_demo.yaml") == builtin_configs()["sudoku_demo"]
    assert resolve_config("configs/sudoku_demo.yaml") == builtin_configs()["sudoku_demo"]  # the README's form
    assert load_config("sudoku_demo").env.options["size"] == 4
    own = tmp_path / "sudoku_demo.yaml"  # a file of that name in the working directory wins
    own.write_text("steps: 3\n")
    assert load_config("sudoku_demo.yaml").steps == 3
    with pytest.raises(ConfigError, match="built-in configs: .*sudoku_demo"):
        resolve_config("sudoku_dmeo")


def test_configs_command_lists_every_builtin(capsys):
    from esopt.cli import main

    assert main(["configs"]) == 0
    out = capsys.readouterr().out
    assert set(builtin_configs()) <= {line.split()[0] for line in out.splitlines() if line.strip()}
    assert {"sudoku_demo", "sudoku", "ahd_sample"} <= set(builtin_configs())


def _run(args, cwd, env):
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{args} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a build, an install and a training run in subprocesses: minutes on a busy machine
def test_wheel_installs_and_trains_by_config_name_outside_the_checkout(tmp_path):
    """Build the wheel, install it (no deps: they are this venv's) into a target directory, and from an
    empty directory list the configs and train one ES step on a tiny model by config name."""
    from tiny_models import tiny_llama

    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)], ROOT, os.environ)
    wheel = next(dist.glob("esopt-*.whl"))
    target = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)], tmp_path, os.environ)
    model_dir = tmp_path / "tiny-model"
    model, tokenizer = tiny_llama(seed=0)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}  # the installed copy, not the checkout
    where = _run([sys.executable, "-c", "import esopt; print(esopt.__file__)"], empty, env)
    assert Path(where.strip()).is_relative_to(target)
    esopt = str(target / "bin" / "esopt")
    listing = _run([esopt, "configs"], empty, env)
    assert "sudoku_demo" in listing
    _run(
        [esopt, "train", "--config", "sudoku_demo", "--model.path", str(model_dir), "--model.dtype", "float32",
         "--steps", "1", "--es.population", "2", "--tasks_per_step", "1", "--eval_tasks", "1", "--eval_every", "0",
         "--probe_tasks", "0", "--runs_dir", "runs", "--run_name", "wheel"],
        empty, env,
    )
    run_dir = empty / "runs" / "wheel"
    assert (run_dir / "history.jsonl").read_text().count("\n") == 1
    assert any((run_dir / "checkpoints").iterdir())
    assert sorted(p.name for p in empty.iterdir()) == ["runs"]
