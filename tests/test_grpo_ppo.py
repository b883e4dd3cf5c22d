"""GRPO and PPO baselines on a tiny random Llama: masks, advantages, learning, weight sync, run directory."""

from dataclasses import dataclass

import pytest
import torch
from rich.console import Console

from esopt.confutil import opt
from esopt.envs.base import Env, Episode, StepResult, Task
from esopt.rollout import RolloutConfig, rollout
from esopt.baselines.grpo import GRPOConfig, GRPOTrainer
from esopt.baselines.losses import gae, group_advantages, k3_kl, token_forward
from esopt.baselines.samples import GrammarMasks, Sample, build_samples
from esopt.baselines.ppo import PPOConfig, PPOTrainer


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
    """PickEnv registered as env "pick" for this test only."""
    from esopt import envs

    monkeypatch.setitem(envs.BUILTIN_ENVS, "pick", f"{__name__}:PickEnv")
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
    config.probe_tasks = 0
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


# ---- sampled token ids, grammar masks and loss masks ------------------------------------------------
def _collect(tmp_path, policy, name, history_turns=0, guided=True, max_new_tokens=2, turns=1, eos_in_loss=True):
    """One step's rollouts of a GRPO trainer and the samples built from them."""
    config = _config(GRPOConfig, tmp_path, name, eos_in_loss=eos_in_loss)
    config.env.options = {"turns": turns}
    config.rollout.history_turns = history_turns
    config.rollout.guided_decoding = guided
    config.rollout.sampling.max_new_tokens = max_new_tokens
    trainer = GRPOTrainer.start(config, policy=policy, console=Console(quiet=True))
    result, turns_ = trainer.collect(0)
    grammar = GrammarMasks(policy.tokenizer) if guided else None
    samples = build_samples(turns_, grammar, policy.tokenizer.eos_token_id, eos_in_loss)
    return trainer, result, turns_, samples


def _trained_ids(sample):
    return [t for t, m in zip(sample.ids.tolist(), sample.mask.tolist()) if m]


@pytest.mark.parametrize("history_turns", [-1, 0, 1])
def test_mask_covers_the_chosen_reply_tokens_only(tmp_path, make_tiny_policy, pick_env, history_turns):
    policy = make_tiny_policy()
    tok = policy.tokenizer
    trainer, result, turns, samples = _collect(tmp_path, policy, f"h{history_turns}", history_turns, turns=3)
    assert policy.jump_forward  # training rollouts switch it off only while they run
    for e, trajectory in enumerate(result.trajectories):
        mine = [s for s in samples if s.episode == e]
        trained = [t for s in mine for t in _trained_ids(s)]
        # "[ab]": one sampled choice per reply; the end-of-sequence token after it is forced (no gradient)
        assert tok.decode(trained) == "".join(trajectory.actions) and len(trained) == trajectory.turns
        assert sum(len(s.turn_spans) for s in mine) == trajectory.turns == len([t for t in turns if t.episode == e])
        letters = {tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("b")}
        for s in mine:
            assert len(s.allowed) == s.num_tokens and all(set(a) == letters for a in s.allowed)
            assert "OBS" not in tok.decode(_trained_ids(s)) and "Task" not in tok.decode(_trained_ids(s))
        if history_turns == -1:
            assert len(mine) == 1  # the turns extend each other token for token: one sequence per episode
            assert tok.decode(mine[0].ids).count("OBS") == 2  # observations are context, never loss
    for turn in turns:
        assert turn.reply_ids[-1] == tok.eos_token_id  # sampled (forced) without jump-forward


def test_trained_ids_are_the_sampled_ids_where_retokenising_differs(tmp_path, make_tiny_policy, pick_env):
    policy = make_tiny_policy()
    tok = policy.tokenizer
    _, result, turns, samples = _collect(tmp_path, policy, "raw", guided=False, max_new_tokens=6)
    differs = 0
    for turn, sample in zip(turns, samples):
        assert _trained_ids(sample) == turn.reply_ids  # unguided: every sampled token is a choice
        action = result.trajectories[turn.episode].actions[0]
        assert tok.decode(turn.reply_ids, skip_special_tokens=True).strip() == action  # the ids the reply came from
        differs += tok(action, add_special_tokens=False)["input_ids"] != [t for t in turn.reply_ids if t != tok.eos_token_id]
    assert len(samples) == len(turns) == 16
    assert differs > 0, "no reply re-tokenised differently: the test would not tell sampled ids from re-tokenised text"


def test_a_reply_cut_at_the_length_limit_trains_no_end_of_turn_token(tmp_path, make_tiny_policy, pick_env):
    policy = make_tiny_policy()
    eos = policy.tokenizer.eos_token_id
    # max_new_tokens=1: "a" or "b" fills the budget, so no end-of-sequence token was ever sampled
    _, result, turns, samples = _collect(tmp_path, policy, "cut", max_new_tokens=1)
    assert all(len(t.reply_ids) == 1 and t.reply_ids[0] != eos for t in turns)
    for sample in samples:
        assert eos not in _trained_ids(sample) and sample.num_tokens == 1
    # unguided, free-running replies cut at 3 tokens: the template's end-of-turn token stays context
    _, _, turns, samples = _collect(tmp_path, make_tiny_policy(), "cut_free", guided=False, max_new_tokens=3)
    for turn, sample in zip(turns, samples):
        assert _trained_ids(sample) == turn.reply_ids
        if len(turn.reply_ids) == 3 and eos not in turn.reply_ids:
            assert eos not in _trained_ids(sample) and eos in sample.ids.tolist()  # context, not loss


def test_without_eos_in_loss_a_sampled_end_of_turn_token_is_not_trained(tmp_path, make_tiny_policy, pick_env):
    policy = make_tiny_policy()
    _, _, turns, samples = _collect(tmp_path, policy, "noeos", guided=False, max_new_tokens=6, eos_in_loss=False)
    for turn, sample in zip(turns, samples):
        assert _trained_ids(sample) == [t for t in turn.reply_ids if t != policy.tokenizer.eos_token_id]


def test_forced_token_has_logprob_zero_and_no_gradient_and_choices_are_renormalised(make_tiny_policy):
    policy = make_tiny_policy()
    model = policy.model
    ids = torch.tensor([5, 17, 42, 99, 7])
    # token 99 was forced (one allowed token); token 7 was chosen among {7, 300, 301}
    sample = Sample(episode=0, ids=ids, mask=torch.tensor([0, 0, 0, 1, 1], dtype=torch.bool), turn_spans=[(3, 5)],
                    turn_rewards=[1.0], allowed=[[99], [7, 300, 301]])
    model.requires_grad_(True)
    try:
        out = token_forward(model, [sample], policy.tokenizer.pad_token_id, temperature=0.7, entropy=True)
        assert out["logp"][0].item() == 0.0
        out["logp"][0].backward(retain_graph=True)
        assert all(p.grad is None or not p.grad.any() for p in model.parameters())
        model.zero_grad(set_to_none=True)
        out["logp"][1].backward()
        assert any(p.grad is not None and p.grad.any() for p in model.parameters())
    finally:
        model.requires_grad_(False)
        model.zero_grad(set_to_none=True)
    with torch.no_grad():
        logits = model(ids[None]).logits[0, 3].float() / 0.7
    expected = torch.log_softmax(logits[[7, 300, 301]], -1)[0]
    assert out["logp"][1].item() == pytest.approx(expected.item(), abs=1e-5)
    assert out["logp"][1].item() > torch.log_softmax(logits, -1)[7].item()  # not the full-vocabulary log-prob
    assert out["entropy"][0].item() == 0.0 and torch.isfinite(out["entropy"]).all()


def test_bf16_gradients_accumulate_in_fp32_and_tiny_updates_move_the_master(tmp_path, make_tiny_policy, pick_env):
    policy = make_tiny_policy(dtype=torch.bfloat16)
    config = _config(GRPOConfig, tmp_path, "bf16")
    config.optim.lr = 1e-7  # an Adam step of ~1e-7 per weight: far below bf16's resolution of these weights
    trainer = GRPOTrainer.start(config, policy=policy, console=Console(quiet=True))
    model = policy.model
    start = {n: t.clone() for n, t in policy.master_weights().items()}
    model_start = {n: p.detach().clone() for n, p in model.named_parameters()}
    batches = [torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor([[9, 8, 7, 6, 5]]), torch.tensor([[3, 3, 4, 4, 5]])]
    bf16_grads = []
    model.requires_grad_(True)
    try:
        for scale, ids in zip((1.0, 3.7, 0.01), batches):
            (scale * model(ids).logits.float().logsumexp(-1).sum()).backward()
            bf16_grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            trainer.accumulate_gradients()
            assert all(p.grad is None for p in model.parameters())
    finally:
        model.requires_grad_(False)
    rounded = 0
    for name, master in policy.master_weights().items():
        fp32_sum = sum(g[name].float() for g in bf16_grads)
        assert torch.equal(master.grad, fp32_sum), name
        rounded += not torch.equal((bf16_grads[0][name] + bf16_grads[1][name] + bf16_grads[2][name]).float(), fp32_sum)
    assert rounded, "bf16 accumulation would have given the same sums: the check is vacuous"
    trainer.optimizer_step()
    moved = [n for n, t in policy.master_weights().items() if not torch.equal(t, start[n])]
    assert len(moved) == len(start)  # every fp32 master tensor took the tiny step
    assert any(torch.equal(p.detach(), model_start[n]) for n, p in model.named_parameters())  # bf16 could not hold it
    for name, master in policy.master_weights().items():
        assert master.dtype == torch.float32 and master.grad is None


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
    config = _config(cls, tmp_path, trainer_cls.method, probe_tasks=2)
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
    assert all(k.split("/")[0] in ("step", "train", "eval", "time", "mem", "probe") for r in records for k in r)
    assert [r["step"] for r in records if "probe/other_env_success" in r] == [0, 3]
    assert [r["step"] for r in records if "eval/success" in r] == [0, 3]
    # the budget every method is compared at: optimizer steps, episodes, wall-clock
    assert summary["optimizer_steps"] == 3 and summary["episodes"] == 48
    assert summary["train_s"] > 0 and summary["wall_s"] >= summary["train_s"] + summary["eval_s"] * 0.99
    report = (run / "report.md").read_text()
    assert "3 optimizer steps over 3 steps, 48 training episodes" in report and "s wall-clock in all" in report
    assert "## Forgetting probe" in report and "`sudoku` success, 2 val tasks" in report


def test_generation_policy_sees_optimizer_updates(tmp_path, make_tiny_policy, pick_env):
    policy = make_tiny_policy()
    start = {n: t.clone() for n, t in policy.master_weights().items()}
    config = _config(GRPOConfig, tmp_path, "sync", steps=1, kl_coef=0.1)
    config.optim.minibatches = 2
    trainer = GRPOTrainer.start(config, policy=policy, console=Console(quiet=True))
    values = trainer.train_step(0)
    assert values["train/optimizer_steps"] == 2
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



def test_ppo_value_head_learns_at_its_own_rate(tmp_path, make_tiny_policy, pick_env):
    policy = make_tiny_policy()
    config = _config(PPOConfig, tmp_path, "vf", steps=1, vf_lr=0.05)
    config.optim.lr = 1e-6
    trainer = PPOTrainer.start(config, policy=policy, console=Console(quiet=True))
    head = list(trainer.value_head.parameters())
    groups = trainer.optimizer.param_groups
    assert [g["lr"] for g in groups] == [1e-6, 0.05]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in head}
    before = [p.detach().clone() for p in head]
    trainer.train_step(0)
    # Adam's first step moves each parameter by about its learning rate: vf_lr, not optim.lr
    assert max(float((p.detach() - b).abs().max()) for p, b in zip(head, before)) > 0.01
    with pytest.raises(Exception, match="vf_lr"):
        _config(PPOConfig, tmp_path, "vf_bad", vf_lr=0.0).validate()


# ---- compare: budget matching and the report (the subprocess runs are exercised by `esopt compare`) ----
def test_compare_matches_the_episode_budget_and_writes_a_report(tmp_path):
    import json

    from esopt.experiments.compare import CompareConfig, MethodRun, method_summary, write_compare_report

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


def test_k3_estimates_the_kl_from_the_sampling_policy_to_the_reference():
    pi = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    ref = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    exact = float((pi * (pi / ref).log()).sum())  # KL(pi || ref) = 0.498
    tokens = torch.multinomial(pi, 200_000, replacement=True, generator=torch.Generator().manual_seed(0))
    estimate = float(k3_kl(pi.log()[tokens], ref.log()[tokens]).mean())  # standard error 0.0015
    swapped = float(k3_kl(ref.log()[tokens], pi.log()[tokens]).mean())  # the ratio the wrong way round: 0.622
    assert abs(estimate - exact) < 0.01 and abs(swapped - exact) > 0.1
    assert float(k3_kl(pi.log(), pi.log()).abs().max()) == 0.0  # zero where the policies agree
