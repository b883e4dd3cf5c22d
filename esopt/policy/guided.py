"""Guided decoding: constrain generation to an env's action regex with lm-format-enforcer.

lm-format-enforcer's own transformers integration does not import under
transformers 5, so this module feeds its tokenizer-agnostic core (TokenEnforcer)
from a small LogitsProcessor.
"""

from __future__ import annotations

import torch
from lmformatenforcer import RegexParser, TokenEnforcer, TokenEnforcerTokenizerData
from transformers import LogitsProcessor


def build_tokenizer_data(tokenizer) -> TokenEnforcerTokenizerData:
    """Decode every token once so the enforcer can walk its prefix tree (a few seconds; build once per tokenizer)."""
    zero = tokenizer.encode("0", add_special_tokens=False)[-1]
    special = set(tokenizer.all_special_ids)
    regular = []
    for token_id in range(len(tokenizer)):
        if token_id in special:
            continue
        # Decoding after "0" keeps a word-start token's leading space, which a lone decode drops.
        after_zero = tokenizer.decode([zero, token_id])[1:]
        alone = tokenizer.decode([token_id])
        regular.append((token_id, after_zero, len(after_zero) > len(alone)))

    def decode(tokens: list[int]) -> str:
        return tokenizer.decode(tokens).rstrip("\ufffd")

    return TokenEnforcerTokenizerData(regular, decode, tokenizer.eos_token_id, False, len(tokenizer))


_CACHE: dict[tuple, TokenEnforcerTokenizerData] = {}


def tokenizer_data(tokenizer) -> TokenEnforcerTokenizerData:
    """build_tokenizer_data, once per tokenizer (by name and vocabulary)."""
    key = (tokenizer.name_or_path, len(tokenizer), tokenizer.eos_token_id)
    if key not in _CACHE:
        _CACHE[key] = build_tokenizer_data(tokenizer)
    return _CACHE[key]


class RegexLogitsProcessor(LogitsProcessor):
    """Masks every token that would take row i's reply outside regexes[i] (None = unconstrained);
    once a reply matches in full only EOS remains allowed."""

    def __init__(self, tokenizer_data: TokenEnforcerTokenizerData, regexes: list[str | None]):
        enforcers = {r: TokenEnforcer(tokenizer_data, RegexParser(r)) for r in set(regexes) if r}
        self._rows = [enforcers.get(r) if r else None for r in regexes]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        mask = torch.zeros_like(scores)
        for row, sequence in enumerate(input_ids.tolist()):
            enforcer = self._rows[row]
            if enforcer is not None:
                mask[row].fill_(float("-inf"))
                mask[row, enforcer.get_allowed_tokens(sequence).allowed_tokens] = 0.0
        return scores + mask

