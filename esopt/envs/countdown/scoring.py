"""Scoring a countdown answer.

Reward (the ES-at-Scale paper's scheme, Qiu et al. 2025, after TinyZero): `format_reward` (0.1)
for a well-formed answer, plus `correct_reward` (1.0) when it also evaluates exactly to the
target; a correct answer therefore scores 1.1, a well-formed wrong one 0.1, anything else 0.

- Well formed: the answer parses as an arithmetic expression of whole-number literals, binary
  + - * /, and parentheses (no unary minus, no other operators or names), and every literal is
  one of the given numbers, each used at most as often as it is given; with `use_all_numbers`,
  every given number exactly once (so a lone given number earns no format reward there).
- Correct: well formed and evaluates (exact rational arithmetic; division by zero fails) to the
  target.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from esopt.envs.tools.calculator import CalcError, evaluate_expression

_OPS = ("+", "-", "*", "/")


@dataclass
class Score:
    reward: float
    well_formed: bool
    correct: bool
    value: Fraction | None
    error: str | None


def score_expression(
    expression: str,
    numbers: list[int],
    target: int,
    use_all_numbers: bool = False,
    format_reward: float = 0.1,
    correct_reward: float = 1.0,
    closeness_reward: float = 0.0,
) -> Score:
    """Score one countdown answer (see the module docstring). Never raises."""
    if not isinstance(expression, str) or len(expression) > 1000:
        return Score(0.0, False, False, None, "not an expression (or too long)")
    expr = _strip_equals(expression, target)
    try:
        ev = evaluate_expression(expr, ops=_OPS, functions=False, unary=False, ints_only=True)
        value, error = ev.value, None
        literals = ev.literals
    except CalcError as e:
        value, error = None, str(e)
        if str(e) != "division by zero":
            return Score(0.0, False, False, None, error)
        try:  # still well formed when only the value fails: collect its literals
            literals = _literals_only(expr)
        except CalcError as e2:
            return Score(0.0, False, False, None, str(e2))
    used = Counter(int(x) for x in literals)
    given = Counter(int(x) for x in numbers)
    extra = used - given
    if extra:
        bad = ", ".join(str(k) for k in sorted(extra))
        return Score(0.0, False, False, value, f"uses numbers not given (or too often): {bad}")
    if use_all_numbers and used != given:
        # not well formed under this rule: otherwise a lone given number would earn the format reward
        missing = ", ".join(str(k) for k in sorted(given - used))
        return Score(0.0, False, False, value, f"does not use every number exactly once (missing: {missing})")
    correct = value is not None and value == Fraction(int(target))
    if value is not None and not correct:
        error = f"evaluates to {_fmt(value)}, not {target}"
    reward = float(format_reward) + (float(correct_reward) if correct else 0.0)
    if closeness_reward and value is not None and not correct:
        reward += float(closeness_reward) * max(0.0, 1.0 - float(abs(value - target)) / target)
    return Score(reward, True, correct, value, error)


def _literals_only(expr: str) -> list[Fraction]:
    """Literals of an expression that parses under the countdown grammar but fails to evaluate."""
    import ast

    from esopt.envs.tools.calculator import normalize_expression

    try:
        tree = ast.parse(normalize_expression(expr), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalcError("could not parse the expression") from None
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            out.append(Fraction(node.value))
    return out


def _strip_equals(expression: str, target: int) -> str:
    """Drop a trailing "= <number>" (a model restating the target) and a leading "<target> =" ."""
    s = expression.strip()
    m = re.match(r"^(.*?)\s*=\s*-?\d+(?:\.\d+)?\s*$", s, re.DOTALL)
    if m and m.group(1).strip():
        s = m.group(1)
    m = re.match(r"^\s*-?\d+\s*=\s*(.+)$", s, re.DOTALL)
    if m:
        s = m.group(1)
    return s.strip()


def bare_expression(reply) -> str | None:
    """A reply with no answer marker counts as an answer when it (or its last non-empty line) is
    just an arithmetic expression over whole numbers."""
    if not isinstance(reply, str):
        return None
    lines = [x.strip().strip("`").strip() for x in reply.strip().split("\n") if x.strip()]
    for cand in ([lines[-1]] if lines else []):
        if len(cand) <= 200 and re.fullmatch(r"[\d\s+\-*/×÷()=.]+", cand) and re.search(r"\d", cand):
            return cand
    return None


def _fmt(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"
