"""Automatic heuristic design (AHD) tasks: LLM-written heuristics scored in the sandbox.

    from esopt.ahd.tasks import get_task
    task = get_task("tsp50")
    ev = task.evaluate(code, seed=0)        # Evaluation(valid, objective, reason, per_instance)
    task.reference()                        # {"greedy": ..., "optimum": ..., ...}
    task.normalised_score(ev.objective)     # relative improvement over greedy, higher is better

Tasks are built lazily (`get_task`); `AHD_TASKS` maps every name to its (cached) task.
"""

from __future__ import annotations

from typing import Callable

from esopt.ahd.tasks.base import AHDTask, CandidateError, Evaluation

_FACTORIES: dict[str, Callable[[], AHDTask]] = {}


def _register() -> None:
    from esopt.ahd.tasks.aco import AcoBinPacking, AcoCVRP, AcoTSP
    from esopt.ahd.tasks.admissible_sym import AdmissibleSetSymmetric
    from esopt.ahd.tasks.admissible_task import AdmissibleSet
    from esopt.ahd.tasks.constructive import Knapsack, TSPConstructive

    _FACTORIES.update({
        "tsp20": lambda: TSPConstructive(20),
        "tsp50": lambda: TSPConstructive(50),
        "knapsack50": lambda: Knapsack(50, 12.5),
        "knapsack100": lambda: Knapsack(100, 25.0),
        "admissible_15_10": lambda: AdmissibleSet(15, 10),
        "admissible_21_15": lambda: AdmissibleSetSymmetric(21, 15),  # symmetric (7-tuple) formulation
        "aco_tsp50": lambda: AcoTSP(50),
        "aco_tsp100": lambda: AcoTSP(100),
        "aco_cvrp50": lambda: AcoCVRP(50),
        "aco_cvrp100": lambda: AcoCVRP(100),
        "aco_binpacking500": lambda: AcoBinPacking(500),
        "aco_binpacking1000": lambda: AcoBinPacking(1000),
    })


_register()


class _LazyTasks(dict):
    def __missing__(self, name: str) -> AHDTask:
        if name not in _FACTORIES:
            raise KeyError(f"unknown AHD task {name!r}; available: {', '.join(sorted(_FACTORIES))}")
        task = _FACTORIES[name]()
        self[name] = task
        return task

    def __iter__(self):
        return iter(_FACTORIES)

    def __len__(self):
        return len(_FACTORIES)

    def __contains__(self, name):
        return name in _FACTORIES

    def keys(self):
        return list(_FACTORIES)

    def items(self):
        return [(k, self[k]) for k in _FACTORIES]

    def values(self):
        return [self[k] for k in _FACTORIES]


AHD_TASKS: dict[str, AHDTask] = _LazyTasks()


def get_task(name: str) -> AHDTask:
    return AHD_TASKS[name]


def task_names() -> list[str]:
    return sorted(_FACTORIES)


__all__ = ["AHD_TASKS", "AHDTask", "CandidateError", "Evaluation", "get_task", "task_names"]
