"""Reading one agent reply of the tool-using text envs (math, countdown, docqa).

- `parse_action`: a reply as a tool call, a final answer, or neither. The protocol is deliberately
  plain and forgiving, for small models::

      calculator: 12*(3+4)          (also "calculator(12*(3+4))", "calc: ...")
      python:                       (followed by a ``` code block, or code on the next lines)
      read_page 2                   (tool name, then its argument after ":", a space, or "(...)")
      answer: 42                    (also "Final answer: 42", "**Answer:** 42", \\boxed{42},
                                     <answer>42</answer>, "The answer is 42")

  The first action line of the reply counts; text before it (reasoning) is ignored. A reply with no
  action line falls back to \\boxed{...}, <answer>...</answer>, "the answer is ...", and (python
  only) a bare ``` code block.
- `parse_number`: a forgiving reader of a numeric final answer ("1,234", "$12.50", "x = 3", "42
  apples", "3/4").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

_NUM_RE = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_PLAIN_NUM = re.compile(rf"^{_NUM_RE}$")
_FRACTION = re.compile(rf"^({_NUM_RE})\s*/\s*({_NUM_RE})$")
_LATEX_FRAC = re.compile(rf"^\\[dt]?frac\{{\s*({_NUM_RE})\s*\}}\{{\s*({_NUM_RE})\s*\}}$")
_NUM_WITH_UNIT = re.compile(rf"^({_NUM_RE})\s*(?:%|[A-Za-z][A-Za-z .'-]{{0,40}})$")
_ASSIGN = re.compile(r"^[A-Za-z]\w{0,10}\s*=\s*")


def parse_number(text: str) -> Fraction | None:
    """The number a final answer states, or None. Accepts "42", "-3.5", "1,234", "$12.50",
    "12%", "3/4", "\\frac{3}{4}", "x = 13", "42 apples". Digit strings over 400 characters -> None."""
    if not isinstance(text, str):
        return None
    s = text.strip().strip("`*").strip()
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "%").replace("\\!", "").strip()
    s = _ASSIGN.sub("", s)
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)
    s = re.sub(r"\s+", " ", s).rstrip(".").strip()
    if not s or len(s) > 400:
        return None
    try:
        if _PLAIN_NUM.match(s):
            return Fraction(s)
        m = _FRACTION.match(s) or _LATEX_FRAC.match(s)
        if m:
            den = Fraction(m[2])
            return Fraction(m[1]) / den if den != 0 else None
        m = _NUM_WITH_UNIT.match(s)
        if m:
            return Fraction(m[1])
    except (ValueError, ZeroDivisionError):
        return None
    return None




MAX_REPLY_CHARS = 20_000

ANSWER = "answer"
TOOL = "tool"
INVALID = "invalid"

DEFAULT_ALIASES = {"calculator": ("calc", "calculate"), "python": ("py", "python3", "code")}


@dataclass
class Action:
    kind: str
    """"tool", "answer" or "invalid"."""
    tool: str | None = None
    arg: str = ""
    """The tool's argument (python: the code) or the answer text."""
    explicit: bool = True
    """For answers: True when given with an answer marker ("answer:", \\boxed, <answer>), False
    when recovered from looser text ("the answer is ..." or a bare reply)."""
    error: str | None = None


_SPACES = re.compile(r"[ \t\f\v]+")
_DECOR = re.compile(r"^(?:[\s>*#_`-]|\d+[.)]\s)*")  # markdown decoration at a line start
_ACTION_PREFIX = re.compile(r"^(?:action|tool|call|step \d+)\s*:\s*", re.IGNORECASE)
_ANSWER_LINE = re.compile(
    r"^(?:my\s+|the\s+)?(?:final\s+answer|answer)(?:\s+is)?\s*\**\s*(?::|=|-\s|is\b)\s*\**\s*(.*)$",
    re.IGNORECASE,
)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_ANSWER_IS = re.compile(r"\b(?:final\s+)?answer\s+is\s*:?\s*(.+)", re.IGNORECASE)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n?(.*?)(?:```|$)", re.DOTALL)


def _boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), with nested braces; None if absent."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    i = starts[-1]
    depth = 1
    j = i
    while j < len(text) and depth:
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
        j += 1
    return text[i : j - 1] if depth == 0 else text[i:]


_ANSWER_IS_PREFIX = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\s+is\s*:?\s*", re.IGNORECASE)


def clean_answer(text: str) -> str:
    """Strip formatting around an answer: \\boxed{}, <answer> tags, $...$, **, quotes, "the answer
    is", one trailing period; keep the first line only."""
    s = text.strip()
    b = _boxed(s)
    if b is not None:
        s = b
    s = _ANSWER_TAG.sub(lambda m: m.group(1), s).strip()
    s = s.split("\n", 1)[0].strip() if s else s
    s = _ANSWER_IS_PREFIX.sub("", s)
    for _ in range(4):
        before = s
        s = s.strip().strip("*_`").strip()
        if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'$":
            s = s[1:-1].strip()
        if s.startswith("\\(") and s.endswith("\\)"):
            s = s[2:-2].strip()
        if s == before:
            break
    if s.endswith(".") and not s.endswith(".."):
        s = s[:-1].rstrip()
    return s


def _tool_pattern(names: Sequence[str]) -> re.Pattern:
    alts = sorted(set(names), key=len, reverse=True)
    parts = [re.escape(n).replace("_", "[ _-]?") for n in alts]
    return re.compile(
        r"^(" + "|".join(parts) + r")(?![A-Za-z0-9_])\**([ \t]*)(.*)$", re.IGNORECASE | re.DOTALL
    )


def _key(name: str) -> str:
    return re.sub(r"[ _-]", "", name.lower())


def _python_code(after: str, rest_lines: list[str]) -> str:
    """Code for a python call: a ``` block starting on the call line or after it if there is one;
    else the code on the call line; else the following lines up to an answer line."""
    tail = after + ("\n" + "\n".join(rest_lines) if rest_lines else "")
    m = _FENCE.search(tail)
    if m and not after.strip("`").strip() or (m and after.lstrip().startswith("```")):
        return m.group(2).strip("\n")
    if after.strip():
        return after.strip().strip("`").strip()
    code = []
    for line in rest_lines:
        if _ANSWER_LINE.match(_DECOR.sub("", line).strip()):
            break
        code.append(line)
    return "\n".join(code).strip("\n")


def parse_action(
    text: str,
    tools: Sequence[str] = (),
    aliases: dict[str, Sequence[str]] | None = None,
    bare_answer: bool = False,
) -> Action:
    """Read one reply. `tools` are the enabled tool names (e.g. ``["calculator", "python"]``);
    `aliases` maps a tool name to other names it answers to (default: calc/calculate, py/code).
    With `bare_answer`, a reply with no action at all is taken as the answer text itself (its last
    non-empty line). Never raises."""
    try:
        return _parse_action(text, tools, aliases, bare_answer)
    except Exception as e:  # defensive: the env must never raise on a reply
        return Action(INVALID, error=f"could not read the reply ({type(e).__name__})")


def _parse_action(text, tools, aliases, bare_answer) -> Action:
    if not isinstance(text, str) or not text.strip():
        return Action(INVALID, error="empty reply")
    text = text[:MAX_REPLY_CHARS].replace("\r\n", "\n")
    aliases = DEFAULT_ALIASES if aliases is None else aliases
    table: dict[str, str] = {}
    names: list[str] = []
    for t in tools:
        for a in (t, *aliases.get(t, ())):
            table[_key(a)] = t
            names.append(a)
    tool_re = _tool_pattern(names) if names else None
    lines = text.split("\n")
    in_fence = False
    for i, raw in enumerate(lines):
        if raw.strip().startswith("```"):  # a fenced block: code if python is enabled, else skipped
            if not in_fence and "python" in tools:
                m = _FENCE.search("\n".join(lines[i:]))
                if m and m.group(1).lower() in ("python", "py", "python3", "") and m.group(2).strip():
                    return Action(TOOL, tool="python", arg=m.group(2).strip("\n"))
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        line = _DECOR.sub("", _SPACES.sub(" ", raw)).strip()  # bounded gaps: no slow backtracking
        line = _ACTION_PREFIX.sub("", line).strip()
        if not line:
            continue
        m = _ANSWER_LINE.match(line)
        if m:
            ans = m.group(1).strip()
            if not ans:  # "Answer:" alone: the answer is on the next non-empty line
                ans = next((x.strip() for x in lines[i + 1 :] if x.strip()), "")
            return Action(ANSWER, arg=clean_answer(ans), explicit=True)
        if tool_re is None:
            continue
        m = tool_re.match(line)
        if not m:
            continue
        name = table[_key(m.group(1))]
        space, after = m.group(2), m.group(3).strip()
        if after[:1] in (":", "="):
            after = after[1:].lstrip("*").strip()
        elif after[:1] in ("(", "["):
            close = ")" if after[0] == "(" else "]"
            after = after[1:].strip()
            if after.endswith(close):
                after = after[:-1].strip()
        elif after and not space:
            continue  # e.g. "calculators are ..." is not a call
        if name == "python":
            return Action(TOOL, tool=name, arg=_python_code(after, lines[i + 1 :]))
        arg = after.strip("`").strip()
        if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in "\"'":
            arg = arg[1:-1].strip()
        return Action(TOOL, tool=name, arg=arg)
    b = _boxed(text)
    if b is not None:
        return Action(ANSWER, arg=clean_answer(b), explicit=True)
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return Action(ANSWER, arg=clean_answer(tags[-1]), explicit=True)
    if "python" in tools:
        m = _FENCE.search(text)
        if m and m.group(1).lower() in ("python", "py", "python3", "") and m.group(2).strip():
            return Action(TOOL, tool="python", arg=m.group(2).strip("\n"))
    m = None
    for m in _ANSWER_IS.finditer(text):
        pass
    if m is not None:
        return Action(ANSWER, arg=clean_answer(m.group(1)), explicit=False)
    if bare_answer:
        last = next((x.strip() for x in reversed(text.split("\n")) if x.strip()), "")
        return Action(ANSWER, arg=clean_answer(last), explicit=False)
    return Action(INVALID, error="no tool call or answer found")


def truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [{len(text) - limit} more characters cut]"
