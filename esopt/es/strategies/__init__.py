"""ES strategies, registered by name. A new strategy is one module here (a Strategy subclass decorated
with @register_strategy) and one import line below."""

from esopt.es.strategies import agentic, copes, vanilla  # noqa: F401  (each module registers its strategy)
from esopt.es.strategies.base import STRATEGIES, Strategy, make_strategy, register_strategy

__all__ = ["STRATEGIES", "Strategy", "make_strategy", "register_strategy"]
