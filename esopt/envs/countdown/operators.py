"""The operator task's arithmetic: the numbers in order, combined left to right, `((a o b) o c) ...`
(reasoning-gym's generator builds its targets this way before it shuffles the numbers)."""

from __future__ import annotations

from fractions import Fraction

OPERATORS = "+-*/"
LETTERS = "abcdefghijkl"  # the numbers' names in templates such as `(a / b) * c` (countdown allows up to 12)


def left_nested(numbers: list[int], ops) -> str:
    """`(a o b) o c ...`: the numbers in order, combined left to right with `ops` (one fewer than numbers)."""
    text = str(numbers[0])
    for i, (op, number) in enumerate(zip(ops, numbers[1:])):
        text = f"{text} {op} {number}" if i == 0 else f"({text}) {op} {number}"
    return text


def left_nested_value(numbers: list[int], ops) -> Fraction:
    """The exact value of `left_nested(numbers, ops)` (countdown's numbers are >= 1: no division by zero)."""
    value = Fraction(numbers[0])
    for op, number in zip(ops, numbers[1:]):
        if op == "+":
            value += number
        elif op == "-":
            value -= number
        elif op == "*":
            value *= number
        else:
            value /= number
    return value
