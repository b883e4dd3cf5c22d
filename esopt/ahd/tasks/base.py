"""Automatic heuristic design (AHD) tasks: the LLM writes a heuristic function, esopt scores it.

Every evaluation of candidate code runs in ONE sandboxed subprocess
(`esopt.sandbox.call_in_sandbox`) through a trusted driver function
(`esopt.ahd.tasks.driver`). The child only returns *solutions* (tours, item
selections) or the candidate's raw outputs (priorities, heuristic matrices);
the parent validates them and computes every objective itself, so a candidate
cannot report a fake score. A crash, timeout, wrong type, illegal move or bad
matrix gives `Evaluation(valid=False, reason=...)`, never an exception.
"""

from __future__ import annotations

import abc
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from esopt.ahd.tasks.driver import CandidateError
from esopt.sandbox import Limits, call_in_sandbox

__all__ = ["AHDTask", "Evaluation", "CandidateError", "task_rng"]


@dataclass
class Evaluation:
    valid: bool
    objective: float | None = None
    """Mean objective over the instances (tour length, value, bins, set size...); None if invalid."""
    reason: str | None = None
    """Why the candidate is invalid (one line), None when valid."""
    per_instance: list = field(default_factory=list)
    duration_s: float = 0.0
    stdout: str = ""
    """What the candidate printed (truncated); useful as feedback to the LLM."""
    isolation: str | None = None
    """The sandbox containment the candidate ran under (Limits.isolation)."""


def task_rng(family: str, size: int, seed: int, index: int) -> np.random.Generator:
    """Generator of instance `index` of a task family/size at `seed`: instance i does not depend on how
    many instances are drawn, and different families/sizes never share streams."""
    salt = zlib.crc32(f"{family}:{size}".encode())
    return np.random.default_rng([int(seed), int(index), salt])


class AHDTask(abc.ABC):
    """One heuristic-design problem. Subclasses define instances, the sandbox payload and scoring."""

    name: str
    description: str
    """Task text for the LLM (what the function must do, its signature and return value)."""
    function_name: str
    signature: str
    """The function header the LLM must implement."""
    template: str
    """A simple valid example implementation (code the LLM can start from)."""
    greedy_code: str
    """The built-in baseline heuristic whose objective is `reference()["greedy"]`."""
    greedy_name: str = "greedy"
    optimum_source: str | None = None
    """What `optimum()` is (e.g. "optimum: exact DP", "near-optimal: LKH-3 (elkai)"); reports label it so."""
    sense: ClassVar[str] = "min"
    entry: ClassVar[str]
    default_instances: int = 8
    default_limits: Limits

    def __init__(self) -> None:
        self._ref_cache: dict[tuple[int, int], dict] = {}

    # ---------------------------------------------------------------- subclass hooks
    @abc.abstractmethod
    def instances(self, seed: int, n: int) -> list[dict]:
        """`n` instances, deterministic in `seed` (instance i is the same whatever n is)."""

    @abc.abstractmethod
    def _payload(self, insts: list[dict]) -> dict:
        """JSON payload for the driver function (`entry`)."""

    @abc.abstractmethod
    def _score(self, insts: list[dict], value: Any, seed: int) -> list[float]:
        """Validate the driver's answer and compute each instance's objective in the parent.
        Raise CandidateError (or ValueError) with a reason for the LLM when it is invalid."""

    def optimum(self, seed: int, n: int) -> float | None:
        """Exact or best-known objective of the instances (mean), None if unknown."""
        return None

    def extra_reference(self, seed: int, n: int) -> dict:
        return {}

    # ---------------------------------------------------------------- public API
    def evaluate(self, code: str, seed: int = 0, n_instances: int | None = None,
                 limits: Limits | None = None) -> Evaluation:
        n = self.default_instances if n_instances is None else int(n_instances)
        start = time.monotonic()
        insts = self.instances(seed, n)
        res = call_in_sandbox(code, self.entry, self._payload(insts), limits or self.default_limits)
        if not res.ok:
            return Evaluation(False, reason=res.error, duration_s=time.monotonic() - start, stdout=res.stdout,
                              isolation=res.isolation)
        try:
            per = [float(x) for x in self._score(insts, res.value, seed)]
        except (CandidateError, ValueError, KeyError, TypeError, IndexError) as e:
            return Evaluation(False, reason=str(e) or type(e).__name__,
                              duration_s=time.monotonic() - start, stdout=res.stdout, isolation=res.isolation)
        return Evaluation(True, objective=float(np.mean(per)), per_instance=per,
                          duration_s=time.monotonic() - start, stdout=res.stdout, isolation=res.isolation)

    def reference(self, seed: int = 0, n_instances: int | None = None, limits: Limits | None = None) -> dict:
        """{"greedy": objective of the built-in baseline (same evaluator), "greedy_name": which,
        "optimum": exact/best-known mean objective or None, plus task-specific extras}.
        `limits` (default: the task's) only choose how the baseline runs, not what it scores."""
        n = self.default_instances if n_instances is None else int(n_instances)
        key = (int(seed), n)
        if key not in self._ref_cache:
            ev = self.evaluate(self.greedy_code, seed=seed, n_instances=n, limits=limits)
            if not ev.valid:
                raise RuntimeError(f"{self.name}: the built-in baseline failed: {ev.reason}")
            ref = {"greedy": ev.objective, "greedy_name": self.greedy_name,
                   "greedy_per_instance": ev.per_instance, "optimum": self.optimum(seed, n),
                   "optimum_source": self.optimum_source,
                   "sense": self.sense}
            ref.update(self.extra_reference(seed, n))
            self._ref_cache[key] = ref
        return dict(self._ref_cache[key])

    def normalised_score(self, objective: float | None, seed: int = 0, n_instances: int | None = None) -> float | None:
        """Relative improvement over the baseline, higher is better: 0 = as good as the greedy
        baseline, 0.1 = 10% better (shorter tour / more value / fewer bins / larger set);
        negative when worse. None for an invalid candidate (objective None)."""
        if objective is None:
            return None
        g = self.reference(seed, n_instances)["greedy"]
        denom = abs(g) if g else 1.0
        if self.sense == "min":
            return (g - objective) / denom
        return (objective - g) / denom

    def prompt(self) -> str:
        """Task text plus the signature and a valid example, ready for an LLM."""
        return (f"{self.description}\n\nImplement:\n{self.signature}\n\n"
                f"A valid (simple) example:\n```python\n{self.template.strip()}\n```\n")

    def __repr__(self) -> str:
        return f"<AHDTask {self.name}>"
