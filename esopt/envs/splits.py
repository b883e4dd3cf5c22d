"""Split assignment by a stable hash of a task's content, so train and held-out tasks never overlap
whatever seeds are used (the tool-using envs: math, countdown, docqa; sudoku and web hash with `stable_int`)."""

from __future__ import annotations

import hashlib

from esopt.envs.base import held_out_split

EVAL_BUCKETS = 2  # one task in EVAL_BUCKETS (by content hash) belongs to the eval split


def stable_int(text: str) -> int:
    """A 64-bit integer from a SHA-256 of `text` (stable across processes and machines)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "replace")).digest()[:8], "big")


def hash_split(namespace: str, key: str, buckets: int = EVAL_BUCKETS) -> str:
    """The split ("train", "val" or "eval") that a task with content `key` belongs to."""
    if stable_int(f"esopt-split|{namespace}|{key}") % buckets:
        return "train"
    return held_out_split(f"{namespace}|{key}")


def short_hash(text: str, n: int = 10) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:n]

