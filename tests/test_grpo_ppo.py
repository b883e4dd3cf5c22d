"""GRPO and PPO baselines on a tiny random Llama: masks, advantages, learning, weight sync, run directory."""

from dataclasses import dataclass

import pytest
import torch
from rich.console import Console

from esopt.confutil import opt
from esopt.envs.base import Env, Episode, StepResult, Task
from esopt.rollout import RolloutConfig, rollout
from esopt.train.grpo import GRPOConfig, GRPOTrainer
from esopt.train.pg_common import build_samples, encode_chat, gae, group_advantages
from esopt.train.ppo import PPOConfig, PPOTrainer


# ---- a tiny deterministic env: one turn, reward 1 iff the reply starts with "a" --------------------
@dataclass
class PickConfig:
    turns: int = opt(1, "turns per episode (the reward counts the last reply)")


class PickEnv(Env):
    name = "pick"
    Config = PickConfig

    @property
    def system_prompt(self) -> str:
        return "Reply with one letter."

    @property
    def action_regex(self) -> str:
        return "[ab]"

    @property
    def max_turns(self) -> int:
        return self.config.turns

    def tasks(self, split, n, seed):
        return [Task(id=f"{split}-{seed}-{i}", data={"k": i}) for i in range(n)]

    def start(self, task):
        return PickEpisode(self, task)


class PickEpisode(Episode):
    def __init__(self, env, task):
        self.env, self.task, self.turn = env, task, 0

    @property
    def observation(self) -> str:
        return f"Task {self.task.data['k']}: pick a letter."

    def step(self, action):
        self.turn += 1
        done = self.turn >= self.env.max_turns
        reward = float(action.startswith("a")) if done else 0.0
        return StepResult(f"OBS{self.turn} you said {action}!", reward, done, {"success": reward == 1.0})


@pytest.fixture
def pick_env(monkeypatch):
    import esopt.train.pg_common as common

    def make(name, options=None):
        if name == "pick":
            return PickEnv(PickConfig(**(options or {})))
        from esopt.envs import make_env

        return make_env(name, options)

    monkeypatch.setattr(common, "make_env", make)
    return PickEnv


def _config(cls, tmp_path, name, **overrides):
    config = cls()
    config.env.name = "pick"
    config.rollout.sampling.max_new_tokens = 2
    config.rollout.sampling.temperature = 1.0  # eval with sampling: the measured quantity is P(reply = "a")
    config.tasks_per_step = 4
    config.group_size = 4
    config.eval_tasks = 8
    config.eval_every = 0
    config.steps = 3
    config.optim.lr = 3e-3
    config.optim.micro_batch_size = 16
    config.runs_dir = str(tmp_path)
    config.run_name = name
    config.save_checkpoint = False
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


# ---- masks ------------------------------------------------------------------------------------------
def test_mask_covers_exactly_the_assistant_tokens(make_tiny_policy):
    policy = make_tiny_policy()
    tok = policy.tokenizer
    env = PickEnv(PickConfig(turns=3))
    result = rollout(policy, env, env.tasks("train", 3, 0), RolloutConfig(sampling=_sampling()), seed=1)
    for history_turns in (-1, 0, 1):
        samples = build_samples(tok, result.trajectories, history_turns)
        for trajectory in result.trajectories:
            mine = [s for s in samples if s.episode == result.trajectories.index(trajectory)]
            replies = []
            for s in mine:
                ids = s.ids.tolist()
                for start, end in s.turn_spans:
                    assert all(s.mask[start:end]) and s.mask[:start].sum() + s.mask[end:].sum() == s.num_tokens - (end - start)
                    assert ids[end - 1] == tok.eos_token_id  # the end-of-turn token closes each trained span
                    replies.append(tok.decode(ids[start : end - 1]))
                masked = tok.decode([t for t, m in zip(ids, s.mask.tolist()) if m], skip_special_tokens=True)
                assert "OBS" not in masked and "Task" not in masked and "letter" not in masked
                # every unmasked token decodes to the prompt/template text: all env text is outside the mask
                unmasked = tok.decode([t for t, m in zip(ids, s.mask.tolist()) if not m])
                assert trajectory.messages[1]["content"] in unmasked or history_turns >= 0
            assert replies == trajectory.actions
            assert len(mine) == (1 if history_turns < 0 else trajectory.turns)


def test_mask_on_a_hand_built_conversation(make_tiny_policy):
    tok = make_tiny_policy().tokenizer
    messages = [
        {"role": "system", "content": "Solve it."},
        {"role": "user", "content": "board 1"},
        {"role": "assistant", "content": "set 1 2 3"},
        {"role": "user", "content": "board 2 assistant set"},
        {"role": "assistant", "content": "set 4 4 4"},
    ]
    enc = encode_chat(tok, messages)
    masked = [t for t, m in zip(enc.ids, enc.mask) if m]
    assert masked == tok("set 1 2 3<|im_end|>", add_special_tokens=False)["input_ids"] + tok("set 4 4 4<|im_end|>", add_special_tokens=False)["input_ids"]
    assert tok.decode(enc.ids) == tok.apply_chat_template(messages, tokenize=False)
    no_eos = encode_chat(tok, messages, eos_in_loss=False)
    assert tok.decode([t for t, m in zip(no_eos.ids, no_eos.mask) if m]) == "set 1 2 3set 4 4 4"


def _sampling():
    from esopt.policy.base import SamplingConfig

    return SamplingConfig(temperature=1.0, max_new_tokens=2)


# ---- advantages -------------------------------------------------------------------------------------
def test_group_normalised_advantages():
    adv = group_advantages([1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 3], 4)
    assert adv[:4] == pytest.approx([1, -1, -1, 1], abs=1e-5)  # mean 0.5, std 0.5
    assert adv[4:8] == [0, 0, 0, 0]  # all-equal group: zero, not NaN
    g = torch.tensor([0, 0, 0, 3.0])
    assert adv[8:] == pytest.approx(((g - g.mean()) / g.std(unbiased=False)).tolist(), abs=1e-5)
    for k in range(0, 12, 4):
        assert sum(adv[k : k + 4]) == pytest.approx(0, abs=1e-6)
    with pytest.raises(ValueError):
        group_advantages([1, 2, 3], 2)


def test_gae_terminal_reward():
    adv, ret = gae(torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.5, 0.5, 0.5]), gamma=1.0, lam=1.0)
    assert ret.tolist() == pytest.approx([1.0, 1.0, 1.0])  # lambda=1: Monte-Carlo return
    assert adv.tolist() == pytest.approx([0.5, 0.5, 0.5])
    adv, _ = gae(torch.tensor([0.0, 1.0]), torch.tensor([0.2, 0.4]), gamma=0.9, lam=0.0)
    assert adv.tolist() == pytest.approx([0.9 * 0.4 - 0.2, 1.0 - 0.4])


# ---- learning -----------------------------------------------------------------------------------------
def _eval_reward(policy, seed=123):
    env = PickEnv()
    config = RolloutConfig(sampling=_sampling())
    return rollout(policy, env, env.tasks("eval", 48, 7), config, seed=seed).metrics["mean_reward"]


@pytest.mark.parametrize("cls,trainer_cls", [(GRPOConfig, GRPOTrainer), (PPOConfig, PPOTrainer)])
def test_training_raises_reward(tmp_path, make_tiny_policy, pick_env, cls, trainer_cls):
    torch.manual_seed(0)
    policy = make_tiny_policy()
    before = _eval_reward(policy)
    config = _config(cls, tmp_path, trainer_cls.method)
    if trainer_cls is PPOTrainer:
        config.gamma, config.lam = 1.0, 1.0
    summary = trainer_cls.start(config, policy=policy, console=Console(quiet=True)).run()
    after = _eval_reward(policy)
    assert after > before + 0.15, (before, after)
    assert summary["before"].keys() == summary["after"].keys() and summary["steps"] == 3
    run = tmp_path / trainer_cls.method
    for name in ("config.yaml", "metrics.jsonl", "report.md"):
        assert (run / name).exists()
    import json

    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "train/mean_reward" in r]
    assert len(train) == 3 and train[-1]["train/episodes"] == 3 * 16
    assert all(k.split("/")[0] in ("step", "train", "eval", "time", "mem") for r in records for k in r)
    assert [r["step"] for r in records if "eval/success" in r] == [0, 3]


def test_generation_policy_sees_optimizer_updates(tmp_path, make_tiny_policy, pick_env):
    policy = make_tiny_policy()
    start = {n: t.clone() for n, t in policy.master_weights().items()}
    config = _config(GRPOConfig, tmp_path, "sync", steps=1, kl_coef=0.1)
    config.optim.minibatches = 2
    trainer = GRPOTrainer.start(config, policy=policy, console=Console(quiet=True))
    values = trainer.train_step(0)
    assert values["train/optimizer_steps"] == 2 and values["train/kl"] >= 0
    changed = [n for n, t in policy.master_weights().items() if not torch.equal(t, start[n])]
    assert changed, "the optimizer did not move the master weights"
    for name, param in policy.model.named_parameters():
        assert torch.equal(param.detach(), policy.master_weights()[name]), name  # model == master
        assert not param.requires_grad
    # the generating model's logits are those of the updated weights, and perturbed() restores to them
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        logits_now = policy.model(ids).logits
    from esopt.es import Member

    with policy.perturbed(Member(index=0, seed=5, sigma=0.1)):
        with torch.no_grad():
            assert not torch.equal(policy.model(ids).logits, logits_now)
    with torch.no_grad():
        assert torch.equal(policy.model(ids).logits, logits_now)
    fresh = make_tiny_policy()
    with torch.no_grad():
        assert not torch.equal(fresh.model(ids).logits, logits_now)



# ---- compare: budget matching and the report (the subprocess runs are exercised by `esopt compare`) ----
def test_compare_matches_the_episode_budget_and_writes_a_report(tmp_path):
    import json

    from esopt.train.compare import CompareConfig, MethodRun, method_summary, write_compare_report

    config = CompareConfig(budget_episodes=200, eval_points=2)
    config.env.options = {"size": 4, "empty_cells": 1, "grammar": "legal"}
    config.es = {"es": {"population": 4}, "tasks_per_step": 8}
    config.grpo = {"tasks_per_step": 5, "group_size": 4, "optim": {"lr": 1e-5}}
    config.ppo = {"tasks_per_step": 10, "group_size": 2}
    config.validate()
    es, grpo, ppo = (config.method_config(m) for m in ("es", "grpo", "ppo"))
    assert (es.steps, grpo.steps, ppo.steps) == (6, 10, 10)  # 32, 20, 20 episodes per step
    assert grpo.optim.lr == 1e-5 and grpo.env.options["grammar"] == "legal" and es.eval_every == 3
    summaries = []
    for method, per_step in (("es", 32), ("grpo", 20)):
        run_dir = tmp_path / "runs" / method
        run_dir.mkdir(parents=True)
        rows = [{"step": 0, "eval/success": 0.1, "eval/mean_reward": 0.1, "eval/mean_turns": 1.0}]
        rows += [{"step": k, "train/mean_reward": 0.2, "train/fitness_mean": 0.2, "train/mean_turns": 1.0, "time/step_s": 2.0, "mem/peak_rss_mb": 100} for k in (1, 2)]
        rows += [{"step": 2, "eval/success": 0.3, "eval/mean_reward": 0.3, "eval/mean_turns": 1.0}]
        (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
        summaries.append(method_summary(MethodRun(method, run_dir, 0, 5.0, 123.0, per_step)))
    assert summaries[1]["curve"][-1] == {"step": 2, "episodes": 40, "train_s": 4.0, "success": 0.3, "mean_reward": 0.3, "mean_turns": 1.0}
    text = write_compare_report(tmp_path, config, summaries).read_text()
    assert "| grpo | 2 | 40 | 0.100 | 0.300 |" in text and (tmp_path / "summary.json").exists()


def test_cli_has_the_baseline_commands(capsys):
    from esopt.cli import COMMANDS

    for name in ("grpo", "ppo", "compare"):
        assert name in COMMANDS
        with pytest.raises(SystemExit) as exit_info:
            COMMANDS[name](["--help"])
        assert exit_info.value.code == 0
    assert "--optim.lr" in capsys.readouterr().out
