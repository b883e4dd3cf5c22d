"""The forgetting probe: what a run cost outside its env, measured before and after training."""

import json

import torch
from rich.console import Console

from esopt.train.es_trainer import ESTrainer
from esopt.train.forgetting import GENERAL_PAIRS, general_loglik


def test_general_loglik_equals_the_models_own_answer_loss(make_tiny_policy):
    policy = make_tiny_policy()
    question, answer = GENERAL_PAIRS[0]
    tok = policy.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
    prompt_ids = tok(prompt, add_special_tokens=False).input_ids
    answer_ids = tok(answer, add_special_tokens=False).input_ids
    ids = torch.tensor([prompt_ids + answer_ids])
    labels = ids.clone()
    labels[0, : len(prompt_ids)] = -100  # transformers' own shifted cross-entropy over the answer tokens only
    with torch.no_grad():
        loss = policy.model(input_ids=ids, labels=labels).loss.item()
    assert abs(general_loglik(policy, ((question, answer),)) - (-loss)) < 1e-4


def test_general_loglik_drops_when_the_weights_are_damaged(make_tiny_policy):
    policy = make_tiny_policy()
    before = general_loglik(policy, GENERAL_PAIRS[:4])
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    assert general_loglik(policy, GENERAL_PAIRS[:4]) < before


def test_es_run_report_shows_the_probe_before_and_after(tmp_path, make_tiny_policy, tiny_train_config):
    config = tiny_train_config(tmp_path, "probe", steps=2, eval_every=0, probe_tasks=3)
    ESTrainer.start(config, policy=make_tiny_policy(), console=Console(quiet=True)).run()
    records = [json.loads(line) for line in (tmp_path / "probe" / "metrics.jsonl").read_text().splitlines()]
    probes = [r for r in records if "probe/other_env_success" in r]
    assert [r["step"] for r in probes] == [0, 2]
    assert all(0.0 <= r["probe/other_env_success"] <= 1.0 and r["probe/general_loglik"] < 0 for r in probes)
    report = (tmp_path / "probe" / "report.md").read_text()
    assert "## Forgetting probe" in report and "`countdown` success, 3 val tasks" in report


def test_probe_decodes_the_same_whatever_the_runs_sampling(monkeypatch, make_tiny_policy):
    """A run's forced reply length or stop strings must not reach the probe (vLLM rejects min 64 > max 24)."""
    import dataclasses

    from esopt.policy.base import SamplingConfig
    from esopt.rollout import RolloutConfig
    from esopt.train import forgetting

    seen = []
    monkeypatch.setattr(forgetting, "rollout", lambda policy, env, tasks, config, seed: seen.append(config) or _Result())
    run = RolloutConfig(sampling=SamplingConfig(temperature=0.7, top_k=20, max_new_tokens=64, min_new_tokens=64, stop=["\n"]))
    forgetting.probe(make_tiny_policy(), "math", run, tasks=2)
    forgetting.probe(make_tiny_policy(), "math", RolloutConfig(), tasks=2)
    assert seen[0].sampling == seen[1].sampling == SamplingConfig(temperature=0.0, max_new_tokens=24)
    seen[0].sampling.validate()
    assert dataclasses.replace(seen[0], sampling=run.sampling) == dataclasses.replace(run, history_turns=-1)


class _Result:
    metrics = {"success": 0.0}
