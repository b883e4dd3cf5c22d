"""Population evaluation behind one interface: in-process (LocalEvaluator) or on Ray actors."""

from esopt.dist.base import Evaluator, MemberResult
from esopt.dist.local import LocalEvaluator

__all__ = ["Evaluator", "LocalEvaluator", "MemberResult"]
