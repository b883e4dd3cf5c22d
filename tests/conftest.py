import os

import pytest
import torch

from esopt.policy.hf import HFPolicy
from tiny_models import tiny_llama



TEST_DEVICE = os.environ.get("ESOPT_TEST_DEVICE", "cpu")
"""Where the tiny policies of the unit tests run (benchmarks/gpu_check.sh sets cuda)."""

REQUIRED_MARKERS = {m.strip() for m in os.environ.get("ESOPT_REQUIRE", "").split(",") if m.strip()}
"""Markers whose tests must run, never skip (.ci/run sets browser, and vllm for make test-vllm): without it a
failed Chromium or vLLM install would pass CI as a row of skips."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    required = REQUIRED_MARKERS & {mark.name for mark in item.iter_markers()}
    if report.skipped and required and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"ESOPT_REQUIRE={','.join(sorted(required))}: this test must run, but it skipped: {reason}"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny random Llama saved as a Hugging Face model directory, for `--model.path` in CLI runs."""
    model, tokenizer = tiny_llama(seed=0)
    directory = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture
def make_tiny_policy():
    """Factory for a tiny random-initialised Llama policy (same seed -> identical weights) on TEST_DEVICE."""

    def make(seed: int = 0, dtype: torch.dtype = torch.float32) -> HFPolicy:
        model, tokenizer = tiny_llama(seed=seed)
        return HFPolicy(model.to(device=TEST_DEVICE, dtype=dtype), tokenizer)

    return make


@pytest.fixture
def quadratic_es_run():
    """Factory: ES steps on f(theta) = -sum ||theta_k - target_k||^2 over small tensors, members evaluated
    with perturb_tensor on the tensors they move, updates applied with one optimizer state and written to
    history.jsonl. Returns (base, live, target, history path)."""
    from esopt.es import HistoryWriter, OptimizerState, apply_update, make_strategy, perturb_tensor, tensors_moved

    def run(directory, steps, config, shapes=(("a.weight", (16, 8)), ("a.bias", (8,))), run_seed=2024):
        gen = torch.Generator().manual_seed(5)
        base = {name: torch.randn(shape, generator=gen) for name, shape in shapes}
        target = {k: torch.randn(v.shape, generator=gen) for k, v in base.items()}
        live = {k: v.clone() for k, v in base.items()}
        strategy = make_strategy(config, total_steps=steps, run_seed=run_seed)
        state = OptimizerState()
        path = directory / "history.jsonl"
        with HistoryWriter(path) as writer:
            for step in range(steps):
                members = strategy.ask(step)
                fitness = []
                for m in members:
                    perturbed = dict(live)
                    for k in tensors_moved(m, live):
                        perturbed[k] = torch.empty_like(live[k])
                        perturb_tensor(k, live[k], m, perturbed[k])
                    fitness.append(-sum(float(((perturbed[k] - target[k]) ** 2).sum()) for k in live))
                update = strategy.tell(step, members, fitness)
                apply_update(live, update, state)
                writer.append(update)
        return base, live, target, path

    return run


@pytest.fixture
def tiny_train_config():
    """Factory: a TrainConfig sized for the tiny random model on 4x4 Sudoku, writing runs under the given
    directory; keyword overrides set top-level fields (steps, tasks_per_step, ...)."""
    from esopt.train.config import TrainConfig

    def make(runs_dir, name, **overrides) -> TrainConfig:
        config = TrainConfig()
        config.env.options = {"size": 4, "empty_cells": 2, "grammar": "legal", "partial_credit": True}
        config.es.population = 4
        config.es.sigma = 0.05  # large: a tiny random model needs a big push to change its greedy replies
        config.es.sigma_final = 0.01
        config.es.alpha = 0.05
        config.rollout.history_turns = 0
        config.rollout.sampling.max_new_tokens = 10
        config.steps = 4
        config.tasks_per_step = 3
        config.eval_tasks = 3
        config.eval_every = 2
        config.probe_tasks = 0  # tests/test_forgetting.py covers the probe
        config.runs_dir = str(runs_dir)
        config.run_name = name
        for key, value in overrides.items():
            setattr(config, key, value)
        return config

    return make

