"""ES trainer on a tiny random Llama: run directory, resume equivalence, replay, report."""

import json

import pytest
import torch
from rich.console import Console

from esopt.confutil import ConfigError
from esopt.es import read_history, replay
from esopt.policy.base import load_checkpoint_weights
from esopt.train.es_trainer import ESTrainer, checkpoints
from tiny_models import crash_mid_checkpoint


def _quiet():
    return Console(quiet=True)


def test_run_directory_contents(tmp_path, make_tiny_policy, tiny_train_config):
    config = tiny_train_config(tmp_path, "full", checkpoint_every=2)
    policy = make_tiny_policy()
    base = {n: t.clone() for n, t in policy.master_weights().items()}
    summary = ESTrainer.start(config, policy=policy, console=_quiet()).run()
    run = tmp_path / "full"
    for name in ("config.yaml", "machine.json", "history.jsonl", "metrics.jsonl", "report.md", "reward_curve.png"):
        assert (run / name).exists(), name
    history = read_history(run / "history.jsonl")
    assert [u.step for u in history] == [0, 1, 2, 3]
    assert history[0].sigma == 0.05 and history[-1].sigma == pytest.approx(0.01)  # cosine sigma_0 -> sigma_T
    # replay from the base weights reproduces the trained weights bit-exactly
    assert any(not torch.equal(base[n], t) for n, t in policy.master_weights().items())  # they moved
    rebuilt = replay(base, history)
    for name, tensor in policy.master_weights().items():
        assert torch.equal(rebuilt[name], tensor), name
    # checkpoints: step 2 and the final one, loadable and matching
    assert [k for k, _ in checkpoints(run)] == [2, 4]
    final = load_checkpoint_weights(checkpoints(run)[-1][1])
    for name, tensor in policy.master_weights().items():
        assert torch.equal(final[name], tensor), name
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "eval/success" in m] == [0, 2, 4]
    train = [m for m in metrics if "train/fitness_mean" in m]
    assert len(train) == 4 and all(m["time/generate_s"] > 0 for m in train)
    assert summary["before"].keys() == summary["after"].keys()
    assert (run / "trajectories" / "eval_step00000.jsonl").exists()
    assert "Held-out evaluation" in (run / "report.md").read_text()
    assert f"torch {torch.__version__}" in (run / "report.md").read_text()  # the machine it computed on


def test_resume_on_another_cpu_kernel_warns(tmp_path, make_tiny_policy, tiny_train_config):
    config = tiny_train_config(tmp_path, "moved")
    ESTrainer.start(config, policy=make_tiny_policy(), console=_quiet())
    record_path = tmp_path / "moved" / "machine.json"
    recorded = json.loads(record_path.read_text())
    console = Console(record=True, width=400)
    ESTrainer.resume(tmp_path / "moved", policy=make_tiny_policy(), console=console)
    assert "warning" not in console.export_text()  # same machine: silent

    record_path.write_text(json.dumps({**recorded, "cpu_bf16_kernel": "an-older-kernel", "cpu_cores": 1024}))
    console = Console(record=True, width=400)
    ESTrainer.resume(tmp_path / "moved", policy=make_tiny_policy(), console=console)
    text = console.export_text()
    assert "warning" in text and f"cpu_bf16_kernel: an-older-kernel -> {recorded['cpu_bf16_kernel']}" in text
    assert f"cpu_cores: 1024 -> {recorded['cpu_cores']}" in text  # on AMX the thread count changes bf16 rounding


@pytest.mark.parametrize("checkpoint_every", [0, 1])
def test_resume_after_crash_matches_uninterrupted_run(tmp_path, make_tiny_policy, monkeypatch, checkpoint_every, tiny_train_config):
    reference_policy = make_tiny_policy()
    base = reference_policy.fingerprint()
    ESTrainer.start(tiny_train_config(tmp_path, "ref", checkpoint_every=checkpoint_every), policy=reference_policy, console=_quiet()).run()
    assert reference_policy.fingerprint() != base  # the run moved the weights, so equality below means something

    crashing_policy = make_tiny_policy()
    original_apply = crashing_policy.apply
    calls = {"n": 0}

    def apply_then_crash(update):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed mid-run")
        original_apply(update)

    monkeypatch.setattr(crashing_policy, "apply", apply_then_crash)
    with pytest.raises(KeyboardInterrupt):
        ESTrainer.start(tiny_train_config(tmp_path, "crash", checkpoint_every=checkpoint_every), policy=crashing_policy, console=_quiet()).run()
    assert len(read_history(tmp_path / "crash" / "history.jsonl")) == 2

    resumed_policy = make_tiny_policy()  # a fresh process starts from the base weights
    ESTrainer.resume(tmp_path / "crash", policy=resumed_policy, console=_quiet()).run()
    assert resumed_policy.fingerprint() == reference_policy.fingerprint()
    ref_history = read_history(tmp_path / "ref" / "history.jsonl")
    assert [u.to_json() for u in read_history(tmp_path / "crash" / "history.jsonl")] == [u.to_json() for u in ref_history]


@pytest.mark.parametrize("point", ["after_history_write", "mid_checkpoint"])
def test_resume_after_a_crash_at_any_point_of_a_step(tmp_path, make_tiny_policy, monkeypatch, tiny_train_config, point):
    """The run is killed right after step 2's update reached history.jsonl (before its metrics and
    checkpoint), or while the checkpoint after step 2 is being written (its files half there, no
    esopt.json); the resumed run ends with the uninterrupted run's weights and history.
    (A crash before the history write: test_resume_after_crash_matches_uninterrupted_run.)"""
    from esopt.es.history import HistoryWriter

    reference = make_tiny_policy()
    base = reference.fingerprint()
    ESTrainer.start(tiny_train_config(tmp_path, "ref", checkpoint_every=1), policy=reference, console=_quiet()).run()
    assert reference.fingerprint() != base

    crashing = make_tiny_policy()
    if point == "after_history_write":
        original_append = HistoryWriter.append

        def append_then_crash(self, update):
            original_append(self, update)
            if update.step == 1:
                raise KeyboardInterrupt("killed after the history write")

        monkeypatch.setattr(HistoryWriter, "append", append_then_crash)
    else:
        crash_mid_checkpoint(monkeypatch, crashing, "step_00002")  # weights written, esopt.json not yet
    with pytest.raises(KeyboardInterrupt):
        ESTrainer.start(tiny_train_config(tmp_path, "crash", checkpoint_every=1), policy=crashing, console=_quiet()).run()
    monkeypatch.undo()
    assert len(read_history(tmp_path / "crash" / "history.jsonl")) == 2
    assert [k for k, _ in checkpoints(tmp_path / "crash")] == [1]  # an incomplete checkpoint does not count

    resumed = make_tiny_policy()
    ESTrainer.resume(tmp_path / "crash", policy=resumed, console=_quiet()).run()
    assert resumed.fingerprint() == reference.fingerprint()
    history = [u.to_json() for u in read_history(tmp_path / "crash" / "history.jsonl")]
    assert history == [u.to_json() for u in read_history(tmp_path / "ref" / "history.jsonl")]


def test_existing_run_is_not_overwritten(tmp_path, make_tiny_policy, tiny_train_config):
    config = tiny_train_config(tmp_path, "once", steps=1, eval_every=0)
    ESTrainer.start(config, policy=make_tiny_policy(), console=_quiet()).run()
    with pytest.raises(ConfigError, match="--resume"):
        ESTrainer.start(config, policy=make_tiny_policy(), console=_quiet())


def test_bad_config_values_are_named(tmp_path, tiny_train_config):
    config = tiny_train_config(tmp_path, "bad")
    config.es.population = 0
    with pytest.raises(ConfigError, match="es.population"):
        config.validate()
    config = tiny_train_config(tmp_path, "bad")
    config.env.options = {"size": 5}
    with pytest.raises(ConfigError, match="sudoku.size"):
        config.validate()
    config = tiny_train_config(tmp_path, "bad")
    config.env.name = "chess"
    with pytest.raises(ConfigError, match="unknown env 'chess'"):
        config.validate()


def test_samples_per_task_plays_each_task_k_times_and_averages_them(tmp_path, make_tiny_policy, tiny_train_config):
    from esopt.envs import make_env
    from esopt.es import make_strategy
    from esopt.population import LocalEvaluator
    from esopt.train.es_trainer import step_work

    config = tiny_train_config(tmp_path, "k", samples_per_task=4, tasks_per_step=2)
    config.rollout.sampling.temperature = 1.5
    config.validate()
    env = make_env(config.env.name, config.env.options)
    episodes, seed = step_work(config, env, 0)
    first, second = episodes[0].id, episodes[4].id
    assert first != second and [t.id for t in episodes] == [first] * 4 + [second] * 4
    members = make_strategy(config.es, config.steps, config.seed).ask(0)[:2]
    results = LocalEvaluator(make_tiny_policy(), env).evaluate(members, episodes, config.rollout, seed, keep_trajectories=8)
    for result in results:
        rewards = [t["reward"] for t in result.trajectories]
        assert len(rewards) == 8 and result.fitness == pytest.approx(sum(rewards) / 8)
        assert len({tuple(t["actions"]) for t in result.trajectories[:4]}) > 1  # k different draws of one task
    config.rollout.sampling.temperature = 0.0
    with pytest.raises(ConfigError, match="samples_per_task 4 repeats each task under greedy decoding"):
        config.validate()


def test_held_out_evaluation_plays_the_eval_env_options(tmp_path, make_tiny_policy, tiny_train_config):
    """eval_env_options: training plays one turn of each 3-cell puzzle, held-out evaluation whole puzzles (the
    same tasks), and the report's numbers are those of the whole puzzles."""
    config = tiny_train_config(tmp_path, "evalenv", steps=1, eval_every=0)
    config.env.options = {"size": 4, "empty_cells": 3, "max_turns": 1, "grammar": "legal", "partial_credit": True}
    config.eval_env_options = {"max_turns": 3}
    trainer = ESTrainer.start(config, policy=make_tiny_policy(), console=_quiet())
    assert trainer.env.max_turns == 1 and trainer.eval_env.max_turns == 3
    assert trainer.eval_tasks == trainer.env.tasks(config.eval_split, config.eval_tasks, config.eval_seed)
    trainer.run()
    history = [json.loads(line) for line in (tmp_path / "evalenv" / "trajectories" / "eval_step00000.jsonl").open()]
    assert [len(t["actions"]) for t in history] == [3, 3, 3]  # whole puzzles: the legal grammar fills a cell a turn
    training = [json.loads(line) for line in (tmp_path / "evalenv" / "trajectories" / "train.jsonl").open()]
    assert training and all(len(t["actions"]) == 1 for t in training)
    assert "env options {'max_turns': 3} set for evaluation" in (tmp_path / "evalenv" / "report.md").read_text()
    config.eval_env_options = {"max_turns": 0}
    with pytest.raises(ConfigError, match="sudoku.max_turns must be None or an integer >= 1"):
        config.validate()
