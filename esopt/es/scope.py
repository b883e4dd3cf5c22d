"""Parameter scope: which weights ES perturbs and updates (`es.scope`).

A scope is resolved from tensor names alone (and shapes), so replaying a history needs nothing but the
weights: names follow the Hugging Face conventions (`model.layers.3.self_attn.q_proj.weight`,
`transformer.h.3.mlp.c_fc.weight`, ...). Tensors outside the scope are never perturbed and never updated:
they stay bit-identical, not "+0.0".
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Mapping

import torch

from esopt.confutil import ConfigError

__all__ = ["SCOPES", "Scope", "block_index"]

SCOPES = {
    "all": "every tensor",
    "all-but-embeddings": "every tensor except the token/position embeddings and the output head",
    "linear": "the 2-D weights inside the transformer blocks (no embeddings, norms or biases)",
    "attention": "the 2-D attention weights of the blocks (q/k/v/o projections)",
    "mlp": "the 2-D MLP weights of the blocks (gate/up/down projections)",
    "last:K": "every tensor (norms and biases too) of the last K transformer blocks; when replies are scored (rollout.expected_reward) the blocks below run once per step for all members",
}

_BLOCK = re.compile(r"(?:^|\.)(?:layers|h|blocks|block|layer)\.(\d+)\.")
_EMBEDDING = re.compile(r"embed|(?:^|\.)(?:wte|wpe|lm_head)\.")
_ATTENTION = re.compile(r"\.(?:self_)?(?:attn|attention)\.")
_MLP = re.compile(r"\.(?:mlp|feed_forward|ffn)\.")


def block_index(name: str) -> int | None:
    """The transformer block a tensor belongs to (`model.layers.3.mlp...` -> 3); None outside the blocks."""
    match = _BLOCK.search(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class Scope:
    """One of SCOPES, e.g. Scope('attention') or Scope('last:4')."""

    spec: str = "all"

    def __post_init__(self) -> None:
        if self.spec in SCOPES and self.spec != "last:K":
            return
        head, _, count = str(self.spec).partition(":")
        if head != "last" or not count.isdigit() or int(count) < 1:
            raise ConfigError(f"es.scope: unknown scope {self.spec!r}; expected one of {', '.join(SCOPES)} (K >= 1)")

    @property
    def everything(self) -> bool:
        return self.spec == "all"

    def select(self, tensors: Mapping[str, torch.Tensor]) -> list[str]:
        """The names of `tensors` inside the scope, in their order; ConfigError if none is."""
        if self.everything:
            return list(tensors)
        names = tuple(tensors)
        return list(_select(self.spec, names, tuple(tensors[n].dim() for n in names)))

    def check(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """ConfigError unless the scope fits this model (it selects something; last:K has K blocks)."""
        self.select(tensors)
        if self.spec.startswith("last:"):
            blocks = {block_index(name) for name in tensors} - {None}
            if int(self.spec[5:]) > len(blocks):
                raise ConfigError(f"es.scope {self.spec}: the model has only {len(blocks)} transformer blocks")


@functools.lru_cache(maxsize=16)
def _select(spec: str, names: tuple[str, ...], dims: tuple[int, ...]) -> tuple[str, ...]:
    blocks = [block_index(name) for name in names]
    if spec == "all-but-embeddings":
        keep = [not _EMBEDDING.search(name) for name in names]
    elif spec.startswith("last:"):
        indices = sorted({b for b in blocks if b is not None})
        last = set(indices[-int(spec[5:]) :])
        keep = [b in last for b in blocks]
    else:
        pattern = {"linear": None, "attention": _ATTENTION, "mlp": _MLP}[spec]
        keep = [
            b is not None and dim == 2 and (pattern is None or bool(pattern.search(name)))
            for name, dim, b in zip(names, dims, blocks)
        ]
    selected = tuple(name for name, k in zip(names, keep) if k)
    if not selected:
        example = f" (tensor names look like {names[0]!r})" if names else ""
        raise ConfigError(f"es.scope {spec} selects no tensor of this model{example}")
    return selected
