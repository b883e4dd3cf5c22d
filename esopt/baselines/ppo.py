"""Multi-turn PPO on esopt's rollout engine: a value head on the final hidden state, GAE over the
episode's assistant tokens, clipped policy and value losses, the same masking as GRPO.

The episode's token steps are the tokens the model sampled by choice (grammar-forced ones excluded),
in order across its turns (env observations are transitions between them, not steps); each turn's
reward sits on that turn's last trained token (for end-of-episode rewards: on the final one). The
value of a token step is read from the hidden state that predicts that token. The value head (fp32
linear layer) shares the policy's trunk; its loss is weighted by vf_coef, and the head itself learns
at its own rate, vf_lr.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from esopt.confutil import ConfigError, opt
from esopt.rollout import Trajectory
from esopt.baselines.config import PGConfig
from esopt.baselines.losses import gae
from esopt.baselines.samples import Sample
from esopt.baselines.trainer import PGTrainer, cli_main


@dataclass
class PPOConfig(PGConfig):
    gamma: float = opt(1.0, "discount per token step in GAE")
    lam: float = opt(0.95, "GAE lambda")
    vf_coef: float = opt(0.1, "weight of the value loss")
    vf_lr: float = opt(
        1e-3,
        "AdamW learning rate of the value head: it starts from scratch and must fit the returns within a few "
        "steps, far faster than the policy's optim.lr may move the pretrained weights",
    )
    value_clip: float = opt(0.2, "clip the new value to old value +/- this in the value loss (0 = no clipping)")
    whiten_advantages: bool = opt(True, "normalise advantages to zero mean / unit std over the step's tokens")
    value_head_seed: int = opt(0, "seed of the value head's initialisation")

    method = "ppo"

    def check(self) -> None:
        super().check()
        if not 0 <= self.gamma <= 1 or not 0 <= self.lam <= 1:
            raise ConfigError(f"gamma and lam must be in [0, 1], got {self.gamma}, {self.lam}")
        if self.vf_coef < 0 or self.value_clip < 0:
            raise ConfigError("vf_coef and value_clip must be >= 0")
        if self.vf_lr <= 0:
            raise ConfigError(f"vf_lr must be > 0, got {self.vf_lr}")


class PPOTrainer(PGTrainer):
    method = "ppo"

    def make_value_head(self):
        hidden = self.model.config.hidden_size
        generator = torch.Generator().manual_seed(self.config.value_head_seed)
        head = torch.nn.Linear(hidden, 1)
        with torch.no_grad():
            head.weight.copy_(torch.randn(1, hidden, generator=generator) * (0.1 / hidden**0.5))
            head.bias.zero_()
        return head.to(next(self.model.parameters()).device)

    def param_groups(self) -> list[dict]:
        return super().param_groups() + [{"params": list(self.value_head.parameters()), "lr": self.config.vf_lr}]

    def compute_advantages(self, samples: list[Sample], trajectories: list[Trajectory]) -> dict[str, float]:
        cfg = self.config
        by_episode: dict[int, list[Sample]] = {}
        for s in samples:  # samples of an episode are built in turn order
            by_episode.setdefault(s.episode, []).append(s)
        all_adv = []
        for episode_samples in by_episode.values():
            values, rewards, sizes = [], [], []
            for s in episode_samples:
                r = torch.zeros(s.num_tokens)
                # token index within the sample's masked tokens of each trained turn's last token
                masked_before = torch.cumsum(s.mask.long(), 0)
                for (start, end), reward in zip(s.turn_spans, s.turn_rewards):
                    r[int(masked_before[end - 1]) - 1] += reward
                values.append(s.old_values.float().cpu())
                rewards.append(r)
                sizes.append(s.num_tokens)
            adv, ret = gae(torch.cat(rewards), torch.cat(values), cfg.gamma, cfg.lam)
            for s, a, g in zip(episode_samples, torch.split(adv, sizes), torch.split(ret, sizes)):
                s.advantages, s.returns = a, g
            all_adv.append(adv)
        flat = torch.cat(all_adv) if all_adv else torch.zeros(1)
        stats = {"adv_mean_raw": float(flat.mean()), "value_mean": float(torch.cat([s.old_values for s in samples]).mean()) if samples else 0.0}
        returns = torch.cat([s.returns for s in samples]) if samples else torch.zeros(1)
        old_values = torch.cat([s.old_values.float().cpu() for s in samples]) if samples else torch.zeros(1)
        var = float(returns.var(unbiased=False))
        stats["explained_var"] = 1 - float((returns - old_values).var(unbiased=False)) / var if var > 0 else 0.0
        if cfg.whiten_advantages and flat.numel() > 1:
            mu, sd = flat.mean(), flat.std(unbiased=False)
            for s in samples:
                s.advantages = (s.advantages - mu) / (sd + 1e-8)
        return stats

    def extra_loss(self, out: dict, chunk: list[Sample], stats: dict):
        values = out["values"]
        returns = torch.cat([s.returns for s in chunk]).to(values.device)
        old = torch.cat([s.old_values for s in chunk]).to(values.device)
        loss = (values - returns) ** 2
        if self.config.value_clip > 0:
            clipped = old + torch.clamp(values - old, -self.config.value_clip, self.config.value_clip)
            loss = torch.maximum(loss, (clipped - returns) ** 2)
        loss = 0.5 * loss
        stats["value_loss"] += float(loss.detach().sum())
        return self.config.vf_coef * loss.sum()


def main(argv: list[str]) -> int:
    return cli_main(argv, PPOConfig, PPOTrainer, "Fine-tune a model with multi-turn PPO (value head + GAE; baseline for ES).")
