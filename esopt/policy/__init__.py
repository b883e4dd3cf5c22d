"""LLM backends behind one contract (see base.Policy)."""

from esopt.policy.base import Chat, Policy, SamplingConfig


def load_policy(model_config) -> Policy:
    """The policy a ModelConfig asks for: HF transformers (default) or vLLM (`model.backend: vllm`)."""
    if getattr(model_config, "backend", "hf") != "hf":
        from esopt.policy.vllm import vllm_policy  # also reports an unknown backend

        return vllm_policy(model_config)
    from esopt.policy.hf import HFPolicy

    return HFPolicy.load(model_config)


__all__ = ["Chat", "Policy", "SamplingConfig", "load_policy"]
