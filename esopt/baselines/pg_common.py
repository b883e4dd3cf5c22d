"""Shared machinery of the gradient baselines (GRPO, PPO) that run on esopt's own rollout engine.

The baselines use the same envs, the same `rollout()` loop and the same held-out evaluation as the
ES trainer, so a comparison differs only in how the weights are updated:

1. sample episodes with `rollout()` at `train_temperature` (guided decoding as configured, without
   jump-forward), keeping each reply's prompt ids, sampled token ids and grammar (`ReplyRecorder`);
2. build sequences of exactly those ids with a loss mask over the sampled tokens the model chose:
   prompts, env observations and grammar-forced tokens are masked out, and a reply cut at the
   length limit has no end-of-turn token to train (`build_samples`);
3. score the behaviour policy's log-probabilities under the grammar mask sampling used (and the
   reference model's, with a KL term);
4. a few clipped-surrogate AdamW steps with gradient accumulation over micro-batches.

Weights: the optimizer updates the policy's fp32 master copy (the truth for HFPolicy, as for ES),
gradients are computed through the model in its own dtype (bf16 or fp32) and summed over micro-batches
in fp32 on the master (`accumulate_gradients`), and after
every optimizer step the master is written back into the model with `load_master_weights`, so the
next generate() call, `perturbed()` and `save()` all see the new weights.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import time
from dataclasses import dataclass
from itertools import groupby
from datetime import datetime
from pathlib import Path
from statistics import mean
from typing import Any

import torch
import yaml

from esopt.confutil import ConfigError, leaf_fields, load_yaml, opt, set_path, to_dict
from esopt.envs import env_class, make_env
from esopt.es import derive_seed
from esopt.policy.hf import HFPolicy, ModelConfig
from esopt.rollout import RolloutConfig, Trajectory, rollout
from esopt.train.logging import REPORT_TO_HELP, MetricsLogger, check_report_to, peak_rss_mb, read_metrics, write_trajectories
from esopt.train.forgetting import probe
from esopt.train.report import (
    eval_section, forgetting_section, heldout_comparison, plot_reward_curve, print_summary, summarize, time_section,
)


# ---- config ---------------------------------------------------------------------------------------
@dataclass
class EnvSection:
    name: str = opt("sudoku", "environment name (`esopt envs` lists them)")
    options: dict = opt({}, "env-specific options, e.g. size and empty_cells for sudoku (`esopt envs` lists them)")


@dataclass
class OptimConfig:
    lr: float = opt(1e-5, "AdamW learning rate")
    weight_decay: float = opt(0.0, "AdamW decoupled weight decay")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.999, "AdamW beta2")
    eps: float = opt(1e-8, "AdamW epsilon")
    max_grad_norm: float = opt(1.0, "clip the global gradient norm to this value (0 = no clipping)")
    epochs: int = opt(1, "passes over each step's rollouts (>1 re-uses the samples: the clipped ratio matters then)")
    minibatches: int = opt(1, "optimizer steps per epoch: the step's samples are split into this many minibatches")
    micro_batch_size: int = opt(8, "sequences per forward/backward pass (gradient accumulation up to a minibatch)")

    def validate(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"optim.lr must be > 0, got {self.lr}")
        for name in ("epochs", "minibatches", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"optim.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_grad_norm < 0 or self.weight_decay < 0:
            raise ConfigError("optim.max_grad_norm and optim.weight_decay must be >= 0")


@dataclass
class PGConfig:
    model: ModelConfig = opt(ModelConfig(), "the policy model")
    env: EnvSection = opt(EnvSection(), "the task environment")
    rollout: RolloutConfig = opt(RolloutConfig(), "how episodes are run; evaluation uses it as is (as ES does)")
    optim: OptimConfig = opt(OptimConfig(), "optimizer and batching")
    steps: int = opt(10, "training steps (each: rollouts, then optim.epochs x optim.minibatches updates)")
    tasks_per_step: int = opt(8, "training tasks per step (the same task stream as ES for the same seed)")
    group_size: int = opt(4, "K: sampled episodes per task per step (episodes per step = tasks_per_step * K)")
    train_temperature: float = opt(1.0, "sampling temperature of training rollouts (> 0); log-probs use the same temperature")
    clip_eps: float = opt(0.2, "PPO-style clip of the importance ratio: [1 - clip_eps, 1 + clip_eps_high]")
    clip_eps_high: float | None = opt(None, "upper clip (None = clip_eps); > clip_eps is DAPO's clip-higher")
    kl_coef: float = opt(0.0, "weight of the k3 KL estimator to the frozen reference (initial) model; 0 = no reference model kept")
    eos_in_loss: bool = opt(True, "also train the end-of-turn token the model sampled to close a reply (never forced or absent ones)")
    eval_tasks: int = opt(32, "held-out tasks per evaluation (the same tasks every time)")
    eval_seed: int = opt(0, "seed of the held-out task set (fixed, so runs with different seeds compare)")
    eval_split: str = opt("eval", "split of the periodic evaluation: 'eval' (held out, for reporting) or 'val' (for choosing settings)")
    eval_every: int = opt(5, "evaluate every k steps (0 = only before and after training)")
    seed: int = opt(0, "run seed: task batches, decoding seeds and minibatch order derive from it")
    max_train_seconds: float = opt(0.0, "stop after this many seconds of training steps (evaluations excluded); 0 = no limit")
    probe_tasks: int = opt(32, "forgetting probe before and after training: tasks of another env (0 = no probe; see train/forgetting.py)")
    save_checkpoint: bool = opt(True, "save the final weights to checkpoints/ (loadable by from_pretrained)")
    trajectories_per_step: int = opt(2, "training episodes saved per step, besides all eval episodes")
    runs_dir: str = opt("runs", "parent directory of run directories")
    run_name: str | None = opt(None, "run directory name (default: <env>__<method>__<seed>__<time>)")
    report_to: str = opt("auto", REPORT_TO_HELP)

    method = "pg"

    def validate(self) -> None:
        check_report_to(self.report_to)
        self.optim.validate()
        if self.model.backend != "hf":
            raise ConfigError("GRPO/PPO backpropagate through the model: they need model.backend: hf")
        for name in ("steps", "tasks_per_step", "group_size", "eval_tasks"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "trajectories_per_step", "max_train_seconds", "kl_coef", "probe_tasks"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.eval_split not in ("val", "eval"):
            raise ConfigError(f"eval_split must be 'val' or 'eval', got {self.eval_split!r}")
        if self.train_temperature <= 0:
            raise ConfigError(f"train_temperature must be > 0 (sampled decoding), got {self.train_temperature}")
        if not 0 < self.clip_eps < 1:
            raise ConfigError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.clip_eps_high is not None and self.clip_eps_high <= 0:
            raise ConfigError(f"clip_eps_high must be > 0, got {self.clip_eps_high}")
        make_env(self.env.name, self.env.options)

    @property
    def episodes_per_step(self) -> int:
        return self.tasks_per_step * self.group_size

    def to_yaml(self) -> str:
        return yaml.safe_dump(to_dict(self), sort_keys=False)


def load_pg_config(cls: type, path: str | Path | None) -> Any:
    return load_yaml(cls, path)


# ---- sampled replies, their grammar, and loss masks -----------------------------------------------
@dataclass
class SampledTurn:
    """One reply exactly as the policy produced it: the prompt ids it was generated from, the token ids
    it was sampled as (an end-of-sequence token only when one was sampled), the grammar that
    constrained sampling (None = none) and the turn's reward."""

    episode: int
    prompt_ids: list[int]
    reply_ids: list[int]
    regex: str | None
    reward: float


class ReplyRecorder:
    """Generates with the policy in place of it inside `rollout()`, keeping each row's prompt, grammar
    and sampled token ids per generate call, so that training sees the tokens that were sampled rather
    than a re-tokenisation of the decoded (and stripped) reply text."""

    def __init__(self, policy: HFPolicy):
        self.policy = policy
        self.calls: list[list[tuple[list[int], str | None, list[int], str]]] = []

    @property
    def last_reply_tokens(self):
        return self.policy.last_reply_tokens

    def generate(self, chats, sampling, action_regex=None, seed: int = 0, members=None) -> list[str]:
        replies = self.policy.generate(chats, sampling, action_regex=action_regex, seed=seed, members=members)
        regexes = list(action_regex) if isinstance(action_regex, list) else [action_regex] * len(chats)
        # Tokenized now: rollout() goes on appending to the message lists it passed in.
        tokenizer = self.policy.tokenizer
        texts = [tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) for chat in chats]
        prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]  # as HFPolicy tokenizes them
        self.calls.append(list(zip(prompts, regexes, self.policy.last_reply_ids, replies)))
        return replies

    def turns(self, trajectories: list[Trajectory]) -> list[SampledTurn]:
        """Every sampled turn, episode by episode in turn order. rollout() makes one generate call per
        turn over the episodes still live, in index order: call t's rows are the episodes with more
        than t turns."""
        per_episode: list[list[SampledTurn]] = [[] for _ in trajectories]
        for t, rows in enumerate(self.calls):
            live = [e for e, trajectory in enumerate(trajectories) if trajectory.turns > t]
            if len(live) != len(rows):
                raise RuntimeError(f"generate call {t} had {len(rows)} rows but {len(live)} episodes were live")
            for e, (prompt, regex, ids, reply) in zip(live, rows):
                if reply != trajectories[e].actions[t]:
                    raise RuntimeError(f"episode {e} turn {t}: the recorded reply is not the trajectory's action")
                per_episode[e].append(SampledTurn(e, prompt, list(ids), regex, trajectories[e].rewards[t]))
        return [turn for turns in per_episode for turn in turns]


class GrammarMasks:
    """The tokens a reply's grammar allowed at each position, computed as the guided decoder computed
    them (lm-format-enforcer on the same tokenizer data), so log-probabilities can be scored under the
    distribution that was sampled from."""

    def __init__(self, tokenizer):
        from esopt.policy.guided import tokenizer_data

        self.data = tokenizer_data(tokenizer)
        self.enforcers: dict[str, Any] = {}

    def allowed(self, regex: str, prompt_ids: list[int], reply_ids: list[int]) -> list[list[int]]:
        from lmformatenforcer import RegexParser, TokenEnforcer

        if regex not in self.enforcers:
            self.enforcers[regex] = TokenEnforcer(self.data, RegexParser(regex))
        enforcer = self.enforcers[regex]
        sequence = list(prompt_ids)  # the enforcer's first call on a sequence treats it as the prompt
        out = []
        for token in reply_ids:
            out.append(enforcer.get_allowed_tokens(sequence).allowed_tokens)  # shared and cached: read only
            sequence.append(token)
        return out


@dataclass
class Sample:
    """One training sequence: one or more consecutive turns of an episode (prompt ids + sampled ids)."""

    episode: int
    ids: torch.Tensor
    mask: torch.Tensor
    """mask[j]: token j was sampled by the model as a choice (not forced by the grammar) and carries loss."""
    turn_spans: list[tuple[int, int]]
    """[start, end) span of every trained turn, in order; end - 1 is the turn's last trained token."""
    turn_rewards: list[float]
    """Reward of each trained turn (same order as turn_spans)."""
    allowed: list[list[int] | None]
    """Per masked token (in order): the token ids the grammar allowed there (None = unconstrained)."""
    # filled by the trainer, one value per masked token (in order):
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())


def build_samples(turns: list[SampledTurn], grammar: GrammarMasks | None, eos_id: int, eos_in_loss: bool = True) -> list[Sample]:
    """Training sequences holding exactly the ids the model saw and sampled: each turn is its prompt ids
    followed by its sampled ids. A turn whose prompt extends the previous turn's sequence token for
    token (full history, unchanged re-tokenisation) joins that sequence, so an episode is one forward
    pass when it can be and several exact ones otherwise.

    Trained tokens: every sampled token except those the grammar forced (only one token allowed: the
    model made no choice there) and, without `eos_in_loss`, a sampled end-of-sequence token. A reply
    cut at max_new_tokens has no end-of-sequence token among its sampled ids, so none is trained. A
    turn with no trained token passes its reward on to the episode's next trained turn (or, at the
    end, to its last one)."""
    samples: list[Sample] = []
    for episode, episode_turns in groupby(turns, key=lambda turn: turn.episode):
        episode_samples: list[dict] = []
        pending = 0.0
        for turn in episode_turns:
            allowed = (
                grammar.allowed(turn.regex, turn.prompt_ids, turn.reply_ids)
                if grammar is not None and turn.regex is not None
                else [None] * len(turn.reply_ids)
            )
            current = episode_samples[-1] if episode_samples else None
            if current is None or turn.prompt_ids[: len(current["ids"])] != current["ids"]:
                current = {"ids": [], "mask": [], "spans": [], "rewards": [], "allowed": []}
                episode_samples.append(current)
            offset = len(turn.prompt_ids)
            current["mask"] += [False] * (offset - len(current["ids"]))
            current["ids"] = list(turn.prompt_ids) + list(turn.reply_ids)
            trained = []
            for k, (token, options) in enumerate(zip(turn.reply_ids, allowed)):
                if options is not None and token not in options:
                    raise RuntimeError(f"sampled token {token} is outside its grammar {turn.regex!r}: masks disagree")
                forced = options is not None and len(options) == 1
                unwanted_eos = not eos_in_loss and token == eos_id and k == len(turn.reply_ids) - 1
                train = not forced and not unwanted_eos
                current["mask"].append(train)
                if train:
                    trained.append(k)
                    current["allowed"].append(options)
            pending += turn.reward
            if trained:
                current["spans"].append((offset + trained[0], offset + trained[-1] + 1))
                current["rewards"].append(pending)
                pending = 0.0
        kept = [s for s in episode_samples if s["spans"]]
        if kept and pending:
            kept[-1]["rewards"][-1] += pending
        for s in kept:
            samples.append(
                Sample(
                    episode=episode,
                    ids=torch.tensor(s["ids"], dtype=torch.long),
                    mask=torch.tensor(s["mask"], dtype=torch.bool),
                    turn_spans=s["spans"],
                    turn_rewards=s["rewards"],
                    allowed=s["allowed"],
                )
            )
    return samples


# ---- advantages -----------------------------------------------------------------------------------
def group_advantages(rewards: list[float], group_size: int, eps: float = 1e-6, scale: bool = True) -> list[float]:
    """(r - group mean) / (group std + eps) within consecutive groups of `group_size` (population std).
    An all-equal group gives zeros."""
    if len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    out = []
    for g in range(0, len(rewards), group_size):
        group = torch.tensor(rewards[g : g + group_size], dtype=torch.float64)
        centred = group - group.mean()
        std = group.std(unbiased=False)
        out += (centred / (std + eps) if scale else centred).tolist()
    return out


def gae(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over one episode's token steps (terminal after the last).
    rewards[t], values[t]: per token step. Returns (advantages, returns = advantages + values)."""
    n = len(rewards)
    advantages = torch.zeros(n, dtype=torch.float32)
    running = 0.0
    for t in range(n - 1, -1, -1):
        next_value = float(values[t + 1]) if t + 1 < n else 0.0
        delta = float(rewards[t]) + gamma * next_value - float(values[t])
        running = delta + gamma * lam * running
        advantages[t] = running
    return advantages, advantages + values.float()


# ---- forward passes -------------------------------------------------------------------------------
def _pad(samples: list[Sample], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    length = max(len(s.ids) for s in samples)
    ids = torch.full((len(samples), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(samples), length), dtype=torch.long)
    target_mask = torch.zeros((len(samples), length), dtype=torch.bool)
    for row, s in enumerate(samples):
        ids[row, : len(s.ids)] = s.ids
        attention[row, : len(s.ids)] = 1
        target_mask[row, : len(s.ids)] = s.mask
    return ids.to(device), attention.to(device), target_mask.to(device)


def token_forward(model, samples: list[Sample], pad_id: int, temperature: float, value_head=None, entropy: bool = False):
    """Per masked token (concatenated in sample order): log-prob of the token at `temperature` under
    the distribution it was sampled from - renormalised over the tokens its grammar allowed, as guided
    decoding masked the others out - optionally the value of the state before it and the entropy.
    Logits are computed only at the masked positions (the vocabulary projection dominates memory
    otherwise)."""
    device = next(model.parameters()).device
    ids, attention, target_mask = _pad(samples, pad_id, device)
    base = getattr(model, model.base_model_prefix)
    hidden = base(input_ids=ids, attention_mask=attention).last_hidden_state  # (B, L, H)
    select = target_mask[:, 1:]  # position j predicts token j+1
    states = hidden[:, :-1][select]  # (N, H)
    targets = ids[:, 1:][select]
    logits = model.get_output_embeddings()(states).float() / temperature
    allowed = [options for s in samples for options in s.allowed]
    if any(options is not None for options in allowed):
        keep = torch.ones_like(logits, dtype=torch.bool)
        for row, options in enumerate(allowed):
            if options is not None:
                keep[row] = False
                keep[row, options] = True
        logits = logits.masked_fill(~keep, float("-inf"))
    logp_all = torch.log_softmax(logits, dim=-1)
    out = {"logp": logp_all.gather(-1, targets[:, None]).squeeze(-1)}
    if value_head is not None:
        out["values"] = value_head(states.float()).squeeze(-1)
    if entropy:
        with torch.no_grad():  # a statistic only; masked-out tokens have p = 0 and log p = -inf
            p = logp_all.exp()
            out["entropy"] = -torch.where(p > 0, p * logp_all, torch.zeros_like(p)).sum(-1)
    return out


def split_per_sample(values: torch.Tensor, samples: list[Sample]) -> list[torch.Tensor]:
    sizes = [s.num_tokens for s in samples]
    return list(torch.split(values, sizes))


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


# ---- the trainer ----------------------------------------------------------------------------------
class PGTrainer:
    """Rollouts -> samples -> advantages (subclass) -> clipped-surrogate updates. Subclasses implement
    `compute_advantages` and may add a value head and a value loss."""

    method = "pg"

    def __init__(self, config: PGConfig, run_dir: Path, policy: HFPolicy, console=None):
        from rich.console import Console

        config.validate()
        self.config = config
        self.run_dir = Path(run_dir)
        self.policy = policy
        self.console = console or Console()
        self.env = make_env(config.env.name, config.env.options)
        self.eval_tasks = self.env.tasks(config.eval_split, config.eval_tasks, config.eval_seed)
        self.train_rollout = copy.deepcopy(config.rollout)
        self.train_rollout.sampling.temperature = config.train_temperature
        self.model = policy.model
        self.tokenizer = policy.tokenizer
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.master = policy.master_weights()
        self.model_params = dict(self.model.named_parameters())
        missing = sorted(set(self.model_params) - set(self.master))
        if missing:
            raise RuntimeError(f"policy master copy lacks {missing[:3]}")
        self.value_head = self.make_value_head()
        o = config.optim
        self.optimizer = torch.optim.AdamW(
            self.param_groups(), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay
        )
        self.reference = None
        if config.kl_coef > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.episodes_done = 0
        self.train_seconds = 0.0

    def make_value_head(self):
        return None

    def param_groups(self) -> list[dict]:
        """The optimizer's parameter groups: the policy's fp32 master weights at optim.lr."""
        return [{"params": list(self.master.values())}]

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def start(cls, config: PGConfig, policy: HFPolicy | None = None, console=None) -> "PGTrainer":
        config.validate()
        name = config.run_name or f"{config.env.name}__{cls.method}__{config.seed}__{datetime.now().strftime('%Y%m%d-%H%M%S')}"
        run_dir = Path(config.runs_dir) / name
        if (run_dir / "metrics.jsonl").exists():
            raise ConfigError(f"run directory {run_dir} already holds a run (pick another run_name)")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(config.to_yaml())
        return cls(config, run_dir, policy or HFPolicy.load(config.model), console)

    # ---- evaluation: exactly the ES trainer's ---------------------------------------------------
    def evaluate(self, step: int) -> dict:
        start = time.perf_counter()
        result = rollout(self.policy, self.env, self.eval_tasks, self.config.rollout, seed=self.config.eval_seed)
        seconds = time.perf_counter() - start
        write_trajectories(
            self.run_dir / "trajectories" / f"eval_step{step:05d}.jsonl", [t.to_json() for t in result.trajectories]
        )
        values = {**{f"eval/{k}": v for k, v in result.metrics.items()}, "time/eval_s": seconds}
        self.metrics.log(step, values)
        m = result.metrics
        self.console.print(
            f"[bold]eval[/] after {step} updates: success {m['success']:.3f}  reward {m['mean_reward']:.3f}  "
            f"turns {m['mean_turns']:.2f}  invalid {m['invalid_rate']:.3f}  ({seconds:.0f}s)"
        )
        return values

    # ---- one step ------------------------------------------------------------------------------
    def collect(self, step: int):
        """Sample K episodes of each of this step's tasks with the current weights; returns the rollout
        result and every turn as it was sampled (`SampledTurn`)."""
        cfg = self.config
        tasks = self.env.tasks("train", cfg.tasks_per_step, derive_seed(cfg.seed, "tasks", step))
        grouped = [task for task in tasks for _ in range(cfg.group_size)]
        recorder = ReplyRecorder(self.policy)
        # Jump-forward prefills grammar-forced text with the prompt: those tokens would not be sampled
        # ids. Decoding them one by one makes every reply token a sampled one (forced ones are then
        # recognised by their single allowed token and carry no loss).
        jump_forward, self.policy.jump_forward = self.policy.jump_forward, False
        try:
            result = rollout(recorder, self.env, grouped, self.train_rollout, seed=derive_seed(cfg.seed, "decode", step))
        finally:
            self.policy.jump_forward = jump_forward
        return result, recorder.turns(result.trajectories)

    @torch.no_grad()
    def score_behaviour(self, samples: list[Sample]) -> None:
        """Old log-probs (and values) under the weights that generated the samples; reference log-probs."""
        size = self.config.optim.micro_batch_size
        for chunk in _chunks(samples, size):
            out = token_forward(self.model, chunk, self.pad_id, self.config.train_temperature, self.value_head)
            for s, lp in zip(chunk, split_per_sample(out["logp"], chunk)):
                s.old_logp = lp.detach()
            if "values" in out:
                for s, v in zip(chunk, split_per_sample(out["values"], chunk)):
                    s.old_values = v.detach()
            if self.reference is not None:
                ref = token_forward(self.reference, chunk, self.pad_id, self.config.train_temperature)
                for s, lp in zip(chunk, split_per_sample(ref["logp"], chunk)):
                    s.ref_logp = lp.detach()

    def compute_advantages(self, samples: list[Sample], trajectories: list[Trajectory]) -> dict[str, float]:
        raise NotImplementedError

    def extra_loss(self, out: dict, chunk: list[Sample], stats: dict) -> torch.Tensor | None:
        """Added per-token loss terms (e.g. the value loss), summed over tokens."""
        return None

    def _loss(self, chunk: list[Sample], stats: dict) -> tuple[torch.Tensor, int]:
        cfg = self.config
        out = token_forward(self.model, chunk, self.pad_id, cfg.train_temperature, self.value_head, entropy=True)
        logp = out["logp"]
        old = torch.cat([s.old_logp for s in chunk]).to(logp.device)
        adv = torch.cat([s.advantages for s in chunk]).to(logp.device)
        ratio = torch.exp(logp - old)
        high = cfg.clip_eps_high if cfg.clip_eps_high is not None else cfg.clip_eps
        clipped = torch.clamp(ratio, 1 - cfg.clip_eps, 1 + high)
        pg = -torch.minimum(ratio * adv, clipped * adv)
        loss = pg.sum()
        stats["pg_loss"] += float(pg.detach().sum())
        stats["clip_frac"] += float(((ratio < 1 - cfg.clip_eps) | (ratio > 1 + high)).float().sum())
        stats["entropy"] += float(out["entropy"].detach().sum())
        stats["ratio_dev"] += float((ratio.detach() - 1).abs().sum())
        if self.reference is not None:
            ref = torch.cat([s.ref_logp for s in chunk]).to(logp.device)
            d = ref - logp
            kl = torch.exp(d) - d - 1  # k3: unbiased, non-negative estimate of KL(pi || ref)
            loss = loss + cfg.kl_coef * kl.sum()
            stats["kl"] += float(kl.detach().sum())
        extra = self.extra_loss(out, chunk, stats)
        if extra is not None:
            loss = loss + extra
        return loss, len(logp)

    def accumulate_gradients(self) -> None:
        """Add the model's gradients of one micro-batch into the fp32 master's and clear them: left on
        a bf16 model, the sum over micro-batches would be rounded to 8 significant bits at every add."""
        for name, param in self.model_params.items():
            if param.grad is None:
                continue
            grad = param.grad.detach().to(torch.float32)
            master = self.master[name]
            master.grad = grad.clone() if master.grad is None else master.grad.add_(grad)
            param.grad = None

    def optimizer_step(self) -> float:
        """Clip the fp32 master's accumulated gradients, step, and write the master back into the model."""
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        max_norm = self.config.optim.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.policy.load_master_weights(self.master)  # the generating model now holds the new weights
        return float(norm)

    def update(self, samples: list[Sample], step: int) -> dict[str, float]:
        o = self.config.optim
        stats = {k: 0.0 for k in ("pg_loss", "clip_frac", "entropy", "ratio_dev", "kl", "value_loss", "tokens")}
        norms = []
        order_rng = random.Random(derive_seed(self.config.seed, "minibatch", step))
        self.model.requires_grad_(True)
        try:
            for _ in range(o.epochs):
                order = list(range(len(samples)))
                order_rng.shuffle(order)
                size = math.ceil(len(order) / o.minibatches)
                for mb in _chunks(order, size):
                    minibatch = [samples[i] for i in mb]
                    tokens = sum(s.num_tokens for s in minibatch)
                    if tokens == 0:
                        continue
                    for chunk in _chunks(minibatch, o.micro_batch_size):
                        loss, n = self._loss(chunk, stats)
                        (loss / tokens).backward()  # token-level mean over the minibatch
                        self.accumulate_gradients()
                        stats["tokens"] += n
                    norms.append(self.optimizer_step())
        finally:
            self.model.requires_grad_(False)
        n = max(1.0, stats.pop("tokens"))
        values = {f"train/{k}": v / n for k, v in stats.items()}
        values["train/grad_norm"] = mean(norms) if norms else 0.0
        values["train/learning_rate"] = o.lr
        values["train/optimizer_steps"] = len(norms)
        return values

    def train_step(self, step: int) -> dict[str, float]:
        cfg = self.config
        t0 = time.perf_counter()
        result, turns = self.collect(step)
        t1 = time.perf_counter()
        trajectories = result.trajectories
        # A fresh enforcer cache per step: it keys every prefix it has seen, prompt included.
        grammar = GrammarMasks(self.tokenizer) if cfg.rollout.guided_decoding else None
        samples = build_samples(turns, grammar, self.tokenizer.eos_token_id, cfg.eos_in_loss)
        self.score_behaviour(samples)
        adv_stats = self.compute_advantages(samples, trajectories)
        t2 = time.perf_counter()
        values = self.update(samples, step)
        t3 = time.perf_counter()
        self.episodes_done += len(trajectories)
        if cfg.trajectories_per_step:
            write_trajectories(
                self.run_dir / "trajectories" / "train.jsonl",
                [{"step": step, **t.to_json()} for t in trajectories[: cfg.trajectories_per_step]],
            )
        rewards = [t.reward for t in trajectories]
        m = result.metrics
        values.update(
            {
                "train/mean_reward": m["mean_reward"],
                "train/fitness_mean": m["mean_reward"],  # the ES name, so reports and plots line up
                "train/reward_std": float(torch.tensor(rewards).std(unbiased=False)),
                "train/success": m["success"],
                "train/mean_turns": m["mean_turns"],
                "train/invalid_rate": m["invalid_rate"],
                "train/episodes": self.episodes_done,
                "train/sequences": len(samples),
                "train/trained_tokens": sum(s.num_tokens for s in samples),
                **{f"train/{k}": v for k, v in adv_stats.items()},
                "time/step_s": t3 - t0,
                "time/generate_s": result.generate_s,
                "time/env_s": result.env_s,
                "time/score_s": t2 - t1,
                "time/update_s": t3 - t2,
                "mem/peak_rss_mb": peak_rss_mb(),
            }
        )
        return values

    # ---- the loop ------------------------------------------------------------------------------
    def save_checkpoint(self, updates: int) -> Path:
        path = self.run_dir / "checkpoints" / f"step_{updates:05d}"
        self.policy.save(str(path))
        (path / "esopt.json").write_text(json.dumps({"updates": updates, "fingerprint": self.policy.fingerprint()}))
        return path

    def log_probe(self, step: int) -> None:
        if self.config.probe_tasks:
            self.metrics.log(step, probe(self.policy, self.config.env.name, self.config.rollout, self.config.probe_tasks))

    def run(self) -> dict:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        cfg = self.config
        started = time.perf_counter()
        self.metrics = MetricsLogger(self.run_dir, cfg.report_to, to_dict(cfg))
        self.evaluate(0)
        self.log_probe(0)
        last_eval = 0
        done = 0
        columns = [
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            TextColumn("reward {task.fields[reward]:.3f}"),
        ]
        with Progress(*columns, console=self.console, transient=False) as progress:
            bar = progress.add_task(f"{self.method} steps", total=cfg.steps, reward=0.0)
            for step in range(cfg.steps):
                values = self.train_step(step)
                done = step + 1
                self.train_seconds += values["time/step_s"]
                values["time/train_s"] = self.train_seconds
                self.metrics.log(done, values)
                progress.update(bar, advance=1, reward=values["train/mean_reward"])
                out_of_time = bool(cfg.max_train_seconds) and self.train_seconds >= cfg.max_train_seconds
                if out_of_time or done == cfg.steps:
                    break
                if cfg.eval_every and done % cfg.eval_every == 0:
                    self.evaluate(done)
                    last_eval = done
        if last_eval != done:
            self.evaluate(done)
        self.log_probe(done)
        if cfg.save_checkpoint:
            self.save_checkpoint(done)
        self.metrics.close()
        summary = write_pg_report(
            self.run_dir, cfg, self.method, read_metrics(self.run_dir), self.policy.fingerprint(),
            wall_seconds=time.perf_counter() - started,
        )
        summary["run_dir"] = str(self.run_dir)
        return summary


# ---- report ---------------------------------------------------------------------------------------
PG_TIME_KEYS = ("generate_s", "env_s", "score_s", "update_s")


def summarize_pg(metrics: list[dict]) -> dict:
    """`summarize` plus the budget a run spent: optimizer steps, training episodes, training seconds
    (rollouts and updates) and evaluation seconds."""
    summary = summarize(metrics, "train/mean_reward", PG_TIME_KEYS)
    train = [r for r in metrics if "train/mean_reward" in r]
    summary["optimizer_steps"] = int(sum(r.get("train/optimizer_steps", 0) for r in train))
    summary["episodes"] = train[-1]["train/episodes"] if train else 0
    summary["train_s"] = train[-1].get("time/train_s", 0.0) if train else 0.0
    summary["eval_s"] = sum(r.get("time/eval_s", 0.0) for r in metrics if "eval/success" in r)
    return summary


def budget_line(summary: dict) -> str:
    """One line: what the run spent, so methods compare at equal cost."""
    wall = f", {summary['wall_s']:.0f} s wall-clock in all" if "wall_s" in summary else ""
    return (
        f"{summary['optimizer_steps']} optimizer steps over {summary['steps']} steps, {summary['episodes']} training episodes, "
        f"{summary['train_s']:.0f} s training (rollouts and updates) + {summary['eval_s']:.0f} s evaluation{wall}"
    )


def write_pg_report(
    run_dir: Path, config: PGConfig, method: str, metrics: list[dict], fingerprint: str, wall_seconds: float | None = None
) -> dict:
    summary = summarize_pg(metrics)
    if wall_seconds is not None:
        summary["wall_s"] = wall_seconds
    if "eval_steps" in summary:  # success intervals and the paired before/after gain, as ES reports show them
        summary["eval_n"] = config.eval_tasks
        summary["heldout"] = heldout_comparison(run_dir, *summary["eval_steps"])
    train = [r for r in metrics if "train/mean_reward" in r]
    evals = [r for r in metrics if "eval/success" in r]
    plot = plot_reward_curve(
        run_dir, train, evals, "train/mean_reward", "train: mean episode reward (sampled)", std_key=None
    )
    o = config.optim
    lines = [
        f"# esopt run: {config.env.name} / {method}",
        "",
        f"Model `{config.model.path}` ({config.model.dtype}), env `{config.env.name}` {config.env.options}, "
        f"{config.tasks_per_step} tasks x K={config.group_size} episodes per step, {summary['steps']} of {config.steps} steps, "
        f"train temperature {config.train_temperature:g}, lr {o.lr:g}, {o.epochs} epoch(s) x {o.minibatches} minibatch(es), "
        f"clip {config.clip_eps:g}, KL {config.kl_coef:g}, seed {config.seed}.",
        "",
        "## Budget",
        "",
        budget_line(summary) + ".",
        "",
    ]
    lines += eval_section(summary, f"{config.eval_tasks} tasks, same rollout/eval code as ES")
    lines += time_section(summary)
    lines += forgetting_section(metrics, config.env.name, config.probe_tasks)
    if plot:
        lines += ["## Reward curve", "", f"![reward curve]({plot})", ""]
    lines += [f"Final weights fingerprint: `{fingerprint}`", ""]
    (Path(run_dir) / "report.md").write_text("\n".join(lines))
    summary["report"] = str(Path(run_dir) / "report.md")
    return summary


# ---- command line ---------------------------------------------------------------------------------
def add_config_flags(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    for path, hint, help_text, default in leaf_fields(cls):
        if path in skip or path.startswith(skip):
            continue
        names = [f"--{path}"] + ([f"--{path.replace('_', '-')}"] if "_" in path else [])
        parser.add_argument(*names, dest=f"cfg:{path}", default=argparse.SUPPRESS, metavar="V", help=f"{help_text} (default: {default})")


def add_env_flags(parser: argparse.ArgumentParser, argv: list[str], default_env: str) -> None:
    env_name = default_env
    for i, arg in enumerate(argv):
        if arg == "--env" and i + 1 < len(argv):
            env_name = argv[i + 1]
        elif arg.startswith("--env="):
            env_name = arg.split("=", 1)[1]
    parser.add_argument("--env", dest="env_name", default=argparse.SUPPRESS, metavar="NAME", help="environment name")
    try:
        cls = env_class(env_name)
    except ConfigError:
        return
    for path, _, help_text, default in leaf_fields(cls.Config):
        parser.add_argument(f"--env.{path}", dest=f"env:{path}", default=argparse.SUPPRESS, metavar="V", help=f"[{env_name}] {help_text} (default: {default})")


def _config_file(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def config_parser(argv: list[str], cls: type, prog: str, description: str, loader, skip: tuple[str, ...] = ("env.",)) -> argparse.ArgumentParser:
    """A parser with --config, --env and its --env.* options (of the env named in argv or the YAML) and
    one flag per config field (except those under `skip`)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="YAML config (configs/*.yaml); flags override it")
    config_file = _config_file(argv)
    default_env = cls().env.name
    if config_file and Path(config_file).is_file():
        try:
            default_env = loader(config_file).env.name
        except ConfigError:
            pass  # reported when the config is loaded
    add_env_flags(parser, argv, default_env)
    add_config_flags(parser, cls, skip=skip)
    return parser


def config_from_args(args: argparse.Namespace, loader):
    """The YAML config (args.config) with the env choice, env options and field flags applied (flags win)."""
    config = loader(args.config)
    if hasattr(args, "env_name") and args.env_name != config.env.name:
        config.env.name = args.env_name
        config.env.options = {}
    config.env.options.update({k[4:]: v for k, v in vars(args).items() if k.startswith("env:")})
    for key, value in vars(args).items():
        if key.startswith("cfg:"):
            set_path(config, key[4:], value)
    return config


def parse_config(argv: list[str], cls: type, prog: str, description: str, loader=None):
    """Build a config from --config YAML plus flag overrides (flags win), env flags included."""
    loader = loader or (lambda path: load_pg_config(cls, path))
    args = config_parser(argv, cls, prog, description, loader).parse_args(argv)
    return config_from_args(args, loader)


def cli_main(argv: list[str], config_cls: type, trainer_cls: type, description: str) -> int:
    from rich.console import Console

    config = parse_config(argv, config_cls, f"esopt {trainer_cls.method}", description)
    config.validate()
    console = Console()
    console.rule("resolved config")
    console.print(config.to_yaml(), highlight=False)
    summary = trainer_cls.start(config, console=console).run()
    print_summary(console, summary, f"esopt: {config.env.name} / {trainer_cls.method}")
    console.print(f"budget: {budget_line(summary)}")
    return 0
