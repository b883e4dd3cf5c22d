"""Shared machinery of the gradient baselines (GRPO, PPO) that run on esopt's own rollout engine.

The baselines use the same envs, the same `rollout()` loop and the same held-out evaluation as the
ES trainer, so a comparison differs only in how the weights are updated:

1. sample episodes with `rollout()` at `train_temperature` (guided decoding as configured);
2. turn every trajectory into token ids plus a loss mask that covers exactly the assistant reply
   tokens (and, by default, the end-of-turn token that closed each reply) - system prompt and env
   observations are masked out (`encode_chat`, `build_samples`);
3. score the behaviour policy's log-probabilities (and the reference model's, with a KL term);
4. a few clipped-surrogate AdamW steps with gradient accumulation over micro-batches.

Weights: the optimizer updates the policy's fp32 master copy (the truth for HFPolicy, as for ES),
gradients are computed through the model in its own dtype (bf16 or fp32) and cast to fp32, and after
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
from esopt.rollout import RolloutConfig, Trajectory, _prompt, rollout
from esopt.train.logging import MetricsLogger, peak_rss_mb, read_metrics, write_trajectories
from esopt.train.report import eval_section, plot_reward_curve, print_summary, summarize, time_section


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
    eos_in_loss: bool = opt(True, "also train the end-of-turn token that closed each reply (it is the model's own token)")
    eval_tasks: int = opt(32, "held-out tasks per evaluation (the same tasks every time)")
    eval_seed: int = opt(0, "seed of the held-out task set (fixed, so runs with different seeds compare)")
    eval_every: int = opt(5, "evaluate every k steps (0 = only before and after training)")
    seed: int = opt(0, "run seed: task batches, decoding seeds and minibatch order derive from it")
    max_train_seconds: float = opt(0.0, "stop after this many seconds of training steps (evaluations excluded); 0 = no limit")
    save_checkpoint: bool = opt(True, "save the final weights to checkpoints/ (loadable by from_pretrained)")
    trajectories_per_step: int = opt(2, "training episodes saved per step, besides all eval episodes")
    runs_dir: str = opt("runs", "parent directory of run directories")
    run_name: str | None = opt(None, "run directory name (default: <env>__<method>__<seed>__<time>)")

    method = "pg"

    def validate(self) -> None:
        self.optim.validate()
        if self.model.backend != "hf":
            raise ConfigError("GRPO/PPO backpropagate through the model: they need model.backend: hf")
        for name in ("steps", "tasks_per_step", "group_size", "eval_tasks"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "trajectories_per_step", "max_train_seconds", "kl_coef"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
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


# ---- token ids and loss masks ---------------------------------------------------------------------
@dataclass
class Encoded:
    ids: list[int]
    mask: list[bool]
    """mask[j]: token j is the model's own (an assistant reply token) and carries loss."""
    turn_spans: list[tuple[int, int]]
    """[start, end) token span of every trained assistant turn, in order."""


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def encode_chat(tokenizer, messages: list[dict], trainable: set[int] | None = None, eos_in_loss: bool = True) -> Encoded:
    """Token ids of `messages` rendered with the chat template, and a mask over the assistant replies.

    Message i (an assistant turn, in `trainable` or all of them when None) contributes exactly the
    tokens of its content (plus the end-of-turn token when `eos_in_loss`); everything the template
    adds around it and every other message is masked out. The text is split at the reply boundaries
    and each piece tokenized on its own, as at generation time (prompt, then generated tokens), so no
    token straddles a boundary. Raises ValueError when the template does not render the conversation
    as prompt-then-reply (e.g. templates that rewrite earlier turns).
    """
    full = _render(tokenizer, messages, generation_prompt=False)
    eos = tokenizer.eos_token or ""
    pieces: list[tuple[str, bool]] = []
    pos = 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or (trainable is not None and i not in trainable):
            continue
        prefix = _render(tokenizer, messages[:i], generation_prompt=True)
        content = message["content"]
        if len(prefix) < pos or not full.startswith(prefix) or not full.startswith(content, len(prefix)):
            raise ValueError(
                f"the chat template does not render assistant turn {i} as prompt + reply; "
                "set rollout.history_turns >= 0 to train on one turn per sequence"
            )
        pieces.append((full[pos : len(prefix)], False))
        pieces.append((content, True))
        pos = len(prefix) + len(content)
        if eos_in_loss and eos and full.startswith(eos, pos):
            pieces.append((eos, True))
            pos += len(eos)
    pieces.append((full[pos:], False))
    ids: list[int] = []
    mask: list[bool] = []
    spans: list[tuple[int, int]] = []
    for text, train in pieces:
        if not text:
            continue
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
        if train:
            if spans and spans[-1][1] == len(ids):  # the eos piece extends its reply's span
                spans[-1] = (spans[-1][0], len(ids) + len(tokens))
            else:
                spans.append((len(ids), len(ids) + len(tokens)))
        ids += tokens
        mask += [train] * len(tokens)
    return Encoded(ids, mask, [s for s in spans if s[1] > s[0]])


@dataclass
class Sample:
    """One training sequence: a whole episode (history_turns = -1) or one turn of it."""

    episode: int
    ids: torch.Tensor
    mask: torch.Tensor
    turn_spans: list[tuple[int, int]]
    turn_rewards: list[float]
    """Reward of each trained turn (same order as turn_spans)."""
    # filled by the trainer, one value per masked token (in order):
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())


def build_samples(tokenizer, trajectories: list[Trajectory], history_turns: int, eos_in_loss: bool = True) -> list[Sample]:
    """Training sequences that reproduce what the model saw: with full history (-1) one sequence per
    episode with every reply trained; otherwise one sequence per turn, holding exactly the prompt the
    rollout loop built for that turn (`rollout._prompt`) followed by the reply."""
    samples = []
    for e, trajectory in enumerate(trajectories):
        messages = trajectory.messages
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if history_turns < 0:
            chats = [(messages, None, list(trajectory.rewards))]
        else:
            chats = []
            for t, i in enumerate(turns):
                chat = _prompt(messages[:i], history_turns) + [messages[i]]
                chats.append((chat, {len(chat) - 1}, [trajectory.rewards[t]]))
        for chat, trainable, rewards in chats:
            enc = encode_chat(tokenizer, chat, trainable, eos_in_loss)
            if len(enc.turn_spans) != len(rewards):  # an empty reply without eos: fold its reward forward
                rewards = [sum(rewards)] if enc.turn_spans else []
                enc.turn_spans = enc.turn_spans[-1:]
            if not enc.turn_spans:
                continue
            samples.append(
                Sample(
                    episode=e,
                    ids=torch.tensor(enc.ids, dtype=torch.long),
                    mask=torch.tensor(enc.mask, dtype=torch.bool),
                    turn_spans=enc.turn_spans,
                    turn_rewards=rewards,
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
    """Per masked token (concatenated in sample order): log-prob of the token at `temperature`,
    optionally the value of the state before it and the entropy. Logits are computed only at the
    masked positions (the vocabulary projection dominates memory otherwise)."""
    device = next(model.parameters()).device
    ids, attention, target_mask = _pad(samples, pad_id, device)
    base = getattr(model, model.base_model_prefix)
    hidden = base(input_ids=ids, attention_mask=attention).last_hidden_state  # (B, L, H)
    select = target_mask[:, 1:]  # position j predicts token j+1
    states = hidden[:, :-1][select]  # (N, H)
    targets = ids[:, 1:][select]
    logits = model.get_output_embeddings()(states).float() / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    out = {"logp": logp_all.gather(-1, targets[:, None]).squeeze(-1)}
    if value_head is not None:
        out["values"] = value_head(states.float()).squeeze(-1)
    if entropy:
        out["entropy"] = -(logp_all.exp() * logp_all).sum(-1)
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
        self.eval_tasks = self.env.tasks("eval", config.eval_tasks, config.eval_seed)
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
        params = list(self.master.values()) + (list(self.value_head.parameters()) if self.value_head is not None else [])
        o = config.optim
        self.optimizer = torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay)
        self.reference = None
        if config.kl_coef > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.episodes_done = 0
        self.train_seconds = 0.0

    def make_value_head(self):
        return None

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
        """Sample K episodes of each of this step's tasks with the current weights."""
        cfg = self.config
        tasks = self.env.tasks("train", cfg.tasks_per_step, derive_seed(cfg.seed, "tasks", step))
        grouped = [task for task in tasks for _ in range(cfg.group_size)]
        return rollout(self.policy, self.env, grouped, self.train_rollout, seed=derive_seed(cfg.seed, "decode", step))

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

    def _optimizer_step(self) -> float:
        """Move the model's gradients onto the fp32 master, clip, step, and write the master back into the model."""
        for name, param in self.model_params.items():
            grad = param.grad
            self.master[name].grad = None if grad is None else grad.detach().to(torch.float32)
            param.grad = None
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
                        stats["tokens"] += n
                    norms.append(self._optimizer_step())
        finally:
            self.model.requires_grad_(False)
        n = max(1.0, stats.pop("tokens"))
        values = {f"train/{k}": v / n for k, v in stats.items()}
        values["train/grad_norm"] = mean(norms) if norms else 0.0
        values["train/optimizer_steps"] = len(norms)
        return values

    def train_step(self, step: int) -> dict[str, float]:
        cfg = self.config
        t0 = time.perf_counter()
        result = self.collect(step)
        t1 = time.perf_counter()
        trajectories = result.trajectories
        samples = build_samples(self.tokenizer, trajectories, cfg.rollout.history_turns, cfg.eos_in_loss)
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

    def run(self) -> dict:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        cfg = self.config
        self.metrics = MetricsLogger(self.run_dir)
        self.evaluate(0)
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
        if cfg.save_checkpoint:
            self.save_checkpoint(done)
        self.metrics.close()
        summary = write_pg_report(self.run_dir, cfg, self.method, read_metrics(self.run_dir), self.policy.fingerprint())
        summary["run_dir"] = str(self.run_dir)
        return summary


# ---- report ---------------------------------------------------------------------------------------
PG_TIME_KEYS = ("generate_s", "env_s", "score_s", "update_s")


def summarize_pg(metrics: list[dict]) -> dict:
    summary = summarize(metrics, "train/mean_reward", PG_TIME_KEYS)
    train = [r for r in metrics if "train/mean_reward" in r]
    if train:
        summary["episodes"] = train[-1]["train/episodes"]
    return summary


def write_pg_report(run_dir: Path, config: PGConfig, method: str, metrics: list[dict], fingerprint: str) -> dict:
    summary = summarize_pg(metrics)
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
    ]
    lines += eval_section(summary, f"{config.eval_tasks} tasks, same rollout/eval code as ES")
    lines += time_section(summary)
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
    return 0
