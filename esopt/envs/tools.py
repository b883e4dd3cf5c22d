"""Shared pieces of the tool-using text envs (math, countdown, docqa).

- `parse_action`: reads one agent reply as a tool call, a final answer, or neither. The protocol
  is deliberately plain and forgiving, for small models::

      calculator: 12*(3+4)          (also "calculator(12*(3+4))", "calc: ...")
      python:                       (followed by a ``` code block, or code on the next lines)
      read_page 2                   (tool name, then its argument after ":", a space, or "(...)")
      answer: 42                    (also "Final answer: 42", "**Answer:** 42", \\boxed{42},
                                     <answer>42</answer>, "The answer is 42")

  The first action line of the reply counts; text before it (reasoning) is ignored. A reply with no
  action line falls back to \\boxed{...}, <answer>...</answer>, "the answer is ...", and (python
  only) a bare ``` code block.
- `calculate` / `evaluate_expression`: a safe arithmetic evaluator on Python's `ast`: numbers,
  + - * / // % ** (or ^), parentheses and a few math functions; no names are ever evaluated, all
  integer and decimal arithmetic is exact (fractions), and powers/magnitudes are bounded.
- `parse_number`: a forgiving reader of a numeric final answer ("1,234", "$12.50", "x = 3", "42
  apples", "3/4").
- `hash_split` / `stable_int`: split assignment by a stable hash of a task's content, so train and
  eval tasks never overlap whatever seeds are used.
"""

from __future__ import annotations

import ast
import hashlib
import math
import operator
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Iterable, Sequence

from esopt.envs.base import held_out_split

# ----------------------------------------------------------------------------------------------
# Stable hashing and split assignment
# ----------------------------------------------------------------------------------------------

EVAL_BUCKETS = 2  # one task in EVAL_BUCKETS (by content hash) belongs to the eval split


def stable_int(text: str) -> int:
    """A 64-bit integer from a SHA-256 of `text` (stable across processes and machines)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "replace")).digest()[:8], "big")


def hash_split(namespace: str, key: str, buckets: int = EVAL_BUCKETS) -> str:
    """The split ("train", "val" or "eval") that a task with content `key` belongs to."""
    if stable_int(f"esopt-split|{namespace}|{key}") % buckets:
        return "train"
    return held_out_split(f"{namespace}|{key}")


def short_hash(text: str, n: int = 10) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:n]


# ----------------------------------------------------------------------------------------------
# Safe arithmetic
# ----------------------------------------------------------------------------------------------

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
class Evaluation:
    value: Number
    literals: list[Number]
    """Every numeric literal in the expression, in order of appearance, as written (unsigned)."""


class _Evaluator:
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
) -> Evaluation:
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
    ev = _Evaluator(allowed, functions=functions, unary=unary, ints_only=ints_only)
    try:
        value = ev.eval(tree)
    except CalcError:
        raise
    except (ZeroDivisionError,):
        raise CalcError("division by zero") from None
    except (ValueError, OverflowError, TypeError, ArithmeticError, RecursionError, MemoryError) as e:
        raise CalcError(f"could not evaluate: {type(e).__name__}") from None
    return Evaluation(value=value, literals=ev.literals)


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


# ----------------------------------------------------------------------------------------------
# Numeric answers
# ----------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------
# Action parsing
# ----------------------------------------------------------------------------------------------

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
