"""Low-rank ES members as LoRA adapters (PEFT layout), for engines that batch many adapters in one forward.

Member i's low-rank perturbation of a matrix W (m x n) is s * A B^T with s = sign * sigma / sqrt(r),
A (m x r), B (n x r) its seed's factors (esopt/es/noise/lowrank.py). A PEFT LoRA adds
scaling * lora_B @ lora_A to W with lora_B (m x r), lora_A (r x n); with lora_alpha = r (scaling 1),
lora_B = s * A and lora_A = B^T give exactly the member's perturbation. Embeddings use PEFT's
transposed pair (lora_embedding_A = A^T, lora_embedding_B = s * B), and a tied output head, which
shares the embedding's tensor name, gets the embedding's factors, as materialised weights would.
Non-matrix tensors (norm weights, biases) are never in an adapter: members whose noise perturbs them
(es.lowrank_vectors=full) cannot be adapters (`adapter_problem` says why).

Everything here is a pure function of the member and the tensor shapes, so an engine's worker
rebuilds each adapter from the member's seed alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Iterable, Mapping

import torch

from esopt.es import LowRankNoise, Member, is_matrix, lowrank_factors, tensors_moved
from esopt.policy.lowrank_hooks import members_problem

__all__ = [
    "LORA_RANKS",
    "adapter_problem",
    "adapter_tensors",
    "engine_lora_rank",
    "lora_module",
    "write_adapter",
]

PEFT_PREFIX = "base_model.model."
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks vLLM can reserve (its max_lora_rank choices); a smaller adapter is zero-padded."""


def engine_lora_rank(rank: int) -> int:
    """The smallest rank vLLM can reserve that holds adapters of `rank`."""
    for allowed in LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} exceeds the largest rank vLLM supports ({LORA_RANKS[-1]})")


def lora_module(tensor_name: str) -> str:
    """The module a weight tensor belongs to ('model.layers.0.mlp.up_proj.weight' -> 'model.layers.0.mlp.up_proj')."""
    if not tensor_name.endswith(".weight"):
        raise ValueError(f"{tensor_name!r} is not a module weight")
    return tensor_name[: -len(".weight")]


def _is_embedding(module: str) -> bool:
    return module.rsplit(".", 1)[-1] in ("embed_tokens", "wte")


def adapter_problem(
    members: Iterable[Member], tensors: Mapping[str, torch.Tensor], supported_modules: Iterable[str] | None = None
) -> str | None:
    """Why these members cannot run as LoRA adapters over `tensors` (None = they can). `supported_modules`:
    the module names (last component) the engine can give a LoRA, when it says."""
    members = list(members)
    problem = members_problem(members)
    if problem or not members:
        return problem
    supported = None if supported_modules is None else set(supported_modules)
    for name in tensors_moved(members[0], tensors):
        if not is_matrix(tensors[name].shape):
            return (
                f"a LoRA adapter cannot perturb non-matrix tensors such as {name!r} "
                "(es.lowrank_vectors=full); use es.lowrank_vectors=frozen"
            )
        if not name.endswith(".weight"):
            return f"a LoRA adapter cannot perturb {name!r} (not a module weight)"
        module = lora_module(name).rsplit(".", 1)[-1]
        if supported is not None and module not in supported:
            return f"the engine cannot put a LoRA on {name!r} (supported modules: {', '.join(sorted(supported))})"
    return None


def adapter_tensors(
    member: Member, tensors: Mapping[str, torch.Tensor], tied_output_head: str | None = "lm_head"
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(PEFT tensors, target module names) of `member`'s adapter over the matrices it moves in `tensors`
    (fp32; an engine casts them to its LoRA dtype). `tied_output_head`: the output head's module name when
    it shares the embedding's tensor (tied embeddings), None when it is its own tensor or absent."""
    problem = adapter_problem([member], tensors)
    if problem:
        raise ValueError(problem)
    noise = member.noise
    assert isinstance(noise, LowRankNoise)
    scale = float(member.sign) * float(member.sigma) / math.sqrt(noise.rank)
    out: dict[str, torch.Tensor] = {}
    targets: set[str] = set()
    for name in tensors_moved(member, tensors):
        a, b = lowrank_factors(member.seed, name, tensors[name].shape, noise.rank)  # A [m, r], B [n, r]
        module = lora_module(name)
        if _is_embedding(module):
            out[f"{PEFT_PREFIX}{module}.lora_embedding_A"] = a.T.contiguous()
            out[f"{PEFT_PREFIX}{module}.lora_embedding_B"] = (b * scale).contiguous()
            if tied_output_head is not None:
                # logits = h W^T: the head's weight is the embedding matrix, so its delta is the same s A B^T.
                out[f"{PEFT_PREFIX}{tied_output_head}.lora_A.weight"] = b.T.contiguous()
                out[f"{PEFT_PREFIX}{tied_output_head}.lora_B.weight"] = (a * scale).contiguous()
                targets.add(tied_output_head)
        else:
            out[f"{PEFT_PREFIX}{module}.lora_A.weight"] = b.T.contiguous()
            out[f"{PEFT_PREFIX}{module}.lora_B.weight"] = (a * scale).contiguous()
        targets.add(module.rsplit(".", 1)[-1])
    return out, sorted(targets)


def write_adapter(
    directory: str | Path, member: Member, tensors: Mapping[str, torch.Tensor], tied_output_head: str | None = "lm_head"
) -> Path:
    """Write `member`'s adapter as a PEFT directory (adapter_config.json + adapter_model.safetensors)."""
    from safetensors.torch import save_file

    weights, targets = adapter_tensors(member, tensors, tied_output_head)
    rank = member.noise.rank  # type: ignore[attr-defined]
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(directory / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": targets, "bias": "none",
              "lora_dropout": 0.0, "use_rslora": False}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory
