"""Who writes the next prompts: independent sampling (one fixed prompt) or EoH (a population of the best
heuristics, grown by its five operators)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from esopt.ahd.candidates import Candidate
from esopt.ahd.config import EoHConfig
from esopt.ahd.prompts import OPERATOR_PARENTS, operator_prompt, sample_prompt, select_parents


@dataclass
class Plan:
    operator: str
    parents: list  # Candidates
    prompt: str


class SampleProposer:
    """Independent sampling: the same fixed prompt for every proposal."""

    def __init__(self, task):
        self.prompt = sample_prompt(task.prompt(), task.function_name)

    def plan(self, batch: int, n: int, rng: random.Random) -> list[Plan]:
        return [Plan("sample", [], self.prompt) for _ in range(n)]

    def observe(self, candidates: list[Candidate]) -> None:
        pass

    def state(self) -> dict:
        return {}


class EoHProposer:
    """EoH: a population of the best P distinct valid heuristics, grown by the five operators."""

    def __init__(self, task, config: EoHConfig):
        self.task = task
        self.config = config
        self.population: list[Candidate] = []  # best first
        self._cursor = 0

    def _sorted(self, cands: list[Candidate]) -> list[Candidate]:
        sign = 1.0 if self.task.sense == "min" else -1.0
        return sorted(cands, key=lambda c: (sign * c.objective, c.index))

    def _prompt(self, operator: str, parents: list[Candidate]) -> str:
        t = self.task
        return operator_prompt(operator, t.prompt(), t.description, t.signature, t.function_name, t.sense,
                               [p.as_parent() for p in parents])

    def plan(self, batch: int, n: int, rng: random.Random) -> list[Plan]:
        plans = []
        for _ in range(n):
            op = "i1" if not self.population else self.config.operators[self._cursor % len(self.config.operators)]
            if self.population:
                self._cursor += 1
            need = OPERATOR_PARENTS[op]
            if need is None:
                need = min(self.config.parents, len(self.population))
                if need < 2:  # a crossover needs two parents: mutate the one we have instead
                    op, need = "m1", 1
            parents = select_parents(self.population, need, rng) if need else []
            plans.append(Plan(op, parents, self._prompt(op, parents)))
        return plans

    def observe(self, candidates: list[Candidate]) -> None:
        new = [c for c in candidates if c.valid and c.duplicate is None]
        self.population = self._sorted(self.population + new)[: self.config.pop_size]

    def state(self) -> dict:
        return {"population": [c.index for c in self.population],
                "population_objectives": [c.objective for c in self.population]}
