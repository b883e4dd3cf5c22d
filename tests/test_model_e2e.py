"""End-to-end checks on the real default model (SmolLM2-135M-Instruct). Marked `model`; kept short."""

import re

import pytest
import torch
from rich.console import Console
from transformers import AutoModelForCausalLM

from esopt.envs import make_env
from esopt.es import Member
from esopt.policy.config import ModelConfig
from esopt.policy.hf import HFPolicy
from esopt.rollout import RolloutConfig, rollout
from esopt.train.config import TrainConfig
from esopt.train.es_trainer import ESTrainer, checkpoints

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def fp32_policy():
    return HFPolicy.load(ModelConfig(dtype="float32"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fifty_perturb_restore_cycles_are_bit_exact(dtype, fp32_policy):
    policy = fp32_policy if dtype == "float32" else HFPolicy.load(ModelConfig(dtype=dtype))
    assert policy.num_parameters() > 130_000_000
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    for i in range(50):
        with policy.perturbed(Member(index=i, seed=i, sigma=1e-3)):
            pass
    for name, param in policy.model.named_parameters():
        assert torch.equal(param, before[name]), name


def test_guided_sudoku_actions_are_well_formed(fp32_policy):
    env = make_env("sudoku", {"size": 4, "empty_cells": 1, "grammar": "format"})
    tasks = env.tasks("eval", 4, 0)
    config = RolloutConfig(history_turns=0)
    config.sampling.max_new_tokens = 10
    result = rollout(fp32_policy, env, tasks, config)
    actions = [a for t in result.trajectories for a in t.actions]
    assert actions and all(re.fullmatch(env.action_regex, a) for a in actions), actions


def test_one_es_step_on_the_real_model(tmp_path, fp32_policy):
    config = TrainConfig()
    config.env.options = {"size": 4, "empty_cells": 1, "grammar": "legal"}
    config.es.population = 2
    config.rollout.history_turns = 0
    config.rollout.sampling.max_new_tokens = 10
    config.steps, config.tasks_per_step, config.eval_tasks, config.eval_every = 1, 2, 2, 0
    config.probe_tasks = 2  # the forgetting probe on the real model: sudoku runs are probed on countdown
    config.runs_dir, config.run_name = str(tmp_path), "real"
    fingerprint = fp32_policy.fingerprint()
    summary = ESTrainer.start(config, policy=fp32_policy, console=Console(quiet=True)).run()
    assert summary["steps"] == 1
    report = (tmp_path / "real" / "report.md").read_text()
    assert "## Forgetting probe" in report and "`countdown` success, 2 val tasks" in report
    (k, checkpoint), = checkpoints(tmp_path / "real")
    loaded = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    params = dict(loaded.named_parameters())
    assert all(torch.equal(params[n], t) for n, t in fp32_policy.master_weights().items())
    history = (tmp_path / "real" / "history.jsonl").read_text().splitlines()
    assert len(history) == 1
    # two members with different fitness move the weights; equal fitness must leave them untouched
    update = __import__("json").loads(history[0])
    moved = fp32_policy.fingerprint() != fingerprint
    assert moved == (update["fitness"][0] != update["fitness"][1])
