import pytest
import torch

from esopt.policy.hf import HFPolicy
from esopt.policy.models import tiny_llama



@pytest.fixture
def make_tiny_policy():
    """Factory for a tiny random-initialised Llama policy (same seed -> identical weights)."""

    def make(seed: int = 0, dtype: torch.dtype = torch.float32) -> HFPolicy:
        model, tokenizer = tiny_llama(seed=seed)
        return HFPolicy(model.to(dtype), tokenizer)

    return make
