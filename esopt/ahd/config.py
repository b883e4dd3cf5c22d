"""The config of an AHD run: task, method, proposal budget, the proposal model and its ES settings."""

from __future__ import annotations

import math
from dataclasses import dataclass

from esopt.ahd.prompts import EOH_OPERATORS
from esopt.confutil import Config, ConfigError, opt
from esopt.es import ESConfig
from esopt.policy.base import SamplingConfig
from esopt.policy.config import ModelConfig
from esopt.runconfig import RunConfig
from esopt.sandbox import ISOLATIONS

METHODS = ("sample", "eoh", "agentic-esopt+sample", "agentic-esopt+eoh")


def _default_sampling() -> SamplingConfig:
    return SamplingConfig(temperature=0.8, top_p=0.95, top_k=0, max_new_tokens=320, stop=[])


def _default_es() -> ESConfig:
    return ESConfig(strategy="agentic-esopt", population=8, sigma=1e-3, sigma_final=1e-7, alpha=5e-4)


@dataclass
class EoHConfig(Config):
    """Evolution of Heuristics settings."""

    pop_size: int = opt(4, "P: heuristics kept in the population (the best by objective, no duplicates)")
    parents: int = opt(2, "parents shown to the crossover operators e1 and e2 (m1 and m2 use one)")
    operators: list = opt(["e1", "e2", "m1", "m2"], "operators cycled through after initialisation (i1 fills an empty population)")

    def check(self) -> None:
        if self.pop_size < 1 or self.parents < 1:
            raise ConfigError("eoh.pop_size and eoh.parents must be >= 1")
        bad = [op for op in self.operators if op not in EOH_OPERATORS]
        if bad or not self.operators:
            raise ConfigError(f"eoh.operators must be a non-empty list of {', '.join(EOH_OPERATORS)}; got {self.operators!r}")


@dataclass
class AHDConfig(RunConfig):
    """One AHD run: a task, a method, a proposal budget."""

    task: str = opt("tsp20", "AHD task (`esopt ahd tasks` lists them)")
    method: str = opt("sample", "sample | eoh | agentic-esopt+sample | agentic-esopt+eoh")
    budget: int = opt(16, "T: total proposals (LLM replies, each evaluated once); the same for every method")
    population: int = opt(8, "G: proposals per batch; the ES population of the co-evolution methods")
    seed: int = opt(0, "run seed: generation seeds, parent selection and ES member seeds derive from it")
    eval_instances: int = opt(0, "instances each heuristic is evaluated on (0 = the task's default)")
    eval_seed: int = opt(0, "seed of the evaluation instances (fixed, so runs compare)")
    invalid_fitness: float = opt(-1.0, "ES fitness of an invalid proposal: min(this, the batch's lowest valid fitness)")
    eval_workers: int = opt(2, "sandbox evaluations run in parallel (each in its own subprocess)")
    isolation: str = opt("bwrap", "containment of the LLM-written heuristics: bwrap (OS isolation; the run is refused "
                                  "when it cannot be set up) | python (the in-process audit hook and rlimits only: "
                                  "not a security boundary)")
    batched_baselines: bool = opt(True, "baselines generate a batch in one call (seed derived per batch); false = one call per proposal like co-evolution")
    model: ModelConfig = opt(ModelConfig(), "the proposal model")
    sampling: SamplingConfig = opt(_default_sampling(), "decoding of proposals (temperature sampling)")
    es: ESConfig = opt(_default_es(), "ES settings of the co-evolution methods (es.population is --population)")
    eoh: EoHConfig = opt(EoHConfig(), "EoH settings (eoh and agentic-esopt+eoh)")
    run_name: str | None = opt(None, "run directory name (default: ahd_<task>__<method>__<seed>__<time>)")

    run_marker = "candidates.jsonl"

    def run_label(self) -> str:
        return f"ahd_{self.task}__{self.method}"

    @property
    def coevolve(self) -> bool:
        return self.method.startswith("agentic-esopt+")

    @property
    def loop(self) -> str:
        """'sample' or 'eoh': the outer loop, with or without ES."""
        return self.method.split("+")[-1]

    @property
    def batches(self) -> int:
        return math.ceil(self.budget / self.population)

    def check(self) -> None:
        from esopt.ahd.tasks import task_names

        super().check()
        if self.task not in task_names():
            raise ConfigError(f"unknown AHD task {self.task!r}; available: {', '.join(task_names())}")
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; expected one of {', '.join(METHODS)}")
        if self.isolation not in ISOLATIONS:
            raise ConfigError(f"isolation must be one of {', '.join(ISOLATIONS)}, got {self.isolation!r}")
        for name in ("budget", "population", "eval_workers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        if self.eval_instances < 0:
            raise ConfigError(f"eval_instances must be >= 0, got {self.eval_instances}")
        if not math.isfinite(self.invalid_fitness):
            raise ConfigError(f"invalid_fitness must be finite, got {self.invalid_fitness}")
        self.es.population = self.population
        self.es.antithetic = False  # each member writes its own proposal
        self.es.validate()  # again: the ES section was checked before these two settings came from the run
