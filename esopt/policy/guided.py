"""Guided decoding: constrain generation to an env's action regex with lm-format-enforcer.

lm-format-enforcer's own transformers integration does not import under
transformers 5, so this module feeds its tokenizer-agnostic core (TokenEnforcer)
from a small LogitsProcessor.
"""

from __future__ import annotations

import re

import torch
from lmformatenforcer import RegexParser, TokenEnforcer, TokenEnforcerTokenizerData
from transformers import LogitsProcessor, StoppingCriteria


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
        enforcers = {r: TokenEnforcer(tokenizer_data, RegexParser(r)) for r in set(regexes) if r is not None}
        self._rows = [None if r is None else enforcers[r] for r in regexes]
        self._eos = tokenizer_data.eos_token_id

    def complete(self, input_ids: torch.LongTensor) -> torch.BoolTensor:
        """Per row: the reply matches its regex in full, so the grammar allows nothing but EOS."""
        done = []
        for row, sequence in enumerate(input_ids.tolist()):
            enforcer = self._rows[row]
            done.append(enforcer is not None and enforcer.get_allowed_tokens(sequence).allowed_tokens == [self._eos])
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        mask = torch.zeros_like(scores)
        for row, sequence in enumerate(input_ids.tolist()):
            enforcer = self._rows[row]
            if enforcer is not None:
                mask[row].fill_(float("-inf"))
                mask[row, enforcer.get_allowed_tokens(sequence).allowed_tokens] = 0.0
        return scores + mask



class GrammarComplete(StoppingCriteria):
    """Ends a row's generation once its grammar is satisfied in full: the forced end-of-sequence token
    would cost one more forward pass of the whole batch and add nothing to the reply."""

    def __init__(self, processor: RegexLogitsProcessor):
        self.processor = processor

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        return self.processor.complete(input_ids)


_META = set("\\.^$*+?{}[]()|")


def forced_prefix(regex: str) -> tuple[str, str]:
    """Split `regex` into the literal text every match starts with and a regex for the rest.

    The forced text need not be generated token by token: it is appended to the prompt and prefilled
    with it (jump-forward decoding), which saves one forward pass per forced token. Only plain
    characters, escaped metacharacters and groups of plain characters count as forced; the scan stops
    at the first alternative, class or quantified item, so the split is exact: for every string s,
    s matches `regex` iff s == prefix + t for a t that matches the remainder."""
    if _has_top_level_alternative(regex):
        return "", regex
    text, i = [], 0
    while i < len(regex):
        c = regex[i]
        if c == "\\" and i + 1 < len(regex) and regex[i + 1] in _META:
            literal, end = regex[i + 1], i + 2
        elif c == "(" and not regex.startswith("(?", i):
            close = regex.find(")", i)
            inner = regex[i + 1 : close] if close != -1 else ""
            if close == -1 or any(ch in _META for ch in inner):
                break
            literal, end = inner, close + 1
        elif c not in _META:
            literal, end = c, i + 1
        else:
            break
        if end < len(regex) and regex[end] in "*+?{":
            break  # quantified: not forced
        text.append(literal)
        i = end
    prefix = "".join(text)
    # Whitespace stays with what follows it: BPE tokenizers attach a space to the next word, so a
    # prompt ending in a space would not tokenize the way the model writes.
    kept = prefix.rstrip()
    return kept, re.escape(prefix[len(kept) :]) + regex[i:]


def _has_top_level_alternative(regex: str) -> bool:
    depth, i, in_class = 0, 0, False
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            return True
        i += 1
    return False
