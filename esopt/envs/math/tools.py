"""The math env's tools: the calculator (exact arithmetic in process) and python (a program run in
esopt.sandbox under tight limits). A tool's errors come back as text; only a sandbox that cannot
isolate raises, since the code must then not run at all."""

from __future__ import annotations

from typing import TYPE_CHECKING

from esopt.envs.tools.actions import truncate
from esopt.envs.tools.calculator import calculate
from esopt.sandbox import IsolationUnavailable, Limits, run_script

if TYPE_CHECKING:
    from esopt.envs.math.env import MathConfig

TOOLS = ("calculator", "python")


def run_tool(tool: str, arg: str, c: MathConfig) -> tuple[str, bool]:
    """(observation text, ran without error)."""
    if tool == "calculator":
        if not arg.strip():
            return "calculator error: no expression. Example: calculator: 12*(3+4)", False
        result = calculate(arg)
        if result.startswith("error:"):
            return f"calculator {result}", False
        return f"calculator: {truncate(result, c.max_observation_chars)}", True
    if tool == "python":
        if not arg.strip():
            return "python error: no code. Put the code in a ```python block``` after python:", False
        try:
            res = run_script(
                arg,
                Limits(
                    timeout_s=float(c.python_timeout_s),
                    memory_mb=int(c.python_memory_mb),
                    max_output_chars=4 * c.max_observation_chars,
                    isolation=c.python_isolation,
                ),
            )
        except IsolationUnavailable:
            raise  # never run LLM code uncontained, never hide that as a tool error
        except Exception as e:  # the sandbox itself failed: report, never raise
            return f"python error: could not run the code ({type(e).__name__})", False
        out = (res.stdout or "").strip()
        if res.ok:
            if not out:
                return "python: (no output; use print() to show the result)", True
            return "python output:\n" + truncate(out, c.max_observation_chars), True
        msg = "python error: " + str(res.error or "the program failed")
        if out:
            msg = "python output:\n" + truncate(out, c.max_observation_chars // 2) + "\n" + msg
        return truncate(msg, c.max_observation_chars), False
    return f"unknown tool {tool}", False
