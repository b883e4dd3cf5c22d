"""Population evaluation behind one interface: in-process (LocalEvaluator) or on Ray actors
(esopt.population.ray_evaluator.RayEvaluator, imported on demand: Ray is an optional extra), plus
bounded-staleness asynchronous ES on the Ray workers (esopt.population.async_es.AsyncES)."""

from esopt.population.base import Evaluator, MemberResult
from esopt.population.local import LocalEvaluator

__all__ = ["Evaluator", "LocalEvaluator", "MemberResult"]
