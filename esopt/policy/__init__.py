"""LLM backends behind one contract (see base.Policy)."""

from esopt.policy.base import Chat, Policy, SamplingConfig

__all__ = ["Chat", "Policy", "SamplingConfig"]
