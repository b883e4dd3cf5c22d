"""A proposal (`Candidate`) and how proposals are scored: extracted, evaluated in the sandbox once per
distinct code, and flagged as duplicates (`CandidateEvaluator`)."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from esopt.ahd.prompts import Parent, normalise_code


@dataclass
class Candidate:
    """One proposal: what was asked, what came back, how it scored."""

    index: int
    batch: int
    operator: str
    parents: list = field(default_factory=list)
    """Candidate indices of the parents shown in the prompt."""
    thought: str = ""
    code: str | None = None
    reply: str = ""
    valid: bool = False
    objective: float | None = None
    normalised: float | None = None
    """task.normalised_score(objective): relative improvement over the greedy baseline."""
    reason: str | None = None
    per_instance: list = field(default_factory=list)
    member: dict | None = None
    """The ES member that wrote it (index, seed, sigma, sign); None for the baselines."""
    fitness: float | None = None
    """The ES fitness it gave its member (co-evolution only)."""
    duplicate: str | None = None
    """'code' (same normalised code as an earlier candidate, not re-evaluated) or 'objective'
    (same per-instance objectives as an earlier candidate); duplicates never enter the EoH population."""
    duplicate_of: int | None = None
    gen_seed: int = 0
    eval_s: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def as_parent(self) -> Parent:
        return Parent(self.thought, self.code or "", float(self.objective))


def _objective_key(per_instance: list, objective: float) -> tuple:
    values = per_instance or [objective]
    return tuple(f"{float(x):.10g}" for x in values)


class CandidateEvaluator:
    """Extracts and evaluates candidates, caching by normalised code and flagging duplicates."""

    def __init__(self, task, eval_seed: int, n_instances: int | None, workers: int, limits=None):
        self.task = task
        self.limits = limits
        """Sandbox limits of every evaluation (None: the task's defaults)."""
        self.seed = eval_seed
        self.n = n_instances
        self.workers = workers
        self._by_code: dict[str, int] = {}
        self._by_objective: dict[tuple, int] = {}
        self._results: dict[int, Any] = {}

    def _evaluate(self, code: str):
        from esopt.ahd.tasks import Evaluation

        try:
            return self.task.evaluate(code, seed=self.seed, n_instances=self.n, limits=self.limits)
        except Exception as e:  # the evaluator itself failed: record it, never silently
            return Evaluation(False, reason=f"evaluator error: {type(e).__name__}: {e}")

    def evaluate(self, candidates: list[Candidate]) -> None:
        """Fill valid/objective/reason/normalised/duplicate of each candidate (in order)."""
        fresh: dict[str, Candidate] = {}
        keys: dict[int, str] = {}
        for cand in candidates:
            if cand.code is None:
                continue
            key = normalise_code(cand.code)
            keys[cand.index] = key
            if key in self._by_code or key in fresh:
                continue
            fresh[key] = cand
        todo = list(fresh.items())
        if todo:
            with ThreadPoolExecutor(max_workers=min(self.workers, len(todo))) as pool:
                results = list(pool.map(lambda kv: self._evaluate(kv[1].code), todo))
            for (key, cand), ev in zip(todo, results):
                self._by_code[key] = cand.index
                self._results[cand.index] = ev
        for cand in candidates:
            if cand.code is None:
                continue
            first = self._by_code[keys[cand.index]]
            ev = self._results[first]
            cand.valid, cand.reason, cand.eval_s = bool(ev.valid), ev.reason, ev.duration_s
            cand.objective = float(ev.objective) if ev.valid else None
            cand.per_instance = [float(x) for x in ev.per_instance]
            if first != cand.index:
                cand.duplicate, cand.duplicate_of, cand.eval_s = "code", first, 0.0
            if cand.valid:
                cand.normalised = self.task.normalised_score(cand.objective, self.seed, self.n)
                if cand.duplicate is None:
                    okey = _objective_key(cand.per_instance, cand.objective)
                    if okey in self._by_objective:
                        cand.duplicate, cand.duplicate_of = "objective", self._by_objective[okey]
                    else:
                        self._by_objective[okey] = cand.index
