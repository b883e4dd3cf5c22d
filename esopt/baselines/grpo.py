"""Multi-turn GRPO on esopt's rollout engine (the gradient baseline ES is compared against).

Per step: K sampled episodes of each task; each episode's return is normalised within its group,
A = (R - mean_group) / (std_group + eps), and that advantage is given to every token the model
sampled in the episode (all assistant turns, as sampled token ids; system prompt, observations and
grammar-forced tokens are masked out). The loss is the PPO-style clipped surrogate on token log-prob
ratios against the behaviour policy, plus an optional k3 KL to the frozen initial model, averaged
over the minibatch's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from esopt.confutil import ConfigError, opt
from esopt.rollout import Trajectory
from esopt.baselines.config import PGConfig
from esopt.baselines.losses import group_advantages
from esopt.baselines.samples import Sample
from esopt.baselines.trainer import PGTrainer, cli_main


@dataclass
class GRPOConfig(PGConfig):
    adv_eps: float = opt(1e-6, "eps in (R - group mean) / (group std + eps)")
    scale_by_std: bool = opt(True, "divide by the group std (false: Dr. GRPO's mean-centred advantages)")

    method = "grpo"

    def check(self) -> None:
        super().check()
        if self.group_size < 2:
            raise ConfigError(f"GRPO needs group_size >= 2 (advantages are relative within a group), got {self.group_size}")
        if self.adv_eps <= 0:
            raise ConfigError(f"adv_eps must be > 0, got {self.adv_eps}")


class GRPOTrainer(PGTrainer):
    method = "grpo"

    def compute_advantages(self, samples: list[Sample], trajectories: list[Trajectory]) -> dict[str, float]:
        cfg = self.config
        rewards = [t.reward for t in trajectories]
        advantages = group_advantages(rewards, cfg.group_size, cfg.adv_eps, cfg.scale_by_std)
        for s in samples:
            s.advantages = torch.full((s.num_tokens,), float(advantages[s.episode]), dtype=torch.float32)
        groups = [rewards[g : g + cfg.group_size] for g in range(0, len(rewards), cfg.group_size)]
        flat = sum(1 for g in groups if max(g) == min(g))
        return {"zero_std_groups": flat / len(groups), "adv_abs_mean": sum(abs(a) for a in advantages) / len(advantages)}


def main(argv: list[str]) -> int:
    return cli_main(argv, GRPOConfig, GRPOTrainer, "Fine-tune a model with multi-turn GRPO (baseline for ES).")
