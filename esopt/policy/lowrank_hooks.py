"""Population batching for the HF policy: forward hooks that add each row's low-rank perturbation
to the outputs of the hooked nn.Linear and nn.Embedding layers.

`HFPolicy.generate(chats, ..., members=[...])` answers each chat with its own
member's weights in ONE batched forward over the shared base weights. While such a call runs, a forward hook on every nn.Linear
whose weight is in the members' scope (es.scope) adds s_row * (x B) A^T to its
output and one on every such nn.Embedding adds s_row * A[ids] B^T, where
s_row = sign*sigma/sqrt(rank) of the row's member (0 for rows without one).
The factors of all members in the call sit side by side (A: [m, S*r],
B: [n, S*r]); each row's coefficient vector is nonzero only on its member's
columns, so a layer costs two small matmuls whatever the mix of members, with
no per-row Python loop. Hooks run in every decode step, so the KV cache holds
perturbed keys and values; left-padded positions are perturbed too but are
masked out as usual. A tied lm_head shares the embedding's tensor
name, so it gets the same A B^T as the embedding, exactly as materialised
weights would. Non-matrix tensors (norm weights, biases) are frozen under
low-rank noise by default; with `lowrank_vectors: full` they would need
per-row norm weights, which the hooks do not provide, so such members run one
after another with materialised weights (`supports_population` says no).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from esopt.es import LowRankNoise, Scope


@dataclass
class PopulationFactors:
    """Stacked low-rank factors of a set of member seeds: slot s owns columns s*rank .. s*rank+rank-1."""

    slots: dict[int, int]
    noise: LowRankNoise
    scope: Scope
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]
    """Name of each hooked tensor in the scope -> (A [m, S*rank], B [n, S*rank]) in the weight's dtype on
    the model's device."""


def members_problem(members) -> str | None:
    """Why these members cannot share one batched forward over one base weight, whatever the backend
    (None = they can): they need low-rank noise of one rank, one scope, and no CoPES subspaces."""
    if any(not isinstance(m.noise, LowRankNoise) for m in members):
        return "population batching needs low-rank noise (es.noise=lowrank)"
    if len({(m.noise, m.scope) for m in members}) > 1:
        return "population batching needs one rank and one scope for all members"
    if any(m.partition is not None for m in members):
        return "population batching does not support CoPES subspaces"
    return None


def hook_targets(
    model, params: dict[str, torch.nn.Parameter]
) -> tuple[list[tuple[torch.nn.Module, str, str]], dict[str, str]]:
    """(module, 'linear' | 'embedding', tensor name) for every module whose weight is a trainable matrix,
    and, by tensor name, why hooks cannot perturb a matrix (a scope holding it rules out population batching)."""
    names = {id(p): name for name, p in params.items()}
    targets: list[tuple[torch.nn.Module, str, str]] = []
    unhookable: dict[str, str] = {}
    for module_name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if weight is None or id(weight) not in names or weight.dim() != 2:
            continue
        name = names[id(weight)]
        if type(module) is torch.nn.Linear:
            targets.append((module, "linear", name))
        elif type(module) is torch.nn.Embedding and module.max_norm is None:
            targets.append((module, "embedding", name))
        else:
            unhookable.setdefault(name, f"population batching cannot hook module {module_name!r} ({type(module).__name__})")
    covered = {name for _, _, name in targets}
    for name, p in params.items():
        if p.dim() == 2 and name not in covered:
            unhookable.setdefault(name, f"population batching cannot perturb {name!r}: no nn.Linear or nn.Embedding uses it")
    return targets, unhookable


def bind_hook(hook, row_coefficients: Callable[[], torch.Tensor], a: torch.Tensor, b: torch.Tensor):
    """`hook` as a forward hook on factors (a, b), reading the current per-row coefficients [rows, S*rank]."""

    def bound(module, args, output):
        return hook(row_coefficients(), a, b, args, output)

    return bound


def _row_scale(coef: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if x.dim() < 2 or x.shape[0] != coef.shape[0]:
        raise RuntimeError(
            f"population batching expects batch-first activations with {coef.shape[0]} rows, got shape {tuple(x.shape)}"
        )
    return coef.view(coef.shape[0], *([1] * (x.dim() - 2)), coef.shape[1])


def _add_lowrank(output: torch.Tensor, left: torch.Tensor, coef: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """output += (left * coef_row) @ right^T, in place and in the model's dtype (one fused addmm; the
    per-row scale is applied in fp32 on the small [tokens, S*r] tensor)."""
    scaled = (left.to(torch.float32) * _row_scale(coef, left)).to(output.dtype)
    if not output.is_contiguous():
        output = output.contiguous()
    output.view(-1, output.shape[-1]).addmm_(scaled.reshape(-1, scaled.shape[-1]), right.T)
    return output


def linear_hook(coef, a, b, args, output):
    """x W^T + s_row (x B) A^T, with x B for every member in one matmul and s_row masking the row's member."""
    x = args[0]
    return _add_lowrank(output, torch.matmul(x.to(b.dtype), b), coef, a)


def embedding_hook(coef, a, b, args, output):
    """W[ids] + s_row A[ids] B^T (row `ids` of the perturbation A B^T)."""
    return _add_lowrank(output, torch.nn.functional.embedding(args[0], a), coef, b)
