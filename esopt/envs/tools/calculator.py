"""`calculate` / `evaluate_expression`: a safe arithmetic evaluator on Python's `ast` (the calculator
tool of the math and countdown envs): numbers, + - * / // % ** (or ^), parentheses and a few math
functions; no names are ever evaluated, all integer and decimal arithmetic is exact (fractions), and
powers/magnitudes are bounded."""

from __future__ import annotations

import ast
import math
import operator
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Iterable

MAX_EXPR_CHARS = 300
MAX_NODES = 200
MAX_BITS = 4096  # about 1230 decimal digits for a numerator or denominator
MAX_EXPONENT = 10_000


class CalcError(ValueError):
    """The expression is not allowed or cannot be evaluated; the message is shown to the agent."""


Number = Fraction | float


def _check(x: Number) -> Number:
    if isinstance(x, Fraction):
        if x.numerator.bit_length() > MAX_BITS or x.denominator.bit_length() > MAX_BITS:
            raise CalcError("number too large")
        return x
    if isinstance(x, complex):
        raise CalcError("complex result")
    if not math.isfinite(x):
        raise CalcError("result is not a finite number")
    return x


def _to_float(x: Number) -> float:
    try:
        return float(x)
    except OverflowError:
        raise CalcError("number too large") from None


def _pow(a: Number, b: Number) -> Number:
    if isinstance(b, Fraction) and b.denominator == 1 and isinstance(a, Fraction):
        e = b.numerator
        if abs(e) > MAX_EXPONENT:
            raise CalcError("exponent too large")
        if a == 0 and e < 0:
            raise CalcError("division by zero")
        bits = max(a.numerator.bit_length(), a.denominator.bit_length())
        if a not in (0, 1, -1) and (bits - 1) * abs(e) > MAX_BITS:
            raise CalcError("number too large")
        return a**e
    fa, fb = _to_float(a), _to_float(b)
    if fa < 0 and fb != int(fb):
        raise CalcError("fractional power of a negative number")
    if fa == 0 and fb < 0:
        raise CalcError("division by zero")
    try:
        return math.pow(fa, fb)
    except OverflowError:
        raise CalcError("number too large") from None


def _div(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalcError("division by zero")
    return a / b


def _floordiv(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalcError("division by zero")
    r = a // b
    return Fraction(r) if isinstance(r, int) else r


def _mod(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalcError("division by zero")
    return a % b


_BINOPS: dict[type, tuple[str, Callable[[Number, Number], Number]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", _div),
    ast.FloorDiv: ("//", _floordiv),
    ast.Mod: ("%", _mod),
    ast.Pow: ("**", _pow),
}


def _int_arg(x: Number, name: str, hi: int) -> int:
    if isinstance(x, float):
        if x != int(x):
            raise CalcError(f"{name} needs an integer")
        x = Fraction(int(x))
    if x.denominator != 1 or not 0 <= x.numerator <= hi:
        raise CalcError(f"{name} needs an integer in 0..{hi}")
    return x.numerator


def _fn_round(x: Number, nd: Number | None = None) -> Number:
    if nd is None:
        return Fraction(round(x))
    return Fraction(round(Fraction(x), _int_arg(nd, "round digits", 50)))


def _fn_float(f: Callable[[float], float]) -> Callable[[Number], Number]:
    def g(x: Number) -> Number:
        try:
            return f(_to_float(x))
        except (ValueError, OverflowError):
            raise CalcError("math domain error") from None

    return g


def _fn_sqrt(x: Number) -> Number:
    if x < 0:
        raise CalcError("square root of a negative number")
    if isinstance(x, Fraction):
        rn, rd = math.isqrt(x.numerator), math.isqrt(x.denominator)
        if rn * rn == x.numerator and rd * rd == x.denominator:
            return Fraction(rn, rd)
    return math.sqrt(_to_float(x))


def _fn_log(x: Number, base: Number | None = None) -> Number:
    try:
        return math.log(_to_float(x)) if base is None else math.log(_to_float(x), _to_float(base))
    except (ValueError, ZeroDivisionError):
        raise CalcError("math domain error") from None


FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int]] = {
    # name: (function, min args, max args)
    "sqrt": (_fn_sqrt, 1, 1),
    "abs": (abs, 1, 1),
    "round": (_fn_round, 1, 2),
    "floor": (lambda x: Fraction(math.floor(x)), 1, 1),
    "ceil": (lambda x: Fraction(math.ceil(x)), 1, 1),
    "min": (min, 1, 20),
    "max": (max, 1, 20),
    "log": (_fn_log, 1, 2),
    "ln": (_fn_log, 1, 1),
    "log10": (_fn_float(math.log10), 1, 1),
    "log2": (_fn_float(math.log2), 1, 1),
    "exp": (_fn_float(math.exp), 1, 1),
    "sin": (_fn_float(math.sin), 1, 1),
    "cos": (_fn_float(math.cos), 1, 1),
    "tan": (_fn_float(math.tan), 1, 1),
    "factorial": (lambda x: Fraction(math.factorial(_int_arg(x, "factorial", 300))), 1, 1),
}
CONSTANTS: dict[str, Number] = {"pi": math.pi, "e": math.e}

_REPLACEMENTS = {"^": "**", "×": "*", "·": "*", "÷": "/", "−": "-", "–": "-"}


def normalize_expression(text: str) -> str:
    """Forgiving clean-up of an arithmetic expression as a small model writes it: surrounding
    backticks/`$`, a trailing "=" or "= ?", ^ for power, ×/÷ signs, thousands separators."""
    s = text.strip().strip("`").strip()
    if s.startswith("$") and s.endswith("$") and len(s) > 1:
        s = s.strip("$").strip()
    for a, b in _REPLACEMENTS.items():
        s = s.replace(a, b)
    s = re.sub(r"\s*=\s*\??\s*$", "", s)
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s) if not re.search(r"[A-Za-z_]\s*\(", s) else s
    return s.strip()


@dataclass
class ExpressionValue:
    value: Number
    literals: list[Number]
    """Every numeric literal in the expression, in order of appearance, as written (unsigned)."""


class _ExpressionEvaluator:
    def __init__(
        self,
        ops: Iterable[type] | None = None,
        functions: bool = True,
        unary: bool = True,
        ints_only: bool = False,
    ):
        self.ops = set(ops) if ops is not None else set(_BINOPS)
        self.functions = functions
        self.unary = unary
        self.ints_only = ints_only
        self.literals: list[Number] = []

    def eval(self, node: ast.AST) -> Number:
        if isinstance(node, ast.Expression):
            return self.eval(node.body)
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise CalcError(f"not a number: {v!r}")
            if self.ints_only and not isinstance(v, int):
                raise CalcError(f"only whole numbers are allowed, got {v!r}")
            x = Fraction(v) if isinstance(v, int) else _decimal_literal(v)
            self.literals.append(x)
            return _check(x)
        if isinstance(node, ast.BinOp):
            entry = _BINOPS.get(type(node.op))
            if entry is None or type(node.op) not in self.ops:
                raise CalcError(f"operator not allowed: {_op_name(node.op)}")
            a = self.eval(node.left)
            b = self.eval(node.right)
            return _check(entry[1](a, b))
        if isinstance(node, ast.UnaryOp):
            if not self.unary or not isinstance(node.op, (ast.UAdd, ast.USub)):
                raise CalcError("unary operators are not allowed" if not self.unary else "operator not allowed")
            x = self.eval(node.operand)
            return -x if isinstance(node.op, ast.USub) else x
        if isinstance(node, ast.Call) and self.functions:
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                name = node.func.id if isinstance(node.func, ast.Name) else "this call"
                raise CalcError(f"unknown function {name}; allowed: {', '.join(sorted(FUNCTIONS))}")
            if node.keywords:
                raise CalcError("keyword arguments are not allowed")
            fn, lo, hi = FUNCTIONS[node.func.id]
            if not lo <= len(node.args) <= hi:
                raise CalcError(f"{node.func.id} takes {lo}..{hi} arguments")
            args = [self.eval(a) for a in node.args]
            try:
                return _check(fn(*args))
            except CalcError:
                raise
            except (ValueError, OverflowError, TypeError, ZeroDivisionError) as e:
                raise CalcError(f"{node.func.id}: {e}") from None
        if isinstance(node, ast.Name) and self.functions and node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if isinstance(node, ast.Name):
            raise CalcError(f"unknown name {node.id!r}: only numbers and operators are allowed")
        raise CalcError(f"not allowed in an arithmetic expression: {type(node).__name__}")


def _decimal_literal(v: float) -> Fraction:
    """Exact value of a decimal literal as written (0.1 -> 1/10), via its shortest repr."""
    if not math.isfinite(v):
        raise CalcError("number too large")
    return Fraction(repr(v))


def _op_name(op: ast.AST) -> str:
    names = {ast.BitXor: "^", ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<", ast.RShift: ">>",
             ast.MatMult: "@"}
    for k, (sym, _) in _BINOPS.items():
        names[k] = sym
    return names.get(type(op), type(op).__name__)


def evaluate_expression(
    text: str,
    ops: Iterable[str] | None = None,
    functions: bool = True,
    unary: bool = True,
    ints_only: bool = False,
    normalize: bool = True,
) -> ExpressionValue:
    """Evaluate an arithmetic expression safely. `ops` restricts the binary operators (symbols,
    e.g. ``["+", "-", "*", "/"]``). Raises `CalcError` (with a short message) on anything else."""
    if not isinstance(text, str):
        raise CalcError("expected an expression")
    if len(text) > 4 * MAX_EXPR_CHARS:
        raise CalcError(f"expression too long (max {MAX_EXPR_CHARS} characters)")
    s = normalize_expression(text) if normalize else text.strip()
    if not s:
        raise CalcError("empty expression")
    if len(s) > MAX_EXPR_CHARS:
        raise CalcError(f"expression too long (max {MAX_EXPR_CHARS} characters)")
    allowed = None
    if ops is not None:
        by_symbol = {sym: k for k, (sym, _) in _BINOPS.items()}
        allowed = [by_symbol[o] for o in ops]
    try:
        tree = ast.parse(s, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalcError("could not parse the expression") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalcError("expression too long")
    ev = _ExpressionEvaluator(allowed, functions=functions, unary=unary, ints_only=ints_only)
    try:
        value = ev.eval(tree)
    except CalcError:
        raise
    except (ZeroDivisionError,):
        raise CalcError("division by zero") from None
    except (ValueError, OverflowError, TypeError, ArithmeticError, RecursionError, MemoryError) as e:
        raise CalcError(f"could not evaluate: {type(e).__name__}") from None
    return ExpressionValue(value=value, literals=ev.literals)


def format_number(x: Number, digits: int = 12) -> str:
    """Integers exactly; other values with `digits` significant digits."""
    if isinstance(x, Fraction):
        if x.denominator == 1:
            return str(x.numerator)
        x = _to_float(x)
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.{digits}g}"


def calculate(text: str) -> str:
    """The calculator tool: the result as text, or "error: ..." (never raises)."""
    try:
        return format_number(evaluate_expression(text).value)
    except CalcError as e:
        return f"error: {e}"
    except Exception as e:  # defensive: a tool must never crash the env
        return f"error: {type(e).__name__}"

