"""Advantages (group-relative for GRPO, GAE for PPO) and per-token log-probabilities of samples under
the distribution they were sampled from (`token_forward`), the inputs of the clipped surrogate."""

from __future__ import annotations

import torch

from esopt.baselines.samples import Sample


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


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per token, the k3 estimator of KL(pi || ref) from tokens sampled from pi: r - log r - 1 with
    r = ref / pi. Unbiased and never negative."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


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
