"""Counter-based Gaussian noise: every (member seed, tensor name, chunk) pair has its own stream."""

from __future__ import annotations

import functools
import hashlib
import threading
import operator
from typing import Sequence

import torch

__all__ = ["CHUNK_NUMEL", "DEFAULT_TABLE_SIZE", "derive_seed", "tensor_noise", "noise_table", "table_noise", "member_seeds"]

# Noise is drawn in chunks of this many elements so a huge tensor never needs a second
# full-size temporary, and each chunk can be regenerated independently.
CHUNK_NUMEL = 1 << 22

_SEED_MASK = (1 << 63) - 1

# Shared noise table (OpenAI-ES style): 2**26 fp32 entries = 256 MiB, more than the largest tensor of
# SmolLM2-135M (the 28.3M-entry embedding) so every tensor has tens of millions of possible offsets.
DEFAULT_TABLE_SIZE = 1 << 26


def _encode_part(part: int | str) -> bytes:
    # A type tag and a length prefix make the encoding injective: ("ab", "c") != ("a", "bc")
    # and 1 != "1".
    if isinstance(part, str):
        tag, body = b"s", part.encode("utf-8")
    else:
        try:
            value = operator.index(part)
        except TypeError:
            raise TypeError(f"derive_seed parts must be int or str, got {type(part).__name__}") from None
        tag, body = b"i", str(value).encode("ascii")
    return tag + len(body).to_bytes(8, "little") + body


def derive_seed(*parts: int | str) -> int:
    """Hash `parts` (ints and strings) to a seed in [0, 2**63), stable across processes and machines."""
    h = hashlib.blake2b(digest_size=8, person=b"esopt-seed")
    for part in parts:
        h.update(_encode_part(part))
    return int.from_bytes(h.digest(), "little") & _SEED_MASK


def _numel(shape: Sequence[int] | torch.Size) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def tensor_noise(
    seed: int,
    name: str,
    shape: Sequence[int] | torch.Size,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Return float32 N(0, 1) noise of `shape` for tensor `name` of member `seed` (into `out` if given)."""
    shape = torch.Size(int(d) for d in shape)
    numel = _numel(shape)
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
    from esopt.es.parallel import for_each_tensor

    table = torch.empty(size, dtype=torch.float32)
    seed = derive_seed("noise-table", size)
    chunk = 1 << 22  # fixed (not CHUNK_NUMEL): the table's content must not depend on a tunable

    def fill(start: int) -> None:
        gen = torch.Generator().manual_seed(derive_seed(seed, start))
        torch.randn(min(chunk, size - start), generator=gen, dtype=torch.float32, out=table[start : start + chunk])

    for_each_tensor(fill, range(0, size, chunk))
    return table


def table_noise(seed: int, name: str, shape: Sequence[int] | torch.Size, size: int) -> torch.Tensor:
    """Noise of `shape` for tensor `name` of member `seed` as a read-only view of the shared table: the
    slice at an offset hashed from (seed, name). Slices at different offsets are uncorrelated, and reading
    one costs a memory pass instead of generating fresh normals (OpenAI-ES's shared noise table)."""
    shape = torch.Size(int(d) for d in shape)
    numel = _numel(shape)
    if numel > size:
        raise ValueError(
            f"tensor {name!r} has {numel} elements but the noise table only {size}; raise es.table_size to at least {numel}"
        )
    offset = derive_seed(seed, name, "table-offset") % (size - numel + 1)
    return noise_table(size)[offset : offset + numel].view(shape)


def member_seeds(run_seed: int, step: int, count: int) -> list[int]:
    """Return `count` distinct deterministic seeds for the members of step `step` of run `run_seed`."""
    if count < 0:
        raise ValueError(f"member_seeds count must be >= 0, got {count}")
    seeds: list[int] = []
    seen: set[int] = set()
    i = 0
    while len(seeds) < count:
        s = derive_seed("member", run_seed, step, i)
        i += 1
        # A 63-bit collision is astronomically unlikely, but distinctness is part of the contract.
        if s not in seen:
            seen.add(s)
            seeds.append(s)
    return seeds


def subspace_mask(partition_seed: int, name: str, shape: Sequence[int] | torch.Size, subspace: int, subspaces: int) -> torch.Tensor:
    """Boolean mask of the elements of tensor `name` that fall in `subspace` of a random partition of
    every parameter index into `subspaces` disjoint parts (CoPES); the partition is fixed by its seed."""
    shape = torch.Size(int(d) for d in shape)
    gen = torch.Generator().manual_seed(derive_seed(partition_seed, name, "partition"))
    labels = torch.randint(0, subspaces, shape, generator=gen, dtype=torch.int8)
    return labels == subspace
