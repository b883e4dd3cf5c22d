"""Sampled replies and their training sequences: every reply's prompt ids, sampled token ids and
grammar as generated (`ReplyRecorder`), the tokens each grammar allowed (`GrammarMasks`), and
sequences with a loss mask over exactly the tokens the model chose (`build_samples`)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby
from typing import Any

import torch

from esopt.policy.hf import HFPolicy
from esopt.rollout import Trajectory


@dataclass
class SampledTurn:
    """One reply exactly as the policy produced it: the prompt ids it was generated from, the token ids
    it was sampled as (an end-of-sequence token only when one was sampled), the grammar that
    constrained sampling (None = none) and the turn's reward."""

    episode: int
    prompt_ids: list[int]
    reply_ids: list[int]
    regex: str | None
    reward: float


class ReplyRecorder:
    """Generates with the policy in place of it inside `rollout()`, keeping each row's prompt, grammar
    and sampled token ids per generate call, so that training sees the tokens that were sampled rather
    than a re-tokenisation of the decoded (and stripped) reply text."""

    def __init__(self, policy: HFPolicy):
        self.policy = policy
        self.calls: list[list[tuple[list[int], str | None, list[int], str]]] = []

    @property
    def last_reply_tokens(self):
        return self.policy.last_reply_tokens

    def generate(self, chats, sampling, action_regex=None, seed: int = 0, members=None) -> list[str]:
        replies = self.policy.generate(chats, sampling, action_regex=action_regex, seed=seed, members=members)
        regexes = list(action_regex) if isinstance(action_regex, list) else [action_regex] * len(chats)
        # Tokenized now: rollout() goes on appending to the message lists it passed in.
        tokenizer = self.policy.tokenizer
        texts = [tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) for chat in chats]
        prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]  # as HFPolicy tokenizes them
        self.calls.append(list(zip(prompts, regexes, self.policy.last_reply_ids, replies)))
        return replies

    def turns(self, trajectories: list[Trajectory]) -> list[SampledTurn]:
        """Every sampled turn, episode by episode in turn order. rollout() makes one generate call per
        turn over the episodes still live, in index order: call t's rows are the episodes with more
        than t turns."""
        per_episode: list[list[SampledTurn]] = [[] for _ in trajectories]
        for t, rows in enumerate(self.calls):
            live = [e for e, trajectory in enumerate(trajectories) if trajectory.turns > t]
            if len(live) != len(rows):
                raise RuntimeError(f"generate call {t} had {len(rows)} rows but {len(live)} episodes were live")
            for e, (prompt, regex, ids, reply) in zip(live, rows):
                if reply != trajectories[e].actions[t]:
                    raise RuntimeError(f"episode {e} turn {t}: the recorded reply is not the trajectory's action")
                per_episode[e].append(SampledTurn(e, prompt, list(ids), regex, trajectories[e].rewards[t]))
        return [turn for turns in per_episode for turn in turns]


class GrammarMasks:
    """The tokens a reply's grammar allowed at each position, computed as the guided decoder computed
    them (lm-format-enforcer on the same tokenizer data), so log-probabilities can be scored under the
    distribution that was sampled from."""

    def __init__(self, tokenizer):
        from esopt.policy.guided import tokenizer_data

        self.data = tokenizer_data(tokenizer)
        self.enforcers: dict[str, Any] = {}

    def allowed(self, regex: str, prompt_ids: list[int], reply_ids: list[int]) -> list[list[int]]:
        from lmformatenforcer import RegexParser, TokenEnforcer

        if regex not in self.enforcers:
            self.enforcers[regex] = TokenEnforcer(self.data, RegexParser(regex))
        enforcer = self.enforcers[regex]
        sequence = list(prompt_ids)  # the enforcer's first call on a sequence treats it as the prompt
        out = []
        for token in reply_ids:
            out.append(enforcer.get_allowed_tokens(sequence).allowed_tokens)  # shared and cached: read only
            sequence.append(token)
        return out


@dataclass
class Sample:
    """One training sequence: one or more consecutive turns of an episode (prompt ids + sampled ids)."""

    episode: int
    ids: torch.Tensor
    mask: torch.Tensor
    """mask[j]: token j was sampled by the model as a choice (not forced by the grammar) and carries loss."""
    turn_spans: list[tuple[int, int]]
    """[start, end) span of every trained turn, in order; end - 1 is the turn's last trained token."""
    turn_rewards: list[float]
    """Reward of each trained turn (same order as turn_spans)."""
    allowed: list[list[int] | None]
    """Per masked token (in order): the token ids the grammar allowed there (None = unconstrained)."""
    # filled by the trainer, one value per masked token (in order):
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.mask.sum())


def build_samples(turns: list[SampledTurn], grammar: GrammarMasks | None, eos_id: int, eos_in_loss: bool = True) -> list[Sample]:
    """Training sequences holding exactly the ids the model saw and sampled: each turn is its prompt ids
    followed by its sampled ids. A turn whose prompt extends the previous turn's sequence token for
    token (full history, unchanged re-tokenisation) joins that sequence, so an episode is one forward
    pass when it can be and several exact ones otherwise.

    Trained tokens: every sampled token except those the grammar forced (only one token allowed: the
    model made no choice there) and, without `eos_in_loss`, a sampled end-of-sequence token. A reply
    cut at max_new_tokens has no end-of-sequence token among its sampled ids, so none is trained. A
    turn with no trained token passes its reward on to the episode's next trained turn (or, at the
    end, to its last one)."""
    samples: list[Sample] = []
    for episode, episode_turns in groupby(turns, key=lambda turn: turn.episode):
        episode_samples: list[dict] = []
        pending = 0.0
        for turn in episode_turns:
            allowed = (
                grammar.allowed(turn.regex, turn.prompt_ids, turn.reply_ids)
                if grammar is not None and turn.regex is not None
                else [None] * len(turn.reply_ids)
            )
            current = episode_samples[-1] if episode_samples else None
            if current is None or turn.prompt_ids[: len(current["ids"])] != current["ids"]:
                current = {"ids": [], "mask": [], "spans": [], "rewards": [], "allowed": []}
                episode_samples.append(current)
            offset = len(turn.prompt_ids)
            current["mask"] += [False] * (offset - len(current["ids"]))
            current["ids"] = list(turn.prompt_ids) + list(turn.reply_ids)
            trained = []
            for k, (token, options) in enumerate(zip(turn.reply_ids, allowed)):
                if options is not None and token not in options:
                    raise RuntimeError(f"sampled token {token} is outside its grammar {turn.regex!r}: masks disagree")
                forced = options is not None and len(options) == 1
                unwanted_eos = not eos_in_loss and token == eos_id and k == len(turn.reply_ids) - 1
                train = not forced and not unwanted_eos
                current["mask"].append(train)
                if train:
                    trained.append(k)
                    current["allowed"].append(options)
            pending += turn.reward
            if trained:
                current["spans"].append((offset + trained[0], offset + trained[-1] + 1))
                current["rewards"].append(pending)
                pending = 0.0
        kept = [s for s in episode_samples if s["spans"]]
        if kept and pending:
            kept[-1]["rewards"][-1] += pending
        for s in kept:
            samples.append(
                Sample(
                    episode=episode,
                    ids=torch.tensor(s["ids"], dtype=torch.long),
                    mask=torch.tensor(s["mask"], dtype=torch.bool),
                    turn_spans=s["spans"],
                    turn_rewards=s["rewards"],
                    allowed=s["allowed"],
                )
            )
    return samples
