"""The operator task's arithmetic: the numbers in order, combined left to right, `((a o b) o c) ...`
(reasoning-gym's generator builds its targets this way before it shuffles the numbers)."""

from __future__ import annotations

import itertools
import re
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


def operator_choices(count: int):
    """Every choice of operators for `count` numbers: the 4^(count-1) tuples, in a fixed order."""
    return itertools.product(OPERATORS, repeat=count - 1)


def hitting_forms(numbers: list[int], target: int) -> list[str]:
    """The letter forms (`a + b`, `(a / b) * c`) of the operator choices whose value is the target."""
    letters = list(LETTERS[: len(numbers)])
    return [left_nested(letters, ops) for ops in operator_choices(len(numbers)) if left_nested_value(numbers, ops) == target]


def letter_form(numbers: list[int], answer: str) -> str:
    """`answer` with the numbers replaced by a, b, c, ... when it is a left-nested answer over them, else itself."""
    letters = list(LETTERS[: len(numbers)])
    for ops in operator_choices(len(numbers)):
        if answer.strip() == left_nested(numbers, ops):
            return left_nested(letters, ops)
    return answer


def value_lines(numbers: list[int], steps: int) -> list[str]:
    """`a o b = value` for every operator choice over the first steps + 1 numbers."""
    head = numbers[: steps + 1]
    return [f"{left_nested(head, ops)} = {left_nested_value(head, ops)}" for ops in operator_choices(len(head))]


def operator_slots_regex(numbers: list[int]) -> str:
    """A regex that admits exactly the left-nested expressions over `numbers` in order (any operators)."""
    # the operator slots are the only free choices: escape the rest, then open the slots
    template = re.escape(left_nested(numbers, ["@"] * (len(numbers) - 1)))
    return template.replace("@", "[-+*/]")
