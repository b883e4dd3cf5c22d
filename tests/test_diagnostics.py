"""ES run diagnostics (tied steps, update magnitudes against sigma) and `esopt landscape`."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from rich.console import Console

from esopt.cli import main
from esopt.envs import make_env
from esopt.es import ESConfig, Update
from esopt.rollout import RolloutConfig, rollout
from esopt.train.diagnostics import BaseSnapshot, tie_summary
from esopt.train.es_trainer import ESTrainer
from esopt.train.landscape import scan_landscape


def _update(step: int, fitness: list[float]) -> Update:
    return Update(step=step, seeds=list(range(len(fitness))), coefficients=[0.0] * len(fitness), alpha=0.1, sigma=0.01, fitness=fitness)


def test_tie_fraction_counts_steps_whose_members_all_tied():
    history = [
        _update(0, [0.0, 1.0, 0.5]),
        _update(1, [0.25, 0.25, 0.25]),
        _update(2, [1.0, 0.0, 0.0]),
        _update(3, [0.0, 0.0, 0.0]),
        _update(4, [0.5, 0.5, 0.5]),
    ]
    assert tie_summary(history) == {"steps": 5, "tied": 3, "fraction": 0.6, "tied_tail": 2}
    assert tie_summary([]) == {"steps": 0, "tied": 0, "fraction": 0.0, "tied_tail": 0}


def test_update_magnitudes_match_a_hand_computed_case():
    base = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([0.0]), "frozen": torch.tensor([9.0])}
    final = {"w": torch.tensor([[1.0, 3.0], [1.0, 7.0]]), "b": torch.tensor([4.0]), "frozen": torch.tensor([100.0])}
    snapshot = BaseSnapshot(base, ["w", "b"])  # "frozen" is outside the trained tensors
    m = snapshot.take_update_magnitudes(final, sigma_0=1.5, sigma_final=0.5)
    # |final - base| = [0, 1, 2, 3, 4]; numpy's linear interpolation: p90 at rank 3.6, p99 at rank 3.96
    assert m["weights"] == 5
    assert m["p50"] == 2.0 and m["p90"] == pytest.approx(3.6) and m["p99"] == pytest.approx(3.96)
    assert m["max"] == 4.0 and m["mean"] == 2.0 and m["moved"] == 0.8
    assert m["above_sigma_0"] == 0.6 and m["above_sigma_final"] == 0.8
    assert (m["sigma_0"], m["sigma_final"]) == (1.5, 0.5)
    with pytest.raises(RuntimeError):
        snapshot.take_update_magnitudes(final, 1.5, 0.5)  # the snapshot now holds the differences


def test_run_report_shows_ties_and_update_magnitudes(tmp_path, make_tiny_policy, tiny_train_config):
    config = tiny_train_config(tmp_path, "diag", steps=2, eval_every=0)
    policy = make_tiny_policy()
    summary = ESTrainer.start(config, policy=policy, console=Console(quiet=True)).run()
    base, final = make_tiny_policy().master_weights(), policy.master_weights()
    largest = max(float((final[k] - base[k]).abs().max()) for k in base)
    m = summary["update_magnitudes"]
    assert m["weights"] == sum(t.numel() for t in base.values())
    assert m["max"] == largest and (m["sigma_0"], m["sigma_final"]) == (0.05, 0.01)
    assert summary["ties"]["steps"] == 2
    report = (tmp_path / "diag" / "report.md").read_text()
    assert "## ES diagnostics" in report and "all tied" in report and "share > sigma_0" in report


@pytest.fixture
def landscape_setup(make_tiny_policy):
    env = make_env("sudoku", {"size": 4, "empty_cells": 2, "grammar": "legal", "partial_credit": True})
    tasks = env.tasks("train", 4, 0)
    config = RolloutConfig(history_turns=0)
    config.sampling = dataclasses.replace(config.sampling, max_new_tokens=10)
    return make_tiny_policy(), env, tasks, config


def test_landscape_centre_is_the_unperturbed_reward_and_weights_are_restored(landscape_setup):
    policy, env, tasks, config = landscape_setup
    before = {k: t.clone() for k, t in policy.master_weights().items()}
    params_before = {k: p.detach().clone() for k, p in policy.model.named_parameters()}
    unperturbed = rollout(policy, env, tasks, config, seed=123).metrics["mean_reward"]
    result = scan_landscape(policy, env, tasks, config, ESConfig(), scales=[0.05], points=3, seed=1)
    assert result["coords"] == [-2.0, 0.0, 2.0]
    assert result["slices"][0]["mean_reward"][1][1] == unperturbed == result["base"]["mean_reward"]
    for name, tensor in policy.master_weights().items():
        assert torch.equal(tensor, before[name]), name
    for name, p in policy.model.named_parameters():
        assert torch.equal(p, params_before[name]), name


def test_landscape_over_an_outcome_changing_direction_varies(landscape_setup):
    policy, env, tasks, config = landscape_setup
    result = scan_landscape(policy, env, tasks, config, ESConfig(), scales=[1e-6, 0.5], points=3, seed=1)
    tiny, large = result["slices"]
    assert len(set(np.ravel(tiny["mean_reward"]))) == 1 and tiny["tasks_changed"] == 0
    assert len(set(np.ravel(large["mean_reward"]))) > 1 and large["tasks_changed"] > 0


def test_landscape_cli_missing_run_directory_is_a_one_line_error(tmp_path, capsys):
    assert main(["landscape", str(tmp_path / "no_such_run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("esopt: error:") and "no_such_run" in err and "\n" not in err
    assert main(["landscape", "default", "--scales", "0,-1"]) == 2


def test_landscape_cli_on_a_run_directory_writes_its_numbers(tmp_path, make_tiny_policy, tiny_train_config, capsys):
    config = tiny_train_config(tmp_path, "scan", steps=1, eval_every=0)
    ESTrainer.start(config, policy=make_tiny_policy(), console=Console(quiet=True)).run()
    run = str(tmp_path / "scan")
    assert main(["landscape", run, "--tasks", "2", "--grid", "2", "--scales", "0.01"]) == 0
    result = json.loads((tmp_path / "scan" / "landscape" / "landscape.json").read_text())
    assert result["coords"] == [-2.0, 2.0] and [p["scale"] for p in result["slices"]] == [0.01]
    assert (tmp_path / "scan" / "landscape" / "landscape.md").exists()
    assert main(["landscape", run, "--env.size", "9"]) == 2  # a run's env comes from its config.yaml
    assert main(["landscape", run, "--grid", "1"]) == 2
