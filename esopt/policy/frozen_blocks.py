"""Frozen lower blocks: when a member perturbs only the model's last blocks (`es.scope last:K`), every block
below them computes the same hidden states for every member of a step, so they run once for the step's
scoring rows and each member runs only its own K blocks, the final norm and the head.

    rows --(embeddings, blocks 0 .. first-1: the master's weights, once)--> hidden states   [cached]
    hidden states --(blocks first .. end, norm, head: this member's weights)--> logits

Both parts lay the rows out as shared prefill does (esopt/policy/prefill.py): the tokens every row starts with
(the system prompt) run once, as one row whose keys and values every row then reads. HFPolicy decides when the
cached states are valid (HFPolicy._frozen_below)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import nn

from esopt.policy.prefill import cache_keyword, common_prefix_length, prefix_layout


@dataclass
class FrozenStates:
    """The hidden states entering block `first` of a batch of rows laid out by prefix_layout."""

    first: int
    prefix: torch.Tensor | None
    """[1, P, hidden size]: the common prefix's (None when the rows share no prefix)."""
    rest: torch.Tensor
    """[rows, width, hidden size]: each row's remaining columns, left-padded."""
    attention_mask: torch.Tensor
    positions: torch.Tensor


@contextlib.contextmanager
def _decoder_blocks(decoder, start: int, stop: int | None, final_norm: bool) -> Iterator[None]:
    """The decoder's forward runs only blocks [start, stop), numbered from 0 in its KV cache, and the final
    norm only if `final_norm`."""
    layers, norm = decoder.layers, decoder.norm
    selected = list(layers)[start:stop]
    numbers = [block.self_attn.layer_idx for block in selected]
    decoder.layers = nn.ModuleList(selected)
    if not final_norm:
        decoder.norm = nn.Identity()
    for j, block in enumerate(selected):
        block.self_attn.layer_idx = j
    try:
        yield
    finally:
        for block, number in zip(selected, numbers):
            block.self_attn.layer_idx = number
        decoder.layers, decoder.norm = layers, norm


def _run(decoder, prefix_inputs: dict, rest_inputs: dict, mask, positions, prefix: int) -> tuple:
    """Run the decoder's current blocks on the common prefix (one row), then on every row's rest."""
    from transformers import DynamicCache

    cache = DynamicCache()
    keyword = {cache_keyword(decoder): cache, "use_cache": True}
    prefix_out = None
    if prefix:
        prefix_out = decoder(**prefix_inputs, position_ids=positions[:1, :prefix], **keyword).last_hidden_state
        cache.batch_select_indices(torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device))
    rest_out = decoder(**rest_inputs, attention_mask=mask, position_ids=positions[:, prefix:], **keyword).last_hidden_state
    return prefix_out, rest_out


def frozen_states(model, rows: Sequence[Sequence[int]], pad_id: int, first: int, keep: int) -> FrozenStates:
    """Run the embeddings and blocks [0, first) of `model` as it is now on `rows`."""
    prefix = common_prefix_length(rows, keep)
    ids, mask, positions = prefix_layout(rows, prefix, pad_id, model.device)
    decoder = model.get_decoder()
    with _decoder_blocks(decoder, 0, first, final_norm=False):
        prefix_out, rest_out = _run(
            decoder, {"input_ids": ids[:1, :prefix]}, {"input_ids": ids[:, prefix:]}, mask, positions, prefix
        )
    return FrozenStates(first, prefix_out, rest_out, mask, positions)


def upper_logits(model, states: FrozenStates, keep: int) -> torch.Tensor:
    """Logits of each row's last `keep` columns, running blocks [states.first, end), the norm and the head."""
    decoder = model.get_decoder()
    prefix = 0 if states.prefix is None else states.prefix.shape[1]
    with _decoder_blocks(decoder, states.first, None, final_norm=True):
        _, hidden = _run(
            decoder, {"inputs_embeds": states.prefix}, {"inputs_embeds": states.rest},
            states.attention_mask, states.positions, prefix,
        )
    return model.get_output_embeddings()(hidden[:, -keep:])
