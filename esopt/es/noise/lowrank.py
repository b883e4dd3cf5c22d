"""Low-rank (EGGROLL) noise: eps for a matrix W (m x n) is A B^T / sqrt(r), A (m x r), B (n x r).

Every factor column is i.i.d. N(0, 1), drawn from its own counter-based stream keyed by (member
seed, tensor name, factor, column), so any process regenerates a member's factors from its seed alone. The
1/sqrt(r) makes each entry of A B^T / sqrt(r) unit-variance, so sigma means the same as with
full-rank noise. Rank r's factors are the first r columns of rank r+1's: a larger rank only adds
directions.

A population shares one base weight: the perturbed layer computes x W^T + s (x B) A^T, and the
factors of many members are stacked side by side ([m, S*r] and [n, S*r], member slot s owning
columns s*r..s*r+r-1) so one matmul serves them all. The ES update is formed the same way:
sum_i c_i A_i B_i^T / sqrt(r) = (A diag(c) / sqrt(r)) B^T, one [m, G*r] @ [G*r, n] matmul per
matrix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from esopt.confutil import ConfigError
from esopt.es.noise.base import Noise, Shape, as_shape, is_int
from esopt.es.noise.full import tensor_noise
from esopt.es.seeds import derive_seed

__all__ = [
    "LOWRANK_VECTORS",
    "LowRankNoise",
    "is_matrix",
    "lowrank_factors",
    "stacked_factors",
    "lowrank_perturbation",
    "lowrank_direction",
]

LOWRANK_VECTORS = ("frozen", "full")


def is_matrix(shape: Shape) -> bool:
    """Whether a tensor of `shape` gets low-rank noise (2-D weights); other tensors are 'vectors'."""
    return len(shape) == 2


def _factor(seed: int, name: str, which: str, rank: int, rows: int) -> torch.Tensor:
    # [rank, rows]: factor column j has its own stream, so rank r's factors are a prefix of rank r+1's.
    out = torch.empty(rank, rows, dtype=torch.float32)
    for j in range(rank):
        gen = torch.Generator().manual_seed(derive_seed(seed, name, "lowrank", which, j))
        torch.randn(rows, generator=gen, dtype=torch.float32, out=out[j])
    return out


def _check(shape: Shape, rank: int) -> tuple[int, int]:
    if not is_matrix(shape):
        raise ValueError(f"low-rank noise needs a 2-D tensor, got shape {tuple(shape)}")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"low-rank noise rank must be an integer >= 1, got {rank!r}")
    return int(shape[0]), int(shape[1])


def lowrank_factors(seed: int, name: str, shape: Shape, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [m, r], B [n, r]): member `seed`'s float32 N(0, 1) factors for the matrix `name` of `shape` (m, n).
    Unscaled: the perturbation direction is A B^T / sqrt(r)."""
    m, n = _check(shape, rank)
    return _factor(seed, name, "A", rank, m).T, _factor(seed, name, "B", rank, n).T


def stacked_factors(
    seeds: Sequence[int], name: str, shape: Shape, rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [m, S*r], B [n, S*r]) with the factors of seeds[s] in columns s*r .. s*r+r-1 (contiguous)."""
    m, n = _check(shape, rank)
    a = torch.empty(len(seeds) * rank, m, dtype=torch.float32)
    b = torch.empty(len(seeds) * rank, n, dtype=torch.float32)
    for s, seed in enumerate(seeds):
        a[s * rank : (s + 1) * rank] = _factor(seed, name, "A", rank, m)
        b[s * rank : (s + 1) * rank] = _factor(seed, name, "B", rank, n)
    return a.T.contiguous(), b.T.contiguous()


def lowrank_perturbation(seed: int, name: str, shape: Shape, rank: int) -> torch.Tensor:
    """The materialised float32 noise A B^T / sqrt(r) of member `seed` for matrix `name` (unit-variance entries)."""
    return lowrank_direction([(seed, 1.0)], name, shape, rank)


def lowrank_direction(
    coefficients: Sequence[tuple[int, float]],
    name: str,
    shape: Shape,
    rank: int,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """float32 sum_i c_i A_i B_i^T / sqrt(r) over (seed_i, c_i), as one [m, S*r] @ [S*r, n] matmul.

    Deterministic for a given input on a given machine (the same code path runs live and in replay).
    """
    m, n = _check(shape, rank)
    pairs = [(int(s), float(c)) for s, c in coefficients if float(c) != 0.0]
    if not pairs:
        return torch.zeros(m, n, dtype=torch.float32, device=device)
    a, b = stacked_factors([s for s, _ in pairs], name, (m, n), rank)
    scale = torch.tensor([c / math.sqrt(rank) for _, c in pairs], dtype=torch.float32).repeat_interleave(rank)
    a.mul_(scale)  # column s*r+j scaled by c_s / sqrt(r)
    return torch.matmul(a.to(device), b.to(device).T)


@dataclass(frozen=True)
class LowRankNoise(Noise):
    """EGGROLL (`es.noise: lowrank`): each 2-D weight moves along A B^T / sqrt(rank); `vectors` says what
    happens to the other tensors (norm weights, biases): 'frozen' (never perturbed nor updated, which keeps
    population batching possible) or 'full' (full-rank noise)."""

    rank: int = 1
    vectors: str = "frozen"

    kind = "lowrank"
    partitionable = False  # a CoPES mask would make A B^T full-rank

    def __post_init__(self) -> None:
        if not is_int(self.rank) or self.rank < 1:
            raise ConfigError(f"es.rank must be an integer >= 1, got {self.rank!r}")
        if self.vectors not in LOWRANK_VECTORS:
            raise ConfigError(f"es.lowrank_vectors: unknown value {self.vectors!r}; expected one of {', '.join(LOWRANK_VECTORS)}")

    @classmethod
    def from_config(cls, config: Any) -> "LowRankNoise":
        return cls(rank=config.rank, vectors=config.lowrank_vectors)

    def perturbs(self, shape: Shape) -> bool:
        return is_matrix(shape) or self.vectors == "full"

    def sample(self, seed: int, name: str, shape: Shape, out: torch.Tensor | None = None) -> torch.Tensor:
        if is_matrix(shape):
            return lowrank_perturbation(seed, name, shape, self.rank)
        if self.vectors == "frozen":
            raise ValueError(f"low-rank noise with frozen vectors does not perturb {name!r} (shape {tuple(shape)})")
        return tensor_noise(seed, name, shape, out=out)

    def direction(
        self,
        terms: Sequence[tuple[int, float]],
        name: str,
        shape: Shape,
        *,
        device: torch.device | str | None = None,
        mask: Callable[[int], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Matrices: one [m, S*r] @ [S*r, n] matmul over all terms; other tensors: full-rank noise
        (vectors 'full') or zero (frozen)."""
        if mask is not None:
            raise ValueError("low-rank noise cannot be restricted to CoPES subspaces")
        shape = as_shape(shape)
        if is_matrix(shape):
            return lowrank_direction(terms, name, shape, self.rank, device=device)
        if self.vectors == "frozen":
            return torch.zeros(shape, dtype=torch.float32, device=device)
        return super().direction(terms, name, shape, device=device)
