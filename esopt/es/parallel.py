"""Per-tensor work spread over threads: noise generation and adds release the GIL, and every
tensor's result depends only on (seed, name), so the outcome is the same as a serial loop.
While the threads run, torch's own intra-op parallelism is set to one thread (see for_each_tensor)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, TypeVar

import threading

import torch

T = TypeVar("T")
_POOLS: dict[int, ThreadPoolExecutor] = {}
_INSIDE = threading.local()


def for_each_tensor(fn: Callable[[T], None], items: Iterable[T]) -> None:
    """Call fn(item) for every item, on up to torch.get_num_threads() threads; re-raises the first error.
    A call from inside one of the pool's tasks (e.g. the noise table built lazily during a perturbation)
    runs serially: waiting on the pool from its own workers would deadlock."""
    workers = max(1, torch.get_num_threads())
    items = list(items)
    if workers == 1 or len(items) < 2 or getattr(_INSIDE, "active", False):
        for item in items:
            fn(item)
        return
    if workers not in _POOLS:
        _POOLS[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="esopt-tensor")

    def task(item: T) -> None:
        _INSIDE.active = True
        try:
            fn(item)
        finally:
            _INSIDE.active = False

    # The pool's threads run torch ops single-threaded: an intra-op parallel op called from a second
    # thread makes OpenMP start another thread team for it, and those extra teams measurably slowed
    # every later generate call of the process (~20% on 2 cores), long after this loop had finished.
    torch.set_num_threads(1)
    try:
        for future in [_POOLS[workers].submit(task, item) for item in items]:
            future.result()
    finally:
        torch.set_num_threads(workers)
