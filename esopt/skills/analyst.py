"""Analysts: read one trajectory and propose a patch to the frozen skill.

`Analyst.propose(skill, trajectory) -> Patch | Rejection`; `propose_many` does a batch (one batched
generate call for a local model). A success is read for what worked, a failure for what went wrong.

The analyst's reply must be one JSON value (optionally inside a ```json fence), nothing else:

    {"op": "append", "section": "Mistakes to avoid", "content": "- Check the sum before answering."}
    {"op": "insert", "section": "Checks", "content": "- ...", "after": "What works"}
    {"op": "replace", "section": "What works", "content": "- ..."}
    {"op": "delete", "section": "What works"}
    {"edits": [ ...edits as above... ]}     or a JSON list of edits
    {"op": "none"}                           (no change: a valid, empty patch)

`content` may also be a list of lines. "reason"/"rationale" keys are allowed and ignored. Anything
else - not JSON, prose around it, an unknown op or field, a section that does not exist, an insert
of an existing title, a heading inside content, over-long content - gives `Rejection(reason)`; a
rejection changes nothing. `parse_reply` is shared by every analyst, so a `ScriptedAnalyst` (tests)
exercises exactly the parser a model's reply goes through.

Analysts: `PolicyAnalyst` (any esopt Policy: the policy being trained, or another local HF model
loaded with `HFPolicy.load`), `OpenAIAnalyst` (an OpenAI-compatible chat-completions endpoint;
evaluation-only, the key comes from an environment variable), `ScriptedAnalyst` (fixed replies).
With `guided`, a local model's reply is constrained by `reply_regex(skill)` to the single-edit JSON
shape (existing titles for append/replace/delete), so a small model at least emits parseable JSON.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

from esopt.confutil import Config, ConfigError, opt
from esopt.policy.base import Policy, SamplingConfig
from esopt.policy.config import ModelConfig
from esopt.skills.document import Skill
from esopt.skills.patch import OPS, Edit, Patch, check_patch

EDIT_KEYS = {"op", "section", "content", "after"}
IGNORED_KEYS = {"reason", "rationale"}
ANALYST_KINDS = ("policy", "hf", "openai")


@dataclass
class Rejection:
    reason: str
    raw: str = ""
    source: str = ""

    def to_json(self) -> dict:
        return {"source": self.source, "reason": self.reason, "raw": self.raw}


Proposal = Patch | Rejection


# ---------------------------------------------------------------------------------------- parsing
_FENCE = re.compile(r"^```(?:json)?\s*\n?(.*?)\n?```$", re.DOTALL)


def _edit_from(obj: Any, where: str) -> Edit:
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is not a JSON object")
    unknown = sorted(set(obj) - EDIT_KEYS - IGNORED_KEYS)
    if unknown:
        raise ValueError(f"{where} has unknown field(s) {', '.join(map(repr, unknown))}")
    op = obj.get("op")
    if op not in OPS:
        raise ValueError(f"{where}: op must be one of {', '.join(OPS)} (or none), got {op!r}")
    section = obj.get("section")
    if not isinstance(section, str) or not section.strip():
        raise ValueError(f"{where}: section must be a non-empty string")
    content = obj.get("content", "")
    if isinstance(content, list) and all(isinstance(x, str) for x in content):
        content = "\n".join(content)
    if not isinstance(content, str):
        raise ValueError(f"{where}: content must be a string or a list of strings")
    after = obj.get("after")
    if after is not None and not isinstance(after, str):
        raise ValueError(f"{where}: after must be a section title")
    if op == "delete":
        content = ""
    return Edit(op, section.strip(), content.strip(), (after or "").strip() or None)


def parse_reply(text: str, skill: Skill, source: str = "", max_edit_chars: int = 600) -> Proposal:
    """The analyst's reply as a Patch valid against `skill`, or a Rejection saying why not."""
    raw = text if isinstance(text, str) else repr(text)
    s = raw.strip()
    fenced = _FENCE.match(s)
    if fenced:
        s = fenced.group(1).strip()
    if not s:
        return Rejection("empty reply", raw, source)
    try:
        value = json.loads(s)
    except json.JSONDecodeError as e:
        try:
            json.JSONDecoder().raw_decode(s[s.index("{"):] if "{" in s else s)
            why = "text outside the JSON value"
        except (json.JSONDecodeError, ValueError):
            why = f"not JSON ({e.msg} at character {e.pos})"
        return Rejection(why, raw, source)
    try:
        if isinstance(value, dict) and "edits" in value:
            extra = sorted(set(value) - {"edits"} - IGNORED_KEYS)
            if extra:
                raise ValueError(f"unknown field(s) {', '.join(map(repr, extra))} beside edits")
            items = value["edits"]
            if not isinstance(items, list):
                raise ValueError("edits must be a list")
        elif isinstance(value, dict) and value.get("op") == "none":
            items = []
        elif isinstance(value, dict):
            items = [value]
        elif isinstance(value, list):
            items = value
        else:
            raise ValueError(f"expected a JSON object or list, got {type(value).__name__}")
        edits = [_edit_from(obj, f"edit {i + 1}" if len(items) > 1 else "the edit") for i, obj in enumerate(items)]
    except ValueError as e:
        return Rejection(str(e), raw, source)
    patch = Patch(edits, source)
    reason = check_patch(patch, skill, max_edit_chars)
    if reason:
        return Rejection(reason, raw, source)
    return patch


# ----------------------------------------------------------------------------------------- prompt
SYSTEM_PROMPT = (
    "You maintain a short skill document (markdown, one topic per '## ' section) that an AI agent "
    "reads before it solves tasks. You read one episode of the agent and propose ONE edit to the "
    "document that would help on similar tasks. Reply with one JSON object and nothing else."
)


def _cut(text: str, n: int) -> str:
    text = str(text)
    return text if len(text) <= n else text[: n // 2] + " [...] " + text[-(n - n // 2) :]


def render_trajectory(trajectory: dict, max_chars: int = 1200) -> str:
    """The episode as the analyst reads it: the task, then each action and its feedback (no system prompt)."""
    messages = [m for m in trajectory.get("messages", []) if m.get("role") != "system"]
    per = max(80, max_chars // max(1, len(messages)))
    lines = []
    for i, m in enumerate(messages):
        who = "Task" if i == 0 else ("Agent" if m.get("role") == "assistant" else "Feedback")
        lines.append(f"{who}: {_cut(m.get('content', ''), per)}")
    if trajectory.get("done") and trajectory.get("feedback"):
        lines.append(f"Feedback: {_cut(trajectory['feedback'][-1], per)}")
    return _cut("\n".join(lines), max_chars)


def analyst_prompt(skill: Skill, trajectory: dict, max_chars: int = 1200) -> list[dict]:
    success = bool(trajectory.get("success"))
    reward = float(trajectory.get("reward", sum(trajectory.get("rewards", []))))
    outcome = "SUCCESS" if success else "FAILURE"
    ask = (
        "The agent succeeded. Write one short rule that captures what worked."
        if success
        else "The agent failed. Write one short rule that would have avoided the mistake."
    )
    titles = ", ".join(json.dumps(t) for t in skill.titles()) or "(none yet)"
    user = (
        f"SKILL DOCUMENT:\n{skill.text}\n"
        f"EPISODE ({outcome}, reward {reward:g}):\n{render_trajectory(trajectory, max_chars)}\n\n"
        f"{ask}\n"
        'Reply with one JSON object, e.g. {"op": "append", "section": "Mistakes to avoid", '
        '"content": "- Check the result before answering."}\n'
        f'op is "append" (add a line to a section), "replace" (rewrite a section), "delete" (remove a '
        f'section) or "insert" (a new section with a new title). Existing sections: {titles}.'
    )
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def reply_regex(skill: Skill) -> str:
    """A regex for one single-edit JSON reply: append/replace/delete an existing title, or insert a new one.
    Free text uses unbounded repeats (one automaton state each), so the token enforcer's per-state cache
    makes every step after the first cheap; length is bounded by max_new_tokens and max_edit_chars."""
    content = r'"content": "- [^"\\\n]+"'
    branches = []
    if skill.sections:
        titles = "|".join(re.escape(t) for t in skill.titles())
        branches.append(rf'\{{"op": "(append|replace)", "section": "({titles})", {content}\}}')
        branches.append(rf'\{{"op": "delete", "section": "({titles})"\}}')
    branches.append(rf'\{{"op": "insert", "section": "[A-Z][A-Za-z ]+", {content}\}}')
    return "|".join(branches)


# --------------------------------------------------------------------------------------- analysts
class Analyst:
    """Reads trajectories, proposes patches against a frozen skill."""

    name = "analyst"

    def propose(self, skill: Skill, trajectory: dict) -> Proposal:
        return self.propose_many(skill, [trajectory])[0]

    def propose_many(self, skill: Skill, trajectories: list[dict], seed: int = 0) -> list[Proposal]:
        raise NotImplementedError

    def replies(self) -> list[str]:
        """The raw replies of the last propose_many call (for the log)."""
        return list(getattr(self, "_last_replies", []))


def _source(trajectory: dict, i: int) -> str:
    return str(trajectory.get("task_id") or f"trajectory-{i}")


class ScriptedAnalyst(Analyst):
    """Fixed replies (a list, used in turn and cycled) or a function (skill, trajectory) -> reply."""

    name = "scripted"

    def __init__(self, replies: list[str] | Callable[[Skill, dict], str], max_edit_chars: int = 600):
        self._replies = replies
        self._calls = 0
        self.max_edit_chars = max_edit_chars

    def propose_many(self, skill, trajectories, seed=0):
        out, raws = [], []
        for i, trajectory in enumerate(trajectories):
            if callable(self._replies):
                raw = self._replies(skill, trajectory)
            else:
                raw = self._replies[self._calls % len(self._replies)]
            self._calls += 1
            raws.append(raw)
            out.append(parse_reply(raw, skill, _source(trajectory, i), self.max_edit_chars))
        self._last_replies = raws
        return out


class PolicyAnalyst(Analyst):
    """A local esopt Policy writes the patches (one batched generate call per batch)."""

    name = "policy"

    def __init__(self, policy: Policy, sampling: SamplingConfig | None = None, guided: bool = True,
                 max_trajectory_chars: int = 1200, max_edit_chars: int = 600):
        self.policy = policy
        self.sampling = sampling or SamplingConfig(temperature=0.7, max_new_tokens=96)
        self.guided = guided
        self.max_trajectory_chars = max_trajectory_chars
        self.max_edit_chars = max_edit_chars

    def propose_many(self, skill, trajectories, seed=0):
        if not trajectories:
            self._last_replies = []
            return []
        chats = [analyst_prompt(skill, t, self.max_trajectory_chars) for t in trajectories]
        regex = reply_regex(skill) if self.guided else None
        raws = self.policy.generate(chats, self.sampling, action_regex=regex, seed=seed)
        self._last_replies = raws
        return [parse_reply(r, skill, _source(t, i), self.max_edit_chars) for i, (r, t) in enumerate(zip(raws, trajectories))]


class OpenAIAnalyst(Analyst):
    """An OpenAI-compatible /chat/completions endpoint (urllib; no weights needed). A failed request is
    a Rejection with the error as its reason."""

    name = "openai"

    def __init__(self, base_url: str, model: str, api_key_env: str = "OPENAI_API_KEY", temperature: float = 0.7,
                 max_tokens: int = 256, timeout_s: float = 60.0, max_trajectory_chars: int = 1200,
                 max_edit_chars: int = 600):
        if not base_url or not model:
            raise ConfigError("the openai analyst needs analyst.base_url and analyst.model_name")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.max_trajectory_chars = max_trajectory_chars
        self.max_edit_chars = max_edit_chars

    def _complete(self, messages: list[dict], seed: int) -> str:
        import urllib.request

        body = json.dumps({"model": self.model, "messages": messages, "temperature": self.temperature,
                           "max_tokens": self.max_tokens, "seed": seed}).encode()
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env, "")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(f"{self.base_url}/chat/completions", data=body, headers=headers)
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            data = json.loads(response.read().decode())
        return str(data["choices"][0]["message"]["content"] or "")

    def propose_many(self, skill, trajectories, seed=0):
        out, raws = [], []
        for i, trajectory in enumerate(trajectories):
            source = _source(trajectory, i)
            try:
                raw = self._complete(analyst_prompt(skill, trajectory, self.max_trajectory_chars), seed + i)
            except Exception as e:  # network, HTTP or response-shape errors
                raws.append("")
                out.append(Rejection(f"request failed: {type(e).__name__}: {e}", "", source))
                continue
            raws.append(raw)
            out.append(parse_reply(raw, skill, source, self.max_edit_chars))
        self._last_replies = raws
        return out


# ----------------------------------------------------------------------------------------- config
@dataclass
class AnalystConfig(Config):
    kind: str = opt("policy", "who writes patches: policy (the model being run/trained) | hf (another local model) | openai (an endpoint)")
    model: ModelConfig = opt(ModelConfig(dtype="bfloat16", attn_implementation="sdpa"), "kind=hf: the analyst model (a local HF directory or 'default')")
    base_url: str = opt("http://localhost:8000/v1", "kind=openai: base URL of an OpenAI-compatible API")
    model_name: str = opt("", "kind=openai: the model name sent to the endpoint")
    api_key_env: str = opt("OPENAI_API_KEY", "kind=openai: environment variable holding the API key (unset = no key)")
    temperature: float = opt(0.7, "sampling temperature of the analyst")
    max_new_tokens: int = opt(96, "longest analyst reply, tokens")
    guided: bool = opt(True, "local analysts: constrain replies to the single-edit JSON format")
    max_trajectory_chars: int = opt(1200, "a trajectory is cut to this many characters in the analyst prompt")
    max_edit_chars: int = opt(400, "longest content of one edit; longer proposals are rejected")

    def check(self) -> None:
        if self.kind not in ANALYST_KINDS:
            raise ConfigError(f"analyst.kind must be one of {', '.join(ANALYST_KINDS)}, got {self.kind!r}")
        if self.temperature < 0 or self.max_new_tokens < 1 or self.max_trajectory_chars < 100 or self.max_edit_chars < 10:
            raise ConfigError("analyst: temperature >= 0, max_new_tokens >= 1, max_trajectory_chars >= 100, max_edit_chars >= 10")


def make_analyst(config: AnalystConfig, policy: Policy | None = None) -> Analyst:
    """The analyst `config` describes; kind=policy uses `policy` (the model being evaluated or trained)."""
    sampling = SamplingConfig(temperature=config.temperature, max_new_tokens=config.max_new_tokens)
    common = dict(max_trajectory_chars=config.max_trajectory_chars, max_edit_chars=config.max_edit_chars)
    if config.kind == "openai":
        return OpenAIAnalyst(config.base_url, config.model_name, config.api_key_env, config.temperature,
                             config.max_new_tokens, **common)
    if config.kind == "hf":
        from esopt.policy.hf import HFPolicy

        policy = HFPolicy.load(config.model)
    elif policy is None:
        raise ConfigError("analyst.kind=policy needs the policy")
    return PolicyAnalyst(policy, sampling, config.guided, **common)
