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

import copy
import json
import math
import random
import time
from pathlib import Path
from statistics import mean

import torch

from esopt.baselines.config import PGConfig
from esopt.baselines.losses import k3_kl, split_per_sample, token_forward
from esopt.baselines.report import budget_line, write_pg_report
from esopt.baselines.samples import GrammarMasks, ReplyRecorder, Sample, build_samples
from esopt.confutil import to_dict
from esopt.envs import make_env
from esopt.es import derive_seed
from esopt.policy.hf import HFPolicy
from esopt.rollout import Trajectory, rollout
from esopt.runconfig import parse_config
from esopt.train.forgetting import log_probe
from esopt.train.logging import MetricsLogger, peak_rss_mb, read_metrics, write_trajectories
from esopt.train.report import print_summary


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


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
        self.eval_env = config.make_eval_env()
        self.eval_tasks = self.eval_env.tasks(config.eval_split, config.eval_tasks, config.eval_seed)
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
        return cls(config, config.create_run_dir(), policy or HFPolicy.load(config.model), console)

    # ---- evaluation: exactly the ES trainer's ---------------------------------------------------
    def evaluate(self, step: int) -> dict:
        start = time.perf_counter()
        result = rollout(self.policy, self.eval_env, self.eval_tasks, self.config.rollout, seed=self.config.eval_seed)
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
            kl = k3_kl(logp, ref)
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

    def run(self) -> dict:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        cfg = self.config
        started = time.perf_counter()
        self.metrics = MetricsLogger(self.run_dir, cfg.report_to, to_dict(cfg))
        self.evaluate(0)
        log_probe(self.metrics, self.policy, cfg, 0)
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
        log_probe(self.metrics, self.policy, cfg, done)
        if cfg.save_checkpoint:
            self.save_checkpoint(done)
        self.metrics.close()
        summary = write_pg_report(
            self.run_dir, cfg, self.method, read_metrics(self.run_dir), self.policy.fingerprint(),
            wall_seconds=time.perf_counter() - started,
        )
        summary["run_dir"] = str(self.run_dir)
        return summary


# ---- command line ---------------------------------------------------------------------------------
def cli_main(argv: list[str], config_cls: type, trainer_cls: type, description: str) -> int:
    """`esopt grpo` / `esopt ppo`: parse and validate the config, train, print the summary and budget."""
    from rich.console import Console

    config, _ = parse_config(argv, config_cls, f"esopt {trainer_cls.method}", description)
    console = Console()
    console.rule("resolved config")
    console.print(config.to_yaml(), highlight=False)
    summary = trainer_cls.start(config, console=console).run()
    print_summary(console, summary, f"esopt: {config.env.name} / {trainer_cls.method}")
    console.print(f"budget: {budget_line(summary)}")
    return 0
