"""Full-rank noise drawn fresh per member: every (member seed, tensor name, chunk) has its own Gaussian stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from esopt.es.noise.base import Noise, Shape, as_shape
from esopt.es.seeds import derive_seed

__all__ = ["CHUNK_NUMEL", "FullNoise", "tensor_noise"]

# Noise is drawn in chunks of this many elements so a huge tensor never needs a second
# full-size temporary, and each chunk can be regenerated independently.
CHUNK_NUMEL = 1 << 22


def tensor_noise(seed: int, name: str, shape: Shape, out: torch.Tensor | None = None) -> torch.Tensor:
    """Return float32 N(0, 1) noise of `shape` for tensor `name` of member `seed` (into `out` if given)."""
    shape = as_shape(shape)
    if out is not None:
        if out.dtype != torch.float32:
            raise TypeError(f"tensor_noise out= must be float32, got {out.dtype}")
        if out.shape != shape:
            raise ValueError(f"tensor_noise out= has shape {tuple(out.shape)}, expected {tuple(shape)}")
    # Generate on CPU: torch's CPU generator is the one whose streams are reproducible
    # everywhere; a non-CPU or non-contiguous `out` is filled by one copy at the end.
    direct = out is not None and out.device.type == "cpu" and out.is_contiguous()
    target = out if direct else torch.empty(shape, dtype=torch.float32)
    flat = target.view(-1)
    numel = flat.numel()
    chunk = int(CHUNK_NUMEL)  # read at call time so tests can shrink it
    if chunk < 1:
        raise ValueError(f"CHUNK_NUMEL must be >= 1, got {chunk}")
    for k, start in enumerate(range(0, numel, chunk)):
        stop = min(start + chunk, numel)
        gen = torch.Generator().manual_seed(derive_seed(seed, name, k))
        torch.randn(stop - start, generator=gen, dtype=torch.float32, out=flat[start:stop])
    if out is None:
        return target
    if not direct:
        out.copy_(target)
    return out


@dataclass(frozen=True)
class FullNoise(Noise):
    """i.i.d. N(0, 1) for every weight, drawn from per-member counter-based streams (`es.noise: full`)."""

    kind = "full"

    @classmethod
    def from_config(cls, config: Any) -> "FullNoise":
        return cls()

    def sample(self, seed: int, name: str, shape: Shape, out: torch.Tensor | None = None) -> torch.Tensor:
        return tensor_noise(seed, name, shape, out=out)
