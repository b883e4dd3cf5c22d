"""The config of a GRPO or PPO run (`PGConfig`; each method adds its own fields in grpo.py / ppo.py)."""

from __future__ import annotations

from dataclasses import dataclass

from esopt.confutil import Config, ConfigError, opt
from esopt.policy.config import ModelConfig
from esopt.rollout import RolloutConfig
from esopt.train.config import TrainingRunConfig


@dataclass
class OptimConfig(Config):
    lr: float = opt(1e-5, "AdamW learning rate")
    weight_decay: float = opt(0.0, "AdamW decoupled weight decay")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.999, "AdamW beta2")
    eps: float = opt(1e-8, "AdamW epsilon")
    max_grad_norm: float = opt(1.0, "clip the global gradient norm to this value (0 = no clipping)")
    epochs: int = opt(1, "passes over each step's rollouts (>1 re-uses the samples: the clipped ratio matters then)")
    minibatches: int = opt(1, "optimizer steps per epoch: the step's samples are split into this many minibatches")
    micro_batch_size: int = opt(8, "sequences per forward/backward pass (gradient accumulation up to a minibatch)")

    def check(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"optim.lr must be > 0, got {self.lr}")
        for name in ("epochs", "minibatches", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"optim.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_grad_norm < 0 or self.weight_decay < 0:
            raise ConfigError("optim.max_grad_norm and optim.weight_decay must be >= 0")


@dataclass
class PGConfig(TrainingRunConfig):
    model: ModelConfig = opt(ModelConfig(), "the policy model")
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
    seed: int = opt(0, "run seed: task batches, decoding seeds and minibatch order derive from it")
    max_train_seconds: float = opt(0.0, "stop after this many seconds of training steps (evaluations excluded); 0 = no limit")
    save_checkpoint: bool = opt(True, "save the final weights to checkpoints/ (loadable by from_pretrained)")

    method = "pg"
    run_marker = "metrics.jsonl"

    def run_label(self) -> str:
        return f"{self.env.name}__{self.method}"

    def check(self) -> None:
        super().check()
        if self.model.backend != "hf":
            raise ConfigError("GRPO/PPO backpropagate through the model: they need model.backend: hf")
        if self.rollout.expected_reward:
            raise ConfigError("GRPO/PPO train on sampled episodes: rollout.expected_reward is for ES training only")
        for name in ("steps", "tasks_per_step", "group_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_train_seconds", "kl_coef"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.train_temperature <= 0:
            raise ConfigError(f"train_temperature must be > 0 (sampled decoding), got {self.train_temperature}")
        if not 0 < self.clip_eps < 1:
            raise ConfigError(f"clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.clip_eps_high is not None and self.clip_eps_high <= 0:
            raise ConfigError(f"clip_eps_high must be > 0, got {self.clip_eps_high}")

    @property
    def episodes_per_step(self) -> int:
        return self.tasks_per_step * self.group_size
