"""The WebArena-style action language: parsing and the guided-decoding regex.

    click [id]                    click the element numbered id
    type [id] [text]              fill the field with text; a trailing [1] / [0] presses / does not
    type [id] [text] [0|1]        press Enter afterwards (the default follows WebArena: press Enter)
    select [id] [option]          choose an option (by its text or value) of a combobox
    scroll [up|down]              scroll the page by most of a screen
    go_back                       the browser's back button
    goto [url]                    open a URL of the site (absolute, or a path such as /shop/cart)
    stop [answer]                 end the episode; the answer is what string_match evaluators read

Parsing is slightly more lenient than `ACTION_REGEX` (keyword case, spacing, an action wrapped in a
``` fence as WebArena's prompts ask for); anything else is reported as invalid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ACTION_REGEX = (
    r"(click \[[0-9]+\]"
    r"|type \[[0-9]+\] \[[^\]\n]*\]( \[[01]\])?"
    r"|select \[[0-9]+\] \[[^\]\n]+\]"
    r"|scroll \[(up|down)\]"
    r"|go_back"
    r"|goto \[[^\]\s]+\]"
    r"|stop \[[^\]\n]*\])"
)

USAGE = (
    "click [id] | type [id] [text] | type [id] [text] [0] | select [id] [option] | scroll [down] | "
    "scroll [up] | go_back | goto [url] | stop [answer]"
)


@dataclass(frozen=True)
class Action:
    kind: str  # click, type, select, scroll, go_back, goto, stop
    element: int | None = None
    text: str = ""  # typed text, option, url, answer, or scroll direction
    enter: bool | None = None  # type only: explicit [0]/[1] flag, None = the env's default

    def __str__(self) -> str:
        if self.kind == "click":
            return f"click [{self.element}]"
        if self.kind == "type":
            flag = "" if self.enter is None else f" [{int(self.enter)}]"
            return f"type [{self.element}] [{self.text}]{flag}"
        if self.kind == "select":
            return f"select [{self.element}] [{self.text}]"
        if self.kind == "go_back":
            return "go_back"
        return f"{self.kind} [{self.text}]"


_F = re.IGNORECASE | re.DOTALL
_PATTERNS = [
    ("click", re.compile(r"click\s*\[\s*(\d+)\s*\]", _F)),
    ("type", re.compile(r"type\s*\[\s*(\d+)\s*\]\s*\[(.*?)\](?:\s*\[\s*([01])\s*\])?", _F)),
    ("select", re.compile(r"select\s*\[\s*(\d+)\s*\]\s*\[(.*)\]", _F)),
    ("scroll", re.compile(r"scroll\s*\[?\s*(up|down)\s*\]?", _F)),
    ("go_back", re.compile(r"go_back(?:\s*\[\s*\])?", _F)),
    ("goto", re.compile(r"goto\s*\[\s*(\S+?)\s*\]", _F)),
    ("stop", re.compile(r"stop(?:\s*\[(.*)\])?", _F)),
]
_FENCE = re.compile(r"```(?:[a-z]*\n)?(.*?)```", re.DOTALL)


def parse_action(raw: str) -> Action | str:
    """The action in `raw`, or an error message (a str) saying why there is none."""
    if not isinstance(raw, str):
        return "the action must be text"
    text = raw.strip()
    fenced = _FENCE.findall(text)
    if fenced:
        text = fenced[-1].strip()
    if not text:
        return "empty action"
    for kind, pattern in _PATTERNS:
        m = pattern.fullmatch(text)
        if not m:
            continue
        if kind == "click":
            return Action("click", int(m.group(1)))
        if kind == "type":
            flag = m.group(3)
            return Action("type", int(m.group(1)), m.group(2), None if flag is None else flag == "1")
        if kind == "select":
            option = m.group(2).strip()
            if not option:
                return "select needs an option: select [id] [option]"
            return Action("select", int(m.group(1)), option)
        if kind == "scroll":
            return Action("scroll", text=m.group(1).lower())
        if kind == "go_back":
            return Action("go_back")
        if kind == "goto":
            return Action("goto", text=m.group(1))
        if kind == "stop":
            return Action("stop", text=(m.group(1) or "").strip())
    word = text.split(maxsplit=1)[0].lower() if text.split() else ""
    known = {k for k, _ in _PATTERNS}
    if word in known:
        return f"could not read the arguments of {word!r}"
    return f"unknown action {text[:40]!r}"
