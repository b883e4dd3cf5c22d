"""Population evaluation behind one interface: in-process (LocalEvaluator) or on Ray actors
(esopt.dist.ray_evaluator.RayEvaluator, imported on demand: Ray is an optional extra), plus
bounded-staleness asynchronous ES on the Ray workers (esopt.dist.async_es.AsyncES)."""

from esopt.dist.base import Evaluator, MemberResult
from esopt.dist.local import LocalEvaluator

__all__ = ["Evaluator", "LocalEvaluator", "MemberResult"]
