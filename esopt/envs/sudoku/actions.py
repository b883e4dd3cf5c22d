"""Reading a Sudoku action from a reply: ``set <row> <col> <value>``, ``r<row>c<col>=<value>`` or JSON
``{"row": r, "col": c, "value": v}`` (case and whitespace tolerant; the first action found counts)."""

from __future__ import annotations

import json
import math
import re


_NUM = r"(-?\d+)"
# Applied to text whose whitespace runs are collapsed to one space, so every gap is bounded and the
# patterns cannot backtrack badly on huge inputs.
_SET_RE = re.compile(
    r"\bset ?\(? ?(?:row ?)?" + _NUM + r" ?[, ] ?(?:col(?:umn)? ?)?" + _NUM
    + r" ?(?:[, ]|=|:|->|to) ?(?:(?:val(?:ue)?|to|=) ?)?" + _NUM,
    re.IGNORECASE,
)
_RC_RE = re.compile(r"\br ?" + _NUM + r" ?c ?" + _NUM + r" ?(?:=|:) ?" + _NUM, re.IGNORECASE)
_JSON_RE = re.compile(r"\{[^{}]*\}")
_WS_RE = re.compile(r"\s+")
_KEYS = {"row": ("row", "r"), "col": ("col", "column", "c"), "value": ("value", "val", "digit", "v")}
_BIG = 10**9


def _to_int(s: str) -> int:
    s = s.strip()
    digits = s.lstrip("-")
    if not digits.isdigit():
        raise ValueError(s)
    if len(digits) > 9:  # avoids int() limits on huge digit strings; out of range anyway
        return -_BIG if s.startswith("-") else _BIG
    return int(s)


def _json_int(v) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return max(-_BIG, min(_BIG, v))
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        return max(-_BIG, min(_BIG, int(v)))
    if isinstance(v, str):
        try:
            return _to_int(v)
        except ValueError:
            return None
    return None


def _json_action(obj) -> tuple[int, int, int] | None:
    if not isinstance(obj, dict):
        return None
    lowered = {str(k).strip().lower(): v for k, v in obj.items()}
    vals = []
    for names in _KEYS.values():
        key = next((k for k in names if k in lowered), None)
        if key is None:
            return None
        v = _json_int(lowered[key])
        if v is None:
            return None
        vals.append(v)
    return vals[0], vals[1], vals[2]


def parse_action(text: str) -> tuple[int, int, int] | None:
    """(row, col, value) as written (1-based, not range-checked) from the first action in `text`,
    or None when no action is found. Never raises."""
    if not isinstance(text, str):
        return None
    try:
        flat = _WS_RE.sub(" ", text)
        found: list[tuple[int, tuple[int, int, int]]] = []
        for rx in (_SET_RE, _RC_RE):
            m = rx.search(flat)
            if m:
                found.append((m.start(), (_to_int(m[1]), _to_int(m[2]), _to_int(m[3]))))
        for m in _JSON_RE.finditer(flat):
            if found and m.start() > min(p for p, _ in found):
                break
            try:
                act = _json_action(json.loads(m.group()))
            except (ValueError, RecursionError):
                act = None
            if act is not None:
                found.append((m.start(), act))
                break
        if not found:
            return None
        return min(found, key=lambda f: f[0])[1]
    except Exception:  # defensive: the env must never raise on an action string
        return None
