"""Hugging Face transformers backend (CPU or GPU): the default policy.

Weights: an fp32 master copy is the truth. A member's weights are written as
master + sign*sigma*eps; restoring copies the master back (exact, whatever the
model dtype); updates go to the master, then to the model (bf16 weights could
not hold a 1e-5 update). The master is made from the loaded weights on first use,
so a policy that only generates (esopt eval, inference) holds the model alone.

Population batching (low-rank noise, `generate(..., members=[...])`): every chat answered with its own
member's weights in one batched forward; how, in esopt/policy/lowrank_hooks.py.
"""

from __future__ import annotations

import contextlib
import functools
import math
from pathlib import Path
from typing import Iterator, Sequence

import torch

from esopt.es import (
    LowRankNoise,
    Member,
    OptimizerState,
    Scope,
    Update,
    apply_update,
    is_matrix,
    perturb_tensor,
    stacked_factors,
    tensors_moved,
)
from esopt.es.parallel import for_each_tensor
from esopt.es.scope import block_index
from esopt.policy.base import Chat, Policy, SamplingConfig, copy_into_master, weights_fingerprint, write_optimizer_state
from esopt.policy.config import DTYPES, ModelConfig, resolve_device, resolve_dtype
from esopt.policy.frozen_blocks import FrozenStates, frozen_states, upper_logits
from esopt.policy.lowrank_hooks import (
    PopulationFactors,
    bind_hook,
    embedding_hook,
    hook_targets,
    linear_hook,
    members_problem,
)
from esopt.policy.guided import GrammarComplete, forced_prefix
from esopt.policy.models import resolve_model_path
from esopt.policy.prefill import cache_keyword, shared_prefill
from esopt.policy.sampling import sampling_processors

class HFPolicy(Policy):
    def __init__(self, model, tokenizer, max_batch_size: int = 0, jump_forward: bool = True, share_prefill: bool = True):
        self.max_batch_size = max_batch_size
        self.jump_forward = jump_forward
        self.share_prefill = share_prefill
        model.eval()
        model.requires_grad_(False)
        head = model.get_output_embeddings()
        if head is not None:
            head.register_forward_pre_hook(_contiguous_inputs)
        self.model = model
        self.tokenizer = tokenizer
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        # named_parameters() lists a tied tensor once, so tied embeddings are perturbed once.
        self._params = dict(model.named_parameters())
        self.optimizer_state = OptimizerState()
        self._hook_targets, self._unhookable = hook_targets(model, self._params)
        self._population: PopulationFactors | None = None
        self._batch_coef: torch.Tensor | None = None
        """Per row of the current generate batch: its member's coefficients on the population's factor columns."""
        self._row_coef: torch.Tensor | None = None
        """The coefficients the hooks apply to the rows of the next forward (a selection of _batch_coef's rows)."""
        self._moved: list[str] = []
        """The tensors the member inside `perturbed` has changed (the model holds the master elsewhere)."""
        self._frozen: dict[tuple, FrozenStates] = {}
        """Hidden states of scoring rows below the perturbed blocks, valid until the master changes."""

    @classmethod
    def load(cls, config: ModelConfig) -> "HFPolicy":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        config.validate()
        if config.threads:
            torch.set_num_threads(config.threads)
        path = resolve_model_path(config.path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        device = resolve_device(config.device)
        dtype = DTYPES[resolve_dtype(config.dtype, device)]
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, attn_implementation=config.attn_implementation
        ).to(device)
        return cls(
            model, tokenizer, max_batch_size=config.max_batch_size, jump_forward=config.jump_forward,
            share_prefill=config.share_prefill,
        )

    # ---- weights -------------------------------------------------------------------------
    @functools.cached_property
    def _master(self) -> dict[str, torch.Tensor]:
        # Every weight change goes through the master, so until it exists the model holds the loaded weights.
        return {name: p.detach().to(torch.float32, copy=True) for name, p in self._params.items()}

    def master_weights(self) -> dict[str, torch.Tensor]:
        return self._master

    def load_master_weights(self, weights: dict[str, torch.Tensor]) -> None:
        self._frozen.clear()
        copy_into_master(self._master, weights)
        self._sync_model_to_master()

    def load_optimizer_state(self, state: OptimizerState) -> None:
        self.optimizer_state = state

    @torch.no_grad()
    def _sync_model_to_master(self, names: Sequence[str] | None = None) -> None:
        for name in self._params if names is None else names:
            self._params[name].copy_(self._master[name])

    @contextlib.contextmanager
    def perturbed(self, member: Member) -> Iterator[None]:
        names = tensors_moved(member, self._master)  # the others keep the master's values untouched

        def perturb_one(name: str) -> None:
            with torch.no_grad():
                perturb_tensor(name, self._master[name], member, out=self._params[name].data)

        try:
            self._moved = names
            for_each_tensor(perturb_one, names)
            yield
        finally:
            self._moved = []
            self._sync_model_to_master(names)

    def apply(self, update: Update) -> None:
        self._frozen.clear()
        apply_update(self._master, update, self.optimizer_state)
        self._sync_model_to_master(tensors_moved(update, self._master))

    # ---- population batching (low-rank noise) ------------------------------------------------
    def supports_population(self, members: Sequence[Member]) -> bool:
        return self._population_problem(members) is None

    def _population_problem(self, members: Sequence[Member]) -> str | None:
        """Why these members cannot share one batched forward (None = they can)."""
        problem = members_problem(members)
        if problem:
            return problem
        moved = tensors_moved(members[0], self._master) if members else []
        unhookable = [self._unhookable[name] for name in moved if name in self._unhookable]
        if unhookable:
            return unhookable[0]
        vectors = [name for name in moved if not is_matrix(self._master[name].shape)]
        if vectors:
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

    def _build_population(self, members: Sequence[Member]) -> PopulationFactors:
        if not members:
            return PopulationFactors({}, LowRankNoise(), Scope(), {})
        seeds = list(dict.fromkeys(m.seed for m in members))  # antithetic pairs share one factor slot
        noise, scope = members[0].noise, members[0].scope
        names = sorted({name for _, _, name in self._hook_targets} & set(tensors_moved(members[0], self._master)))
        device = self.model.device
        factors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

        def build(name: str) -> None:
            # In the weight's dtype, like the layer's own matmul (bf16 factors: ~0.4% rounding per entry,
            # far less than rounding master + sigma*eps to bf16 in the materialised path).
            dtype = self._params[name].dtype
            a, b = stacked_factors(seeds, name, self._master[name].shape, noise.rank)
            factors[name] = (a.to(device=device, dtype=dtype), b.to(device=device, dtype=dtype))

        for_each_tensor(build, names)
        return PopulationFactors({s: i for i, s in enumerate(seeds)}, noise, scope, factors)

    @contextlib.contextmanager
    def _member_rows(self, row_members: Sequence[Member | None]) -> Iterator[None]:
        """Install the hooks that give row j of every forward inside the perturbation of row_members[j]."""
        live = [m for m in row_members if m is not None]
        population = self._population
        if population is None or any(
            m.seed not in population.slots or (m.noise, m.scope) != (population.noise, population.scope) for m in live
        ):
            population = self._build_population(list(dict.fromkeys(live)))
        rank = population.noise.rank
        coef = torch.zeros(len(row_members), len(population.slots) * rank, dtype=torch.float32)
        for j, m in enumerate(row_members):
            if m is not None:
                slot = population.slots[m.seed]
                coef[j, slot * rank : (slot + 1) * rank] = float(m.sign) * float(m.sigma) / math.sqrt(rank)
        self._batch_coef = self._row_coef = coef.to(self.model.device)
        handles = []
        try:
            for module, kind, name in self._hook_targets:
                if name not in population.factors:
                    continue  # outside the members' scope: this layer runs unperturbed
                a, b = population.factors[name]
                hook = embedding_hook if kind == "embedding" else linear_hook
                handles.append(module.register_forward_hook(bind_hook(hook, lambda: self._row_coef, a, b)))
            yield
        finally:
            for handle in handles:
                handle.remove()
            self._batch_coef = self._row_coef = None

    def _run_rows_as(self, rows: Sequence[int]) -> None:
        """The next forward's j-th row runs with the member of the batch's row rows[j] (population batching)."""
        if self._batch_coef is not None:
            self._row_coef = self._batch_coef[list(rows)]

    def fingerprint(self) -> str:
        return weights_fingerprint(self._master)

    def save(self, directory: str) -> None:
        """Save the fp32 master and the optimizer state (so a resumed run continues bit-exactly) with the tokenizer."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        dtype = self.model.config.dtype
        self.model.config.dtype = torch.float32
        try:
            self.model.save_pretrained(out, state_dict=dict(self._master))
        finally:
            self.model.config.dtype = dtype
        self.tokenizer.save_pretrained(out)
        write_optimizer_state(out, self.optimizer_state)

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
        reply_ids: list[list[int]] = []
        for start in range(0, len(chats), size):
            end = start + size
            rows = contextlib.nullcontext() if members is None else self._member_rows(members[start:end])
            with rows:
                batch_replies, batch_ids = self._generate_batch(
                    chats[start:end], sampling, regexes[start:end], seed + start,
                    None if members is None else members[start:end],
                )
            replies += batch_replies
            lengths += [len(ids) for ids in batch_ids]
            reply_ids += batch_ids
        self.last_reply_tokens = lengths
        # The token ids each reply was decoded as (up to and including its end-of-sequence token; text
        # prefilled by jump-forward is not among them): gradient baselines train on these, not on a
        # re-tokenisation of the reply text.
        self.last_reply_ids = reply_ids
        return replies

    @torch.inference_mode()
    def reply_logprobs(
        self, chats: list[Chat], replies: list[list[str]], members: list[Member | None] | None = None
    ) -> list[list[float]]:
        if len(replies) != len(chats) or (members is not None and len(members) != len(chats)):
            raise ValueError(f"reply_logprobs got {len(chats)} chats, {len(replies)} reply lists and members {members and len(members)}")
        texts = self.tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=False)
        # One scoring row per distinct (chat, reply minus its last token): candidates that differ only in their
        # last token (e.g. the digit of "set 2 3 <d>") are all read off one row's logits.
        rows, row_members, targets = [], [], []  # targets[i][j]: (row, the reply's tokens)
        index: dict[tuple, int] = {}
        for i, (text, candidates) in enumerate(zip(texts, replies)):
            prompt = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            member = None if members is None else members[i]
            targets.append([])
            for reply in candidates:
                reply_ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
                if not reply_ids:
                    raise ValueError(f"cannot score an empty reply for chat {i}")
                key = (i, tuple(reply_ids[:-1]))
                if key not in index:
                    index[key] = len(rows)
                    rows.append(prompt + reply_ids[:-1])
                    row_members.append(member)
                targets[-1].append((index[key], reply_ids))
        logprobs: dict[tuple[int, tuple], float] = {}
        size = self.max_batch_size or len(rows)
        first = self._frozen_below() if members is None else None
        for start in range(0, len(rows), size):
            chunk = range(start, min(start + size, len(rows)))
            wanted = [(r, ids) for per_chat in targets for r, ids in per_chat if r in chunk]
            keep = max(len(ids) for _, ids in wanted)
            if first is not None:
                logits = upper_logits(self.model, self._frozen_states([rows[r] for r in chunk], first, keep), keep)
            else:
                scope = contextlib.nullcontext() if members is None else self._member_rows([row_members[r] for r in chunk])
                with scope:
                    batch = shared_prefill(
                        self.model, [rows[r] for r in chunk], [row_members[r] for r in chunk],
                        self.tokenizer.pad_token_id, self._run_rows_as, keep=keep,
                    )
                    logits = self.model(
                        input_ids=batch.input_ids[:, -keep:], attention_mask=batch.attention_mask,
                        position_ids=batch.positions[:, -keep:], **{cache_keyword(self.model): batch.cache},
                    ).logits
            log_softmax = torch.log_softmax(logits.float(), dim=-1)
            for r, ids in wanted:
                # the reply's j-th token is predicted at column -len(ids) + j of its row (the last prompt token first)
                rows_logp = log_softmax[r - start, keep - len(ids) :]
                logprobs[(r, tuple(ids))] = rows_logp.gather(1, torch.tensor(ids, device=rows_logp.device)[:, None]).sum().item()
        return [[logprobs[(r, tuple(ids))] for r, ids in per_chat] for per_chat in targets]

    def _frozen_below(self) -> int | None:
        """The first block the current member perturbs, when it perturbs nothing below it (es.scope last:K on a
        decoder of `layers` and a final `norm`): the blocks under it hold the master's weights. Else None."""
        if not self._moved:
            return None
        decoder = self.model.get_decoder()
        if not isinstance(getattr(decoder, "layers", None), torch.nn.ModuleList) or not hasattr(decoder, "norm"):
            return None
        blocks = [block_index(name) for name in self._moved]
        if None in blocks or min(blocks) == 0:
            return None
        return min(blocks)

    def _frozen_states(self, rows: list[list[int]], first: int, keep: int) -> FrozenStates:
        """The hidden states entering block `first` for `rows`, computed once per set of rows (an ES step's
        members score the same rows) until the master changes."""
        key = (first, keep, tuple(map(tuple, rows)))
        if key not in self._frozen:
            if len(self._frozen) >= 8:  # rows of past steps: their tasks do not come back
                self._frozen.clear()
            self._frozen[key] = frozen_states(self.model, rows, self.tokenizer.pad_token_id, first, keep)
        return self._frozen[key]

    def _generate_batch(self, chats, sampling, regexes, seed, members=None) -> tuple[list[str], list[list[int]]]:
        from transformers import LogitsProcessorList, StoppingCriteriaList

        texts = self.tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=False)
        # Text every match of a row's grammar starts with is prefilled with the prompt instead of
        # decoded one forced token at a time.
        split = [forced_prefix(r) if r and self.jump_forward else ("", r) for r in regexes]
        prefixes = [prefix for prefix, _ in split]
        regexes = [rest for _, rest in split]
        texts = [text + prefix for text, prefix in zip(texts, prefixes)]
        if self.share_prefill and len(texts) > 1:
            rows = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
            groups = [None] * len(rows) if members is None else members
            batch = shared_prefill(self.model, rows, groups, self.tokenizer.pad_token_id, self._run_rows_as)
            inputs = {
                "input_ids": batch.input_ids, "attention_mask": batch.attention_mask, cache_keyword(self.model): batch.cache,
            }
        else:
            inputs = self.tokenizer(
                texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
            ).to(self.model.device)
        grammar = self._regex_processor(regexes) if any(r is not None for r in regexes) else None
        processors = LogitsProcessorList(([grammar] if grammar else []) + sampling_processors(sampling))
        stopping = StoppingCriteriaList([GrammarComplete(grammar)] if grammar and self.jump_forward else [])
        torch.manual_seed(seed)
        output = self.model.generate(
            **inputs,
            generation_config=self._generation_config(sampling),
            logits_processor=processors,
            stopping_criteria=stopping,
            tokenizer=self.tokenizer if sampling.stop else None,
        )
        new_tokens = output[:, inputs["input_ids"].shape[1] :]
        replies = self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        lengths = _reply_lengths(new_tokens, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)
        reply_ids = [row[:length] for row, length in zip(new_tokens.tolist(), lengths)]
        return [_cut_at_stop(prefix + reply, sampling.stop) for prefix, reply in zip(prefixes, replies)], reply_ids


def _contiguous_inputs(module, args):
    # generate's prefill feeds the head the last position only, a non-contiguous [B, 1, H] view. For a weight
    # that does not require grad, torch's matmul then takes a bmm path that copies the whole weight once per
    # row (pytorch/pytorch#186148): for SmolLM2's 49k x 576 head at B=32, 1.75 s and 1.8 GB per prefill
    # against 9 ms for the same, bit-identical, product on a contiguous input.
    return tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args)


def _reply_lengths(new_tokens: torch.Tensor, eos_id: int, pad_id: int) -> list[int]:
    """Tokens generated per row: up to and including the first end-of-sequence token; the padding
    generate writes after a row has finished does not count."""
    ended = (new_tokens == eos_id) | (new_tokens == pad_id)
    width = new_tokens.shape[1]
    positions = torch.arange(width, device=new_tokens.device).expand_as(new_tokens)
    first_end = torch.where(ended, positions, width).min(dim=1).values
    ends_with_eos = (first_end < width) & (new_tokens.gather(1, first_end.clamp(max=width - 1)[:, None])[:, 0] == eos_id)
    return (first_end + ends_with_eos.long()).tolist()


def _cut_at_stop(text: str, stops) -> str:
    cut = len(text)
    for stop in stops:
        index = text.find(stop)
        if index != -1:
            cut = min(cut, index)
    return text[:cut].strip()
