"""Shared noise table (OpenAI-ES): each tensor's noise is a slice of one fixed N(0, 1) table, at an offset
hashed from (member seed, tensor name). Slices at different offsets are uncorrelated, and reading one
costs a memory pass instead of generating fresh normals."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from esopt.confutil import ConfigError
from esopt.es.noise.base import Noise, Shape, as_shape, is_int
from esopt.es.parallel import for_each_tensor
from esopt.es.seeds import derive_seed

__all__ = ["DEFAULT_TABLE_SIZE", "TableNoise", "noise_table", "table_noise"]

# 2**26 fp32 entries = 256 MiB, more than the largest tensor of SmolLM2-135M (the 28.3M-entry
# embedding) so every tensor has tens of millions of possible offsets.
DEFAULT_TABLE_SIZE = 1 << 26

_TABLE_LOCK = threading.Lock()


def noise_table(size: int) -> torch.Tensor:
    """The shared table of `size` float32 N(0, 1) entries; the same in every process (fixed seed per size).
    Built once, on first use (the lock keeps threads perturbing different tensors from building it twice)."""
    with _TABLE_LOCK:
        return _build_table(size)


@functools.lru_cache(maxsize=1)
def _build_table(size: int) -> torch.Tensor:
    if size < 1:
        raise ValueError(f"noise table size must be >= 1, got {size}")
    table = torch.empty(size, dtype=torch.float32)
    seed = derive_seed("noise-table", size)
    chunk = 1 << 22  # fixed (not CHUNK_NUMEL): the table's content must not depend on a tunable

    def fill(start: int) -> None:
        gen = torch.Generator().manual_seed(derive_seed(seed, start))
        torch.randn(min(chunk, size - start), generator=gen, dtype=torch.float32, out=table[start : start + chunk])

    for_each_tensor(fill, range(0, size, chunk))
    return table


def table_noise(seed: int, name: str, shape: Shape, size: int) -> torch.Tensor:
    """Noise of `shape` for tensor `name` of member `seed`: a read-only view of the table slice at an
    offset hashed from (seed, name)."""
    shape = as_shape(shape)
    numel = shape.numel()
    if numel > size:
        raise ValueError(
            f"tensor {name!r} has {numel} elements but the noise table only {size}; raise es.table_size to at least {numel}"
        )
    offset = derive_seed(seed, name, "table-offset") % (size - numel + 1)
    return noise_table(size)[offset : offset + numel].view(shape)


@dataclass(frozen=True)
class TableNoise(Noise):
    """Full-rank noise read from the shared table of `size` entries (`es.noise: table`)."""

    size: int = DEFAULT_TABLE_SIZE

    kind = "table"
    draws_into_buffer = False

    def __post_init__(self) -> None:
        if not is_int(self.size) or self.size < 1:
            raise ConfigError(f"es.table_size must be an integer >= 1, got {self.size!r}")

    @classmethod
    def from_config(cls, config: Any) -> "TableNoise":
        return cls(size=config.table_size)

    def sample(self, seed: int, name: str, shape: Shape, out: torch.Tensor | None = None) -> torch.Tensor:
        return table_noise(seed, name, shape, self.size)

    def prepare(self, tensors: Mapping[str, torch.Tensor]) -> None:
        largest = max((t.numel() for t in tensors.values()), default=0)
        if largest > self.size:
            raise ConfigError(
                f"es.table_size ({self.size}) is smaller than the model's largest tensor "
                f"({largest} elements); raise es.table_size to at least {largest}"
            )
        noise_table(self.size)  # built now (~0.2 s), not inside the first step's perturbation
