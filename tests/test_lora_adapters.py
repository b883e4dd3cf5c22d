"""Low-rank members as PEFT LoRA adapters (esopt/policy/lora.py): the adapter's weight delta is exactly the
member's materialised perturbation, tensor by tensor; what cannot be an adapter is refused with a reason."""

from __future__ import annotations

import json

import pytest
import torch

from esopt.es import FullNoise, LowRankNoise, Member, Scope, perturb_tensor
from esopt.policy.lora import PEFT_PREFIX, adapter_problem, adapter_tensors, engine_lora_rank, write_adapter
from tiny_models import tiny_llama


def _master():
    model, _ = tiny_llama(seed=0)
    return {name: p.detach().to(torch.float32, copy=True) for name, p in model.named_parameters()}, model


def _delta(weights: dict, module: str) -> torch.Tensor:
    """The weight delta a PEFT adapter (scaling 1) adds to `module`'s weight."""
    key = PEFT_PREFIX + module
    if f"{key}.lora_embedding_A" in weights:
        return (weights[f"{key}.lora_embedding_B"] @ weights[f"{key}.lora_embedding_A"]).T
    return weights[f"{key}.lora_B.weight"] @ weights[f"{key}.lora_A.weight"]


@pytest.mark.parametrize("sign,rank", [(1, 1), (-1, 3)])
def test_adapter_delta_equals_materialised_perturbation(sign, rank):
    master, model = _master()
    member = Member(index=0, seed=41, sigma=0.03, sign=sign, noise=LowRankNoise(rank))
    weights, targets = adapter_tensors(member, master, tied_output_head="lm_head" if model.config.tie_word_embeddings else None)
    matrices = [name for name, t in master.items() if t.dim() == 2]
    assert matrices and {name.rsplit(".", 2)[-2] for name in matrices} <= set(targets)
    for name in matrices:
        perturbed = torch.empty_like(master[name])
        perturb_tensor(name, master[name], member, out=perturbed)
        expected = perturbed - master[name]
        torch.testing.assert_close(_delta(weights, name[: -len(".weight")]), expected, atol=1e-6, rtol=1e-4)
    if model.config.tie_word_embeddings:  # the tied head moves with the embedding
        torch.testing.assert_close(_delta(weights, "lm_head"), _delta(weights, "model.embed_tokens"), atol=1e-7, rtol=0)
    assert not any("norm" in key for key in weights)  # frozen vectors: norms are not in the adapter


def test_scope_limits_the_adapter_and_files_are_peft(tmp_path):
    master, _ = _master()
    member = Member(index=0, seed=5, sigma=0.01, noise=LowRankNoise(2), scope=Scope("attention"))
    directory = write_adapter(tmp_path / "a", member, master)
    config = json.loads((directory / "adapter_config.json").read_text())
    assert config["r"] == config["lora_alpha"] == 2 and config["peft_type"] == "LORA"
    assert set(config["target_modules"]) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    from safetensors.torch import load_file

    assert all(".self_attn." in key for key in load_file(directory / "adapter_model.safetensors"))


def test_what_cannot_be_an_adapter_is_refused():
    master, _ = _master()
    lowrank = LowRankNoise(1)
    assert adapter_problem([Member(0, 1, 0.01, noise=lowrank)], master) is None
    assert "low-rank" in adapter_problem([Member(0, 1, 0.01, noise=FullNoise())], master)
    assert "lowrank_vectors" in adapter_problem([Member(0, 1, 0.01, noise=LowRankNoise(1, "full"))], master)
    assert "one rank" in adapter_problem([Member(0, 1, 0.01, noise=lowrank), Member(1, 2, 0.01, noise=LowRankNoise(2))], master)
    assert "engine cannot" in adapter_problem([Member(0, 1, 0.01, noise=lowrank)], master, supported_modules=["q_proj"])
    with pytest.raises(ValueError, match="lowrank_vectors"):
        adapter_tensors(Member(0, 1, 0.01, noise=LowRankNoise(1, "full")), master)
    assert [engine_lora_rank(r) for r in (1, 2, 8, 9)] == [1, 8, 8, 16]
    with pytest.raises(ValueError, match="largest"):
        engine_lora_rank(1000)
