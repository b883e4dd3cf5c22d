"""Random partitions of every parameter index into disjoint subspaces (CoPES): a member perturbs only the
elements of its subspace. A partition is fixed by its seed, so it is regenerated wherever it is needed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from esopt.es.noise.base import Shape, as_shape, is_int
from esopt.es.seeds import derive_seed

__all__ = ["Partition", "subspace_mask"]


def subspace_mask(partition_seed: int, name: str, shape: Shape, subspace: int, subspaces: int) -> torch.Tensor:
    """Boolean mask of the elements of tensor `name` that fall in `subspace` of the partition of every
    parameter index into `subspaces` disjoint parts fixed by `partition_seed`."""
    shape = as_shape(shape)
    gen = torch.Generator().manual_seed(derive_seed(partition_seed, name, "partition"))
    labels = torch.randint(0, subspaces, shape, generator=gen, dtype=torch.int8)
    return labels == subspace


@dataclass(frozen=True)
class Partition:
    """The partition of all weights into `parts` subspaces drawn from `seed`."""

    seed: int
    parts: int

    def __post_init__(self) -> None:
        if not is_int(self.parts) or self.parts < 1:
            raise ValueError(f"a partition needs an integer number of parts >= 1, got {self.parts!r}")

    def mask(self, name: str, shape: Shape, part: int) -> torch.Tensor:
        return subspace_mask(self.seed, name, shape, part, self.parts)
