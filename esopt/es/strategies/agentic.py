"""Agentic ESOpt: sigma cosine-decays from es.sigma to es.sigma_final (alpha as es.alpha_final says)."""

from esopt.es.strategies.base import Strategy, register_strategy


@register_strategy
class AgenticESOpt(Strategy):
    name = "agentic-esopt"
    sigma_decays = True
