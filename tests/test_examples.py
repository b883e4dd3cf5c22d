"""Every example in examples/ runs as its docstring says, on the tiny random model (the real model: `model`).
The plugin package is installed and trained on in test_env_plugins.py."""

from __future__ import annotations

import json
import runpy
from pathlib import Path

import pytest
import yaml

from esopt.cli import main as cli
from esopt.es import read_history

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _example(name: str) -> dict:
    return runpy.run_path(str(EXAMPLES / f"{name}.py"))  # not as __main__: the caller runs its main()


def _fingerprints(output: str) -> list[str]:
    return [line.split()[2].rstrip(";") for line in output.splitlines() if line.split()[1:2] == ["model"]]


def test_minimal_es_moves_the_weights(tiny_model_dir, capsys):
    means = _example("minimal_es")["main"](
        ["--model", str(tiny_model_dir), "--steps", "2", "--population", "4", "--sigma", "0.05", "--alpha", "0.05"]
    )
    out = capsys.readouterr().out
    assert len(means) == 2 and all(0.0 <= m <= 1.0 for m in means)
    assert "step 1: mean fitness" in out
    base, trained = _fingerprints(out)
    assert base != trained  # members scored differently, so the update moved the weights


@pytest.mark.model
def test_minimal_es_on_the_default_model(capsys):
    means = _example("minimal_es")["main"](["--steps", "1", "--population", "2"])
    assert len(means) == 1 and 0.0 <= means[0] <= 1.0 and len(_fingerprints(capsys.readouterr().out)) == 2


def test_python_api_trains_and_reports(tiny_model_dir, tmp_path):
    summary = _example("python_api")["main"](["--model", str(tiny_model_dir), "--steps", "1", "--runs_dir", str(tmp_path)])
    run_dir = Path(summary["run_dir"])
    assert run_dir.parent == tmp_path and summary["steps"] == 1 and summary["eval_n"] == 8
    assert len(read_history(run_dir / "history.jsonl")) == 1
    assert (run_dir / "report.md").is_file()


def test_custom_env_trains_from_the_cli_by_reference(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # as `PYTHONPATH=examples` in the example's docstring
    args = ["train", "--env", "custom_env:GuessEnv", "--env.span", "8", "--env.max_turns", "2", "--model.path", str(tiny_model_dir),
            "--steps", "1", "--tasks_per_step", "2", "--eval_tasks", "2", "--es.population", "2",
            "--runs_dir", str(tmp_path), "--run_name", "guess"]
    assert cli(args) == 0, capsys.readouterr().err
    env = yaml.safe_load((tmp_path / "guess" / "config.yaml").read_text())["env"]
    assert env["name"] == "custom_env:GuessEnv" and int(env["options"]["span"]) == 8
    assert len(read_history(tmp_path / "guess" / "history.jsonl")) == 1
    episode = json.loads(next((tmp_path / "guess" / "trajectories").glob("*.jsonl")).read_text().splitlines()[0])
    assert "The secret is between" in json.dumps(episode)
    assert cli(["train", "--env", "custom_env:GuessEnv", "--env.span", "many", "--runs_dir", str(tmp_path)]) == 2
    assert "span" in capsys.readouterr().err
