"""Prompts and reply parsing for the AHD outer loops (independent sampling and EoH).

Pure functions, no model and no I/O: extracting code and a one-sentence thought from an LLM reply,
normalising code for duplicate detection, the EoH operators' prompts (i1, e1, e2, m1, m2) and
EoH's rank-based parent selection.
"""

from __future__ import annotations

import ast
import io
import random
import re
import tokenize
from dataclasses import dataclass
from typing import Sequence

__all__ = [
    "EOH_OPERATORS",
    "OPERATOR_PARENTS",
    "ExtractionError",
    "Parent",
    "SYSTEM_PROMPT",
    "extract_code",
    "extract_thought",
    "normalise_code",
    "operator_prompt",
    "rank_weights",
    "sample_prompt",
    "select_parents",
]

SYSTEM_PROMPT = (
    "You are an expert in algorithm design for combinatorial optimisation. "
    "You answer with a short idea and complete, runnable Python code."
)

EOH_OPERATORS = ("i1", "e1", "e2", "m1", "m2")
OPERATOR_PARENTS = {"i1": 0, "e1": None, "e2": None, "m1": 1, "m2": 1}
"""Parents an operator needs: None = the configured number for crossover (e1, e2)."""


class ExtractionError(ValueError):
    """The reply holds no usable Python code; the message is the candidate's `reason`."""


# ------------------------------------------------------------------------------------------ parsing
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([A-Za-z0-9_+.-]*)[^\n]*$", re.MULTILINE)
_CODE_START = re.compile(r"^(def |async def |class |import |from \S+ import |@)")
_TOP_LEVEL_CODE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*\s*[+\-*/]?=[^=]|#|if __name__)")


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of every fenced block; an unclosed last fence runs to the end of the text."""
    blocks = []
    pos = 0
    while True:
        opening = _FENCE.search(text, pos)
        if opening is None:
            break
        fence, lang = opening.group(1), opening.group(2).lower()
        body_start = opening.end() + 1
        closing = re.compile(r"^[ \t]*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}[ \t]*$", re.MULTILINE)
        end = closing.search(text, body_start)
        if end is None:
            blocks.append((lang, text[body_start:]))
            break
        blocks.append((lang, text[body_start:end.start()]))
        pos = end.end()
    return blocks


def _unfenced_code(text: str, function_name: str) -> str | None:
    """Code written as plain text: from the imports before `def function_name` through its body,
    stopping at the first unindented line that reads like prose."""
    lines = text.splitlines()
    def_at = next((i for i, ln in enumerate(lines) if re.match(rf"(async\s+)?def\s+{re.escape(function_name)}\b", ln)), None)
    if def_at is None:
        def_at = next((i for i, ln in enumerate(lines) if re.match(r"(async\s+)?def\s+\w+", ln)), None)
    if def_at is None:
        return None
    start = def_at
    while start > 0 and (not lines[start - 1].strip() or _CODE_START.match(lines[start - 1])
                         or _TOP_LEVEL_CODE.match(lines[start - 1])):
        start -= 1
    end = def_at + 1
    while end < len(lines):
        ln = lines[end]
        if ln.strip() and not ln[0].isspace() and not (_CODE_START.match(ln) or _TOP_LEVEL_CODE.match(ln)):
            break
        end += 1
    return "\n".join(lines[start:end])


def _defines(code: str, function_name: str) -> bool:
    return re.search(rf"^(async\s+)?def\s+{re.escape(function_name)}\s*\(", code, re.MULTILINE) is not None


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def _repair_truncated(code: str, function_name: str) -> str | None:
    """A reply cut by max_new_tokens ends mid-statement: drop trailing lines until the code parses
    (keeping the function's definition); None if no prefix parses."""
    lines = code.rstrip().splitlines()
    for end in range(len(lines) - 1, 0, -1):
        prefix = "\n".join(lines[:end]).rstrip()
        if prefix.endswith(":"):
            continue
        if _defines(prefix, function_name) and _parses(prefix):
            return prefix
    return None


def extract_code(reply: str, function_name: str) -> str:
    """The Python source in `reply` that defines `function_name`.

    Looks at fenced blocks first (```python preferred, an unclosed fence runs to the end of the
    reply), then at unfenced code starting at a `def`. A reply truncated mid-statement is cut back
    to its longest prefix that parses. `import numpy as np` is added when the code uses `np.`
    without importing it. Raises ExtractionError (its message is a one-line reason) when there is
    no code, the function is missing, or the code does not parse.
    """
    if not isinstance(reply, str) or not reply.strip():
        raise ExtractionError("empty reply")
    candidates: list[str] = []
    blocks = _fenced_blocks(reply)
    python_first = sorted(blocks, key=lambda b: 0 if b[0] in ("python", "py", "python3") else 1)
    candidates += [body for _, body in python_first if _defines(body, function_name)]
    unfenced = _unfenced_code(reply, function_name)
    if unfenced is not None and _defines(unfenced, function_name):
        candidates.append(unfenced)
    if not candidates:
        if blocks or unfenced is not None:
            raise ExtractionError(f"the reply's code does not define a function named {function_name!r}")
        raise ExtractionError("no Python code found in the reply")
    first_error = None
    for code in candidates:
        code = code.strip("\n").rstrip()
        if "\t" in code and not _parses(code):
            code = code.expandtabs(4)
        if _parses(code):
            return _add_imports(code)
        if first_error is None:
            try:
                ast.parse(code)
            except SyntaxError as e:
                first_error = f"SyntaxError: {e.msg} (line {e.lineno})"
            except ValueError as e:
                first_error = f"unparsable code: {e}"
        repaired = _repair_truncated(code, function_name)
        if repaired is not None:
            return _add_imports(repaired)
    raise ExtractionError(first_error or "unparsable code")


def _add_imports(code: str) -> str:
    if re.search(r"\bnp\.", code) and not re.search(r"^\s*import numpy as np\b", code, re.MULTILINE):
        code = "import numpy as np\n\n" + code
    return code + "\n"


def extract_thought(reply: str) -> str:
    """The one-sentence idea EoH asks for in braces ({...}) outside the code; else the first line
    of prose before the code; else ''."""
    prose = reply
    for _, body in _fenced_blocks(reply):
        prose = prose.replace(body, "\n")
    match = re.search(r"\{([^{}]{3,}?)\}", prose, re.DOTALL)
    if match:
        return " ".join(match.group(1).split())[:500]
    for line in prose.splitlines():
        line = line.strip().strip("`").strip()
        if len(line) > 10 and not _CODE_START.match(line) and not line.startswith(("```", "~~~")):
            return line[:300]
    return ""


def normalise_code(code: str) -> str:
    """A canonical form for duplicate detection: the AST without docstrings, comments or formatting
    (falls back to comment- and whitespace-stripped text when the code does not parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        try:
            toks = [t.string for t in tokenize.generate_tokens(io.StringIO(code).readline)
                    if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE,
                                      tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)]
            return " ".join(toks)
        except (tokenize.TokenError, IndentationError, SyntaxError):
            return " ".join(code.split())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


# ------------------------------------------------------------------------------------------ prompts
@dataclass
class Parent:
    """What a prompt shows of an existing heuristic."""

    thought: str
    code: str
    objective: float


def _score_text(objective: float, sense: str) -> str:
    better = "lower" if sense == "min" else "higher"
    return f"score {objective:.6g} ({better} is better)"


def _answer_format(function_name: str, thought: bool) -> str:
    if thought:
        return (f"First, describe the idea of your heuristic in one sentence inside braces, like {{your idea}}. "
                f"Then write the complete Python function `{function_name}` (with its imports) in one "
                f"```python code block. Do not give any other explanation.")
    return (f"Write the complete Python function `{function_name}` (with its imports) in one ```python code "
            f"block. Do not give any other explanation.")


def sample_prompt(task_prompt: str, function_name: str) -> str:
    """The fixed prompt of independent sampling: the task, its signature and example, and the format."""
    return (f"{task_prompt.rstrip()}\n\nWrite a better heuristic than the example. "
            + _answer_format(function_name, thought=False))


def _parents_text(parents: Sequence[Parent], sense: str) -> str:
    parts = []
    for k, p in enumerate(parents, 1):
        idea = p.thought or "(no description)"
        parts.append(f"Heuristic {k} ({_score_text(p.objective, sense)}): {idea}\n"
                     f"```python\n{p.code.strip()}\n```")
    return "\n\n".join(parts)


def operator_prompt(operator: str, task_prompt: str, task_description: str, signature: str,
                    function_name: str, sense: str, parents: Sequence[Parent] = ()) -> str:
    """The EoH prompt for `operator` (i1: new from scratch; e1: different from the parents; e2: from
    the parents' common idea; m1: modify one; m2: change one's parameters)."""
    if operator not in EOH_OPERATORS:
        raise ValueError(f"unknown EoH operator {operator!r}; expected one of {', '.join(EOH_OPERATORS)}")
    need = OPERATOR_PARENTS[operator]
    if need == 0:
        return (f"{task_prompt.rstrip()}\n\nDesign a new heuristic for this problem. "
                + _answer_format(function_name, thought=True))
    if not parents or (need is not None and len(parents) != need):
        raise ValueError(f"operator {operator} needs {need or 'at least one'} parent(s), got {len(parents)}")
    head = f"{task_description.rstrip()}\n\nThe function to implement:\n{signature}\n\n"
    if operator == "e1":
        body = (f"I have {len(parents)} existing heuristics:\n\n{_parents_text(parents, sense)}\n\n"
                f"Create a new heuristic whose idea and form are totally different from all of them.")
    elif operator == "e2":
        body = (f"I have {len(parents)} existing heuristics:\n\n{_parents_text(parents, sense)}\n\n"
                f"Find the common backbone idea of these heuristics, then create a new heuristic built on "
                f"that idea but different in form from each of them.")
    elif operator == "m1":
        body = (f"I have one heuristic:\n\n{_parents_text(parents, sense)}\n\n"
                f"Create a new heuristic that is a modified, improved version of it.")
    else:  # m2
        body = (f"I have one heuristic:\n\n{_parents_text(parents, sense)}\n\n"
                f"Identify its main parameters (constants, weights, thresholds) and create a new heuristic "
                f"with different parameter settings that scores better.")
    return f"{head}{body} " + _answer_format(function_name, thought=True)


# ---------------------------------------------------------------------------------------- selection
def rank_weights(n: int) -> list[float]:
    """EoH's rank-based selection probabilities for a population sorted best first:
    p(rank r) proportional to 1 / (r + n), r = 0 for the best."""
    if n < 1:
        return []
    w = [1.0 / (r + n) for r in range(n)]
    total = sum(w)
    return [x / total for x in w]


def select_parents(ranked: Sequence, k: int, rng: random.Random) -> list:
    """Draw `k` distinct members of `ranked` (best first) with rank-based probabilities."""
    pool = list(range(len(ranked)))
    if k > len(pool):
        raise ValueError(f"cannot select {k} parents from a population of {len(pool)}")
    weights = rank_weights(len(ranked))
    chosen: list[int] = []
    for _ in range(k):
        w = [weights[i] for i in pool]
        i = rng.choices(pool, weights=w, k=1)[0]
        chosen.append(i)
        pool.remove(i)
    return [ranked[i] for i in chosen]
