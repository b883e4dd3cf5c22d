"""The noise interface: how member `seed`'s direction eps(seed, name) for one tensor is drawn.

A noise kind is a frozen dataclass (its fields are its settings, e.g. a rank), so it is hashable,
compares by value, and a Member or an Update carries it as one spec object. Everything a kind draws
is a pure function of (seed, tensor name, shape, settings): any process regenerates it, and an
Update replays it bit for bit. A new kind is one file in this package plus one line in its
`__init__`.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch

__all__ = ["Noise", "Shape", "as_shape", "is_int"]

Shape = Sequence[int] | torch.Size


def as_shape(shape: Shape) -> torch.Size:
    return torch.Size(int(d) for d in shape)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Noise(abc.ABC):
    """One noise kind. Subclasses are frozen dataclasses registered in `esopt.es.noise.NOISE_KINDS`."""

    kind: ClassVar[str]
    """The name in configs (`es.noise`) and in history records."""
    partitionable: ClassVar[bool] = True
    """Whether masking eps to a CoPES subspace keeps the kind's meaning (a masked A B^T is no longer low-rank)."""
    draws_into_buffer: ClassVar[bool] = True
    """Whether `sample(..., out=)` writes into `out` (False: it returns a read-only view of shared memory)."""

    @classmethod
    @abc.abstractmethod
    def from_config(cls, config: Any) -> "Noise":
        """The spec for an ESConfig whose `noise` is this kind (raises ConfigError naming the bad es.* field)."""

    def perturbs(self, shape: Shape) -> bool:
        """Whether a tensor of `shape` gets noise at all (tensors that do not are never perturbed nor updated)."""
        return True

    @abc.abstractmethod
    def sample(self, seed: int, name: str, shape: Shape, out: torch.Tensor | None = None) -> torch.Tensor:
        """float32 eps(seed, name) of `shape` (unit variance per entry); treat the result as read-only."""

    def direction(
        self,
        terms: Sequence[tuple[int, float]],
        name: str,
        shape: Shape,
        *,
        device: torch.device | str | None = None,
        mask: Callable[[int], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """float32 sum_k c_k * eps(seed_k, name) over `terms` (seed_k, c_k), added in order (zero c_k skipped).
        `mask(k)` (CoPES): the boolean element mask term k is restricted to."""
        shape = as_shape(shape)
        direction = torch.zeros(shape, dtype=torch.float32, device=device)
        # Fresh noise is drawn on CPU into one buffer reused per term.
        buffer = torch.empty(shape, dtype=torch.float32) if self.draws_into_buffer else None
        for k, (seed, coefficient) in enumerate(terms):
            if coefficient == 0.0:
                continue
            eps = self.sample(seed, name, shape, out=buffer)
            if mask is not None:
                eps = eps * mask(k)  # out of place: eps may be a view of shared memory
            direction.add_(eps.to(direction.device), alpha=float(coefficient))
        return direction

    def prepare(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Check that this noise fits these tensors and build shared state ahead of the first step."""

    def to_json(self) -> dict:
        return {"kind": self.kind, **dataclasses.asdict(self)}  # type: ignore[call-overload]

