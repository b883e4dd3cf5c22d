"""Vanilla ES: a constant sigma."""

from esopt.es.strategies.base import Strategy, register_strategy


@register_strategy
class VanillaES(Strategy):
    name = "vanilla-es"
    sigma_decays = False
