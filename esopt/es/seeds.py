"""Seeds derived by hashing: every (run, step, member, tensor, chunk, ...) gets its own stable seed, so any
process regenerates any noise from a few integers and names."""

from __future__ import annotations

import hashlib
import operator

__all__ = ["derive_seed", "member_seeds"]

_SEED_MASK = (1 << 63) - 1


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
