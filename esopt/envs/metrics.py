"""Answer-matching and sampling metrics shared by the envs and the evaluators.

- `anls(pred, golds)`: Average Normalized Levenshtein Similarity for one question, as in DocVQA
  (Biten et al., 2019): for each gold answer, NL = edit distance / max(len(pred), len(gold)) on
  normalised strings (lower-cased, whitespace collapsed); the score is 1 - NL when NL < tau
  (tau = 0.5), else 0; the best gold counts. Averaging over questions gives the dataset ANLS.
- `exact_match(pred, golds)`: 1.0 when the normalised prediction equals a normalised gold.
- `mean_at_k`, `max_at_k`: per-task mean / best of the k sampled scores, averaged over tasks.
- `pass_at_k`: the unbiased estimator of Chen et al. (2021, Codex): with n samples of which c
  succeed, pass@k = 1 - C(n-c, k) / C(n, k), averaged over tasks; equals "any of the k
  succeeded" when n == k.
"""

from __future__ import annotations

import math
import re
from typing import Iterable, Sequence

ANLS_THRESHOLD = 0.5


def normalize_text(s: str) -> str:
    """Lower-case, strip, collapse runs of whitespace to one space (the DocVQA normalisation)."""
    return " ".join(str(s).strip().lower().split())


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions each cost 1)."""
    if a == b:
        return 0
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _golds(gold: str | Iterable[str]) -> list[str]:
    if isinstance(gold, str):
        return [gold]
    out = [str(g) for g in gold]
    if not out:
        raise ValueError("at least one gold answer is needed")
    return out


def anls(pred: str | None, gold: str | Iterable[str], threshold: float = ANLS_THRESHOLD) -> float:
    """ANLS of one prediction against one or more gold answers (the best gold counts).

    A similarity of 1 - NL is kept only when NL < `threshold`; otherwise the score is 0. A missing
    prediction (None) scores 0. Two empty strings are identical (score 1)."""
    if pred is None:
        return 0.0
    p = normalize_text(pred)
    best = 0.0
    for g in _golds(gold):
        gn = normalize_text(g)
        length = max(len(p), len(gn))
        if length == 0:
            return 1.0
        if abs(len(p) - len(gn)) / length >= threshold:
            continue  # the distance is at least the length difference: scores 0, skip the O(n*m) work
        nl = levenshtein(p, gn) / length
        score = 1.0 - nl if nl < threshold else 0.0
        best = max(best, score)
    return best


_EDGE_PUNCT = re.compile(r"^[\s\"'`.,;:]+|[\s\"'`.,;:]+$")


def normalize_exact(s: str) -> str:
    """`normalize_text` plus stripping quotes and punctuation at the two ends."""
    return _EDGE_PUNCT.sub("", normalize_text(s))


def exact_match(pred: str | None, gold: str | Iterable[str]) -> float:
    """1.0 when the prediction equals one of the golds after `normalize_exact`, else 0.0."""
    if pred is None:
        return 0.0
    p = normalize_exact(pred)
    return 1.0 if any(p == normalize_exact(g) for g in _golds(gold)) else 0.0


# ----------------------------------------------------------------------------------------------
# Metrics over k samples per task
# ----------------------------------------------------------------------------------------------


def _rows(values_per_task: Sequence[Sequence[float]], name: str) -> list[list[float]]:
    rows = [list(r) for r in values_per_task]
    if not rows:
        raise ValueError(f"{name}: no tasks")
    if any(len(r) == 0 for r in rows):
        raise ValueError(f"{name}: every task needs at least one sample")
    return rows


def mean_at_k(scores_per_task: Sequence[Sequence[float]]) -> float:
    """Mean over tasks of the mean score of each task's samples (mean@k)."""
    rows = _rows(scores_per_task, "mean_at_k")
    return sum(sum(map(float, r)) / len(r) for r in rows) / len(rows)


def max_at_k(scores_per_task: Sequence[Sequence[float]], k: int | None = None) -> float:
    """Mean over tasks of the best score among each task's first `k` samples (all when None)."""
    rows = _rows(scores_per_task, "max_at_k")
    if k is not None:
        if k < 1 or any(len(r) < k for r in rows):
            raise ValueError(f"max_at_k: k={k} needs 1 <= k <= samples per task")
        rows = [r[:k] for r in rows]
    return sum(max(map(float, r)) for r in rows) / len(rows)


def pass_at_k_single(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with `n` samples, `c` of them successful: 1 - C(n-c,k)/C(n,k),
    computed as a numerically stable product."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k(
    success_per_task_samples: Sequence[Sequence[bool | float]],
    k: int,
    threshold: float | None = None,
) -> float:
    """Mean over tasks of the unbiased pass@k. Each task gives its n >= k samples as successes
    (bools or 0/1), or as scores when `threshold` is set (success = score >= threshold).
    With n == k this is the fraction of tasks where any of the k samples succeeded."""
    rows = _rows(success_per_task_samples, "pass_at_k")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"pass_at_k: k must be a positive integer, got {k!r}")
    total = 0.0
    for r in rows:
        if len(r) < k:
            raise ValueError(f"pass_at_k: a task has {len(r)} samples, fewer than k={k}")
        ok = [(float(v) >= threshold) if threshold is not None else bool(v) for v in r]
        total += pass_at_k_single(len(r), sum(ok), k)
    return total / len(rows)


def _comb_pass_at_k(n: int, c: int, k: int) -> float:
    """Reference formula with exact binomials (used by the tests)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# ----------------------------------------------------------------------------------------------
# Uncertainty of rates and of paired gains
# ----------------------------------------------------------------------------------------------

Z95 = 1.959963984540054


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval (95% by default) of a rate observed as `successes` out of `n`.

    Unlike the normal approximation it stays inside [0, 1] and is honest at rates near 0 or 1 and at
    small n, where ES evaluations often sit. `successes` may be fractional (a mean of graded scores)."""
    if n <= 0:
        return (0.0, 1.0)
    p = min(1.0, max(0.0, successes / n))
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def paired_difference(
    after: Sequence[float], before: Sequence[float], resamples: int = 10_000, seed: int = 0
) -> dict[str, float]:
    """Mean of after[i] - before[i] over the same tasks, with a 95% paired-bootstrap interval and a
    two-sided sign-flip permutation p-value (no difference: each task's pair is exchangeable)."""
    import random

    if len(after) != len(before) or not after:
        raise ValueError(f"paired_difference needs two equally long non-empty lists, got {len(after)} and {len(before)}")
    diffs = [float(a) - float(b) for a, b in zip(after, before)]
    n = len(diffs)
    observed = math.fsum(diffs) / n
    rng = random.Random(seed)
    means = sorted(math.fsum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    low, high = means[int(0.025 * resamples)], means[min(resamples - 1, int(0.975 * resamples))]
    nonzero = [d for d in diffs if d]
    extreme = sum(
        abs(math.fsum(d if rng.random() < 0.5 else -d for d in nonzero)) >= abs(observed) * n - 1e-12
        for _ in range(resamples)
    )
    return {"diff": observed, "low": low, "high": high, "p": (extreme + 1) / (resamples + 1), "n": n}
