"""The Trace2Skill conditions (esopt.experiments.skill) driven by a scripted analyst on a tiny model, and
the `esopt skill` commands."""

import json

import pytest
from rich.console import Console

from esopt.confutil import ConfigError
from esopt.experiments.skill.conditions import SkillExperiment
from esopt.experiments.skill.config import CONDITIONS, SkillRunConfig
from esopt.experiments.skill.report import report
from esopt.skills import Skill
from esopt.skills.analyst import ScriptedAnalyst
from esopt.skills.distill import read_log


def _skill_config(tmp_path) -> SkillRunConfig:
    config = SkillRunConfig()
    config.env.name = "sudoku"
    config.env.options = {"size": 4, "empty_cells": 1, "max_turns": 1}
    config.rollout.history_turns = 0
    config.es.population = 2
    config.es.sigma = 0.05
    config.es.sigma_final = 0.01
    config.es.alpha = 0.05
    config.rollout.guided_decoding = False
    config.rollout.sampling.max_new_tokens = 4
    config.steps = 2
    config.tasks_per_step = 2
    config.eval_tasks = 2
    config.eval_every = 0
    config.samples = 2
    config.iterations = 2
    config.trace_tasks = 2
    config.skill_every = 1
    config.runs_dir = str(tmp_path)
    config.run_name = "exp"
    return config


def _scripted():
    def reply(skill, trajectory):
        if trajectory["task_id"].endswith(("0", "5")):
            return "{broken"
        section = "What works" if trajectory["success"] else "Mistakes to avoid"
        return json.dumps({"op": "append", "section": section, "content": f"- from {trajectory['task_id']} at {skill.tag}"})

    return ScriptedAnalyst(reply)


def test_all_conditions_with_a_scripted_analyst(tmp_path, make_tiny_policy):
    config = _skill_config(tmp_path)
    experiment = SkillExperiment(config, policy=make_tiny_policy(), analyst=_scripted(), console=Console(quiet=True))
    results = {name: experiment.run(name) for name in CONDITIONS}
    root = tmp_path / "exp"
    for name, result in results.items():
        assert (root / name / "result.json").exists() and (root / name / "eval_trajectories.jsonl").exists()
        assert set(result["metrics"]) >= {"mean@2", "pass@2", "success_mean@2"}
    assert results["baseline"]["skill"] is None and results["es"]["skill"] is None
    # trace2skill: two rounds, versions v0 -> v1 -> v2, each round's rollouts used the skill of the time
    t2s = root / "trace2skill"
    assert Skill.load(t2s / "SKILL.md").version == 2 and (t2s / "skill_v1.md").exists()
    used = [json.loads(x)["skill_version"] for x in (t2s / "trajectories.jsonl").read_text().splitlines()]
    assert used[0].startswith("v0-") and used[-1].startswith("v1-")
    evals = [json.loads(x) for x in (t2s / "eval_trajectories.jsonl").read_text().splitlines()]
    assert {e["skill_version"] for e in evals} == {results["trace2skill"]["skill"]}
    assert "## What works" in evals[0]["messages"][0]["content"]
    # es+trace2skill: one distillation from every saved ES training episode (steps * tasks_per_step)
    e2s = results["es+trace2skill"]
    assert e2s["trajectories"] == 4 and e2s["analyst"]["proposals"] == 4 and e2s["fingerprint"] == results["es"]["fingerprint"]
    # coevolve: a skill update after every ES step
    co = root / "coevolve"
    assert Skill.load(co / "SKILL.md").version == 2
    assert [r["round"] for r in read_log(co) if r["kind"] == "result"] == ["step1", "step2"]
    metrics = [json.loads(x) for x in (co / "metrics.jsonl").read_text().splitlines()]
    assert [m["skill/version"] for m in metrics if "skill/version" in m] == [1, 2]
    assert len((co / "history.jsonl").read_text().splitlines()) == 2
    assert results["baseline"]["fingerprint"] == results["trace2skill"]["fingerprint"]  # frozen model
    # malformed analyst output is counted
    assert results["trace2skill"]["analyst"]["valid"] < results["trace2skill"]["analyst"]["proposals"]
    table = report(root)
    for name in CONDITIONS:
        assert f"| {results[name]['label']} |" in table
    assert "Rejected proposals by reason" in table and (root / "report.md").exists()
    # the same config and seed give the same skill
    config2 = _skill_config(tmp_path)
    config2.run_name = "exp2"
    again = SkillExperiment(config2, policy=make_tiny_policy(), analyst=_scripted(), console=Console(quiet=True))
    again.run("trace2skill")
    assert (tmp_path / "exp2" / "trace2skill" / "SKILL.md").read_text() == (t2s / "SKILL.md").read_text()
    with pytest.raises(ConfigError, match="--force"):
        experiment.run("baseline")


def test_cli_skill_commands(tmp_path, capsys):
    from esopt.cli import main

    assert main(["skill", "--help"]) == 0
    assert "baseline" in capsys.readouterr().out
    assert main(["skill", "nope"]) == 2
    assert main(["skill", "run", "--conditions", "baseline,bogus", "--out", str(tmp_path / "x")]) == 2
    assert "unknown condition(s) bogus" in capsys.readouterr().err
    assert main(["skill", "es+trace2skill", "--env", "sudoku", "--out", str(tmp_path / "x"), "--model.path", str(tmp_path / "no-model")]) == 2
    assert "needs a finished ES run" in capsys.readouterr().err
    assert main(["skill", "report", str(tmp_path / "nothing")]) == 2
    assert "no finished condition" in capsys.readouterr().err
