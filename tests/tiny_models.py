"""Test models: a tiny randomly initialised Llama with the default model's tokenizer, policy factories
over it for Ray workers, and a policy that kills its worker process on demand (fault injection).

Ray workers unpickle the factories; the ray fixture registers this module to be pickled by value,
so workers need not import it from the tests folder."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from esopt.policy.hf import HFPolicy
from esopt.policy.models import resolve_model_path


def tiny_llama(seed: int = 0, hidden_size: int = 64, layers: int = 2, tokenizer_path: str = "default"):
    """A small randomly initialised Llama with the default model's tokenizer, for fast unit tests."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(tokenizer_path))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    return model, tokenizer


def tiny_hf_policy(seed: int = 0) -> HFPolicy:
    """Factory: the tiny Llama as an HFPolicy (same seed, same weights)."""
    model, tokenizer = tiny_llama(seed=seed)
    return HFPolicy(model, tokenizer)


class CrashOnMarkerPolicy(HFPolicy):
    """The tiny policy, except that perturbing member `member_index` while the file `marker` exists
    deletes the file and exits the process: one worker dies in the middle of an evaluation, and its
    replacement (built by the same factory) does not."""

    def __init__(self, model, tokenizer, marker: str, member_index: int):
        super().__init__(model, tokenizer)
        self.marker, self.member_index = Path(marker), member_index

    def perturbed(self, member):
        if member.index == self.member_index and self.marker.exists():
            self.marker.unlink()
            os._exit(1)
        return super().perturbed(member)


def crash_on_marker_policy(marker: str, member_index: int, seed: int = 0) -> HFPolicy:
    """Factory of `CrashOnMarkerPolicy` over the tiny Llama of `seed`."""
    model, tokenizer = tiny_llama(seed=seed)
    return CrashOnMarkerPolicy(model, tokenizer, marker, member_index)


def crash_mid_checkpoint(monkeypatch, policy: HFPolicy, checkpoint: str) -> None:
    """Make `policy.save` raise KeyboardInterrupt right after writing the weights of the checkpoint
    directory named `checkpoint`, before the trainer records it as complete: a run killed mid-checkpoint."""
    original_save = policy.save

    def save_then_crash(path):
        original_save(path)
        if path.endswith(checkpoint):
            raise KeyboardInterrupt("killed mid-checkpoint")

    monkeypatch.setattr(policy, "save", save_then_crash)


def weights_moved(base: dict, weights: dict) -> bool:
    """Whether any tensor differs from `base`: replay and resume checks assert this first, since a run
    whose members all tied made zero updates and would make their equality checks hold trivially."""
    return any(not torch.equal(base[name], tensor) for name, tensor in weights.items())
