"""Is a math answer right?

It is when it equals the reference numerically (exact for integers, 1e-6 relative otherwise), or,
for non-numeric answers, when the generator's own `score_answer` gives 1.0, or when math-verify
finds them equivalent (only for short inputs without powers or factorials, so no input can make
sympy hang; math-verify runs without its signal-based timeout, which does not work outside the
main thread).
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction
from typing import Any

from esopt.envs.tools.actions import parse_number

_MV_UNSAFE = re.compile(r"\^|\*\*|!|\d{40,}|\\(?:prod|sum|int|lim)")
_mv_logging_quiet = False


def numbers_match(pred: Fraction, gold: Fraction) -> bool:
    """Exact for integer references; within 1e-6 (relative, at least absolute) otherwise."""
    if pred == gold:
        return True
    if gold.denominator == 1:
        return False
    return abs(pred - gold) <= Fraction(1, 10**6) * max(1, abs(gold))


def _math_verify_equal(pred: str, gold: str) -> bool:
    global _mv_logging_quiet
    if len(pred) > 100 or len(gold) > 200 or _MV_UNSAFE.search(pred) or _MV_UNSAFE.search(gold):
        return False
    try:
        from math_verify import parse, verify
    except ImportError:  # optional dependency
        return False
    if not _mv_logging_quiet:  # it warns once per process that its timeout is off; we bound inputs
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        _mv_logging_quiet = True
    try:
        g = parse(gold, parsing_timeout=None)
        p = parse(pred, parsing_timeout=None)
        return bool(g) and bool(p) and bool(verify(g, p, timeout_seconds=None))
    except Exception:
        return False


def check_answer(pred: str, entry: dict, scorer: Any = None, use_math_verify: bool = True) -> bool:
    """Is `pred` a correct answer to the reasoning-gym record `entry`? See the module docstring."""
    if not isinstance(pred, str) or not pred.strip():
        return False
    gold = str(entry.get("answer", ""))
    g, p = parse_number(gold), parse_number(pred)
    if g is not None and p is not None:
        return numbers_match(p, g)
    if scorer is not None:
        try:
            if float(scorer.score_answer(pred, entry)) >= 1.0:
                return True
        except Exception:
            pass
    if use_math_verify:
        return _math_verify_equal(pred.strip(), gold.strip())
    return False
