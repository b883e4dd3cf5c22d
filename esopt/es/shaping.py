"""Fitness shaping: turn raw population rewards into zero-mean update coefficients."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["SHAPING_METHODS", "shape_fitness"]

SHAPING_METHODS = ("zscore", "rank")


def _centered_ranks(f: np.ndarray) -> np.ndarray:
    n = f.size
    order = np.argsort(f, kind="stable")
    sorted_f = f[order]
    ranks = np.empty(n, dtype=np.float64)
    i = 0
    while i < n:
        j = i
        while j + 1 < n and sorted_f[j + 1] == sorted_f[i]:
            j += 1
        ranks[order[i : j + 1]] = 0.5 * (i + j)  # ties share their average rank
        i = j + 1
    return ranks / (n - 1) - 0.5


def shape_fitness(fitness: Sequence[float], method: str = "zscore") -> list[float]:
    """Shape raw fitness by `method` ("zscore" or "rank"); all-equal or <2 values give all zeros."""
    if method not in SHAPING_METHODS:
        raise ValueError(f"unknown fitness shaping method {method!r}; expected one of {', '.join(SHAPING_METHODS)}")
    values = [float(x) for x in fitness]
    bad = [i for i, x in enumerate(values) if not math.isfinite(x)]
    if bad:
        raise ValueError(
            f"fitness must be finite; got non-finite value(s) at member index(es) {bad}: "
            f"{[values[i] for i in bad]}"
        )
    n = len(values)
    if n < 2:
        return [0.0] * n
    f = np.asarray(values, dtype=np.float64)
    if np.all(f == f[0]):
        return [0.0] * n
    if method == "zscore":
        std = f.std()  # population std (ddof=0)
        if not std > 0.0:
            # Distinct values whose spread underflows: treat as no signal rather than divide by 0.
            return [0.0] * n
        z = (f - f.mean()) / std
    else:
        z = _centered_ranks(f)
    return [float(x) for x in z]
