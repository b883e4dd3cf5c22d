"""Per-tensor work spread over threads: noise generation and adds release the GIL, and every
tensor's result depends only on (seed, name), so the outcome is the same as a serial loop."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, TypeVar

import torch

T = TypeVar("T")
_POOLS: dict[int, ThreadPoolExecutor] = {}


def for_each_tensor(fn: Callable[[T], None], items: Iterable[T]) -> None:
    """Call fn(item) for every item, on up to torch.get_num_threads() threads; re-raises the first error."""
    workers = max(1, torch.get_num_threads())
    items = list(items)
    if workers == 1 or len(items) < 2:
        for item in items:
            fn(item)
        return
    if workers not in _POOLS:
        _POOLS[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="esopt-tensor")
    for future in [_POOLS[workers].submit(fn, item) for item in items]:
        future.result()
