"""Math word problems with a calculator and a Python tool, in a ReAct-style text protocol.

Problems come from reasoning-gym's procedural generators (offline, seeded); the default mix is
``basic_arithmetic``, ``gsm_symbolic`` and ``simple_equations``. Each reply is one action:

    calculator: 12*(3+4)             -> "calculator: 84"
    python:                          -> the program's stdout (run in esopt.sandbox, tight limits)
    ```python
    print(sum(range(10)))
    ```
    answer: 42                       -> ends the episode

(`tools.parse_action` also accepts "Final answer: 42", \\boxed{42}, <answer>42</answer>, "The
answer is 42", calculator(...) and a bare ```python block.) A malformed reply gets feedback and
uses up the turn (info["invalid"] = True); so does a tool call beyond `max_tool_calls`.

Reward, on the final turn only: `correct_reward` (1.0) when the answer is right, plus
`format_reward` when the answer is well formed (given with an answer marker, and a plain number
when the reference answer is a number), plus `tool_reward` when at least one tool call ran
without error; both bonuses default to 0. Running out of turns without an answer scores 0.
An answer is right when it equals the reference numerically (exact for integers, 1e-6 relative
otherwise), or, for non-numeric answers, when the generator's own `score_answer` gives 1.0, or
when math-verify finds them equivalent (only for short inputs without powers or factorials, so
no input can make sympy hang; math-verify runs without its signal-based timeout, which does not
work outside the main thread).

Splits: a problem belongs to train or eval by a hash of its question text, so the two never
overlap whatever the seeds; generator seeds also differ per (split, seed), and questions are
de-duplicated within a call.

Task data: ``{"generator", "question", "answer", "entry"}`` where ``entry`` is the generator's
JSON-safe record (question, answer, metadata) that its scorer reads.
"""

from __future__ import annotations

import json
import logging
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from esopt.confutil import ConfigError, is_int, is_number, opt
from esopt.sandbox import ISOLATIONS, IsolationUnavailable, Limits, require_isolation, run_script
from esopt.envs.base import Env, Episode, StepResult, Task, check_split
from esopt.envs.splits import hash_split, short_hash, stable_int
from esopt.envs.tools.actions import ANSWER, TOOL, parse_action, parse_number, truncate
from esopt.envs.tools.calculator import calculate

DEFAULT_GENERATORS = ["basic_arithmetic", "gsm_symbolic", "simple_equations"]
TOOLS = ("calculator", "python")
_DATASET_SIZE = 200_000  # virtual size of each generator stream (items are made on demand)
_RESERVED_OPTIONS = {"seed", "size"}


def _registry() -> dict:
    from reasoning_gym.factory import DATASETS  # imported lazily: only this env needs it

    return DATASETS


def _create_dataset(name: str, seed: int, size: int, options: dict):
    import reasoning_gym

    return reasoning_gym.create_dataset(name, seed=seed, size=size, **options)




@dataclass
class MathConfig:
    generators: list[str] = opt(
        list(DEFAULT_GENERATORS), "reasoning-gym generators to draw problems from (dataset names)."
    )
    weights: list[float] | None = opt(None, "Mixing weights, one per generator; None = uniform.")
    generator_options: dict = opt(
        {},
        "Per-generator options passed to reasoning_gym.create_dataset, e.g. "
        "{basic_arithmetic: {max_terms: 3, max_digits: 2}} (difficulty knobs; not seed/size).",
    )
    tools: list[str] = opt(["calculator", "python"], "Enabled tools: any of calculator, python.")
    max_turns: int = opt(4, "Turns per episode (tool calls and the final answer all count).")
    max_tool_calls: int = opt(3, "Tool calls allowed per episode; further calls are rejected.")
    correct_reward: float = opt(1.0, "Reward for a correct final answer.")
    format_reward: float = opt(0.0, "Bonus for a well-formed final answer (right or wrong).")
    tool_reward: float = opt(
        0.0, "Bonus at the final answer when at least one tool call ran without error."
    )
    use_math_verify: bool = opt(True, "Also accept answers math-verify finds equivalent.")
    python_timeout_s: float = opt(5.0, "Wall-clock limit of one python tool call, seconds.")
    python_memory_mb: int = opt(512, "Memory limit of one python tool call, MiB.")
    python_isolation: str = opt(
        "bwrap",
        "Containment of the python tool: bwrap (OS isolation; the env is refused when it cannot be set up) or "
        "python (the in-process audit hook and rlimits only: not a security boundary).",
    )
    max_observation_chars: int = opt(600, "Tool output longer than this is cut.")

    def __post_init__(self) -> None:
        gens = self.generators
        if not isinstance(gens, (list, tuple)) or not gens or not all(isinstance(g, str) for g in gens):
            raise ConfigError(f"math.generators must be a non-empty list of names, got {gens!r}")
        self.generators = list(gens)
        known = _registry()
        unknown = [g for g in self.generators if g not in known]
        if unknown:
            raise ConfigError(
                f"math.generators: unknown reasoning-gym dataset(s) {', '.join(unknown)}; "
                f"e.g. {', '.join(DEFAULT_GENERATORS)}"
            )
        if len(set(self.generators)) != len(self.generators):
            raise ConfigError(f"math.generators lists a name twice: {self.generators}")
        if self.weights is not None:
            w = self.weights
            if (
                not isinstance(w, (list, tuple))
                or len(w) != len(self.generators)
                or not all(is_number(x) and x >= 0 for x in w)
                or sum(w) <= 0
            ):
                raise ConfigError(
                    f"math.weights must be None or {len(self.generators)} non-negative numbers "
                    f"with a positive sum, got {w!r}"
                )
            self.weights = [float(x) for x in w]
        if not isinstance(self.generator_options, dict):
            raise ConfigError(f"math.generator_options must be a mapping, got {self.generator_options!r}")
        for name, options in self.generator_options.items():
            where = f"math.generator_options.{name}"
            if name not in self.generators:
                raise ConfigError(f"{where}: {name!r} is not in math.generators {self.generators}")
            if not isinstance(options, dict):
                raise ConfigError(f"{where} must be a mapping of options, got {options!r}")
            bad = sorted(_RESERVED_OPTIONS & set(options))
            if bad:
                raise ConfigError(f"{where}: {', '.join(bad)} is set by the env, not by options")
            try:
                _create_dataset(name, 0, 1, options)[0]
            except (TypeError, AssertionError, ValueError) as e:
                raise ConfigError(f"{where}: invalid options ({type(e).__name__}: {e})") from None
        if (
            not isinstance(self.tools, (list, tuple))
            or not all(isinstance(t, str) for t in self.tools)
            or not set(self.tools) <= set(TOOLS)
        ):
            raise ConfigError(f"math.tools must be a list drawn from {list(TOOLS)}, got {self.tools!r}")
        self.tools = [t for t in TOOLS if t in self.tools]
        if not is_int(self.max_turns) or self.max_turns < 1:
            raise ConfigError(f"math.max_turns must be an integer >= 1, got {self.max_turns!r}")
        if not is_int(self.max_tool_calls) or self.max_tool_calls < 0:
            raise ConfigError(f"math.max_tool_calls must be an integer >= 0, got {self.max_tool_calls!r}")
        for name in ("correct_reward", "format_reward", "tool_reward"):
            if not is_number(getattr(self, name)):
                raise ConfigError(f"math.{name} must be a number, got {getattr(self, name)!r}")
        if not isinstance(self.use_math_verify, bool):
            raise ConfigError(f"math.use_math_verify must be true or false, got {self.use_math_verify!r}")
        if not is_number(self.python_timeout_s) or not 0 < self.python_timeout_s <= 120:
            raise ConfigError(f"math.python_timeout_s must be in (0, 120], got {self.python_timeout_s!r}")
        if not is_int(self.python_memory_mb) or self.python_memory_mb < 64:
            raise ConfigError(f"math.python_memory_mb must be an integer >= 64, got {self.python_memory_mb!r}")
        if self.python_isolation not in ISOLATIONS:
            raise ConfigError(f"math.python_isolation must be one of {', '.join(ISOLATIONS)}, got {self.python_isolation!r}")
        if not is_int(self.max_observation_chars) or self.max_observation_chars < 20:
            raise ConfigError(
                f"math.max_observation_chars must be an integer >= 20, got {self.max_observation_chars!r}"
            )


# ----------------------------------------------------------------------------------------------
# Answer checking
# ----------------------------------------------------------------------------------------------

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


def _json_safe(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


# ----------------------------------------------------------------------------------------------
# Env
# ----------------------------------------------------------------------------------------------


class MathEnv(Env):
    """reasoning-gym math problems; calculator/python tools; reward for the final answer."""

    name = "math"
    Config = MathConfig

    def __init__(self, config: MathConfig | None = None):
        super().__init__(config)
        self.config: MathConfig
        self._streams: dict[tuple[str, int], Any] = {}
        self._scorers: dict[str, Any] = {}
        if "python" in self.config.tools and self.config.max_tool_calls > 0:
            try:  # refuse now rather than fail every python call of a run
                require_isolation(self.config.python_isolation)
            except IsolationUnavailable as e:
                raise ConfigError(f"math.python_isolation: {e}") from None

    @property
    def max_turns(self) -> int:
        return self.config.max_turns

    @property
    def system_prompt(self) -> str:
        c = self.config
        lines = ["Solve the math problem. Each reply must be ONE of these:"]
        if "calculator" in c.tools:
            lines.append("calculator: <expression>   (example: calculator: 12*(3+4))")
        if "python" in c.tools:
            lines.append("python: then a ```python code block``` that prints the result")
        lines.append("answer: <final answer>   (example: answer: 42)")
        if c.tools and c.max_tool_calls > 0:
            lines.append("A tool's result comes back as the next message.")
        lines.append(
            f"You have {c.max_turns} turn{'s' if c.max_turns != 1 else ''}; "
            "reply with answer: before they run out. Put only the final value after answer:."
        )
        return "\n".join(lines)

    # -- tasks ---------------------------------------------------------------------------------

    def _options(self, name: str) -> dict:
        return dict(self.config.generator_options.get(name, {}))

    def _stream(self, name: str, seed: int):
        key = (name, seed)
        if key not in self._streams:
            if len(self._streams) > 64:
                self._streams.clear()
            self._streams[key] = _create_dataset(name, seed, _DATASET_SIZE, self._options(name))
        return self._streams[key]

    def scorer(self, name: str):
        """A dataset object of generator `name`, used only for its `score_answer`."""
        if name not in self._scorers:
            try:
                self._scorers[name] = _create_dataset(name, 0, 1, self._options(name))
            except Exception:
                self._scorers[name] = None
        return self._scorers[name]

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if not is_int(n) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        c = self.config
        rng = random.Random(stable_int(f"esopt-math|{split}|{seed}"))
        streams = {g: self._stream(g, stable_int(f"esopt-math-gen|{g}|{split}|{seed}") % 2**31) for g in c.generators}
        cursor = {g: 0 for g in c.generators}
        seen: set[str] = set()
        out: list[Task] = []
        budget = 200 * n + 1000
        while len(out) < n:
            budget -= 1
            if budget < 0:
                raise RuntimeError(
                    f"math: could not draw {n} distinct {split} problems from {c.generators}; "
                    "the generators' settings allow too few different questions"
                )
            gen = rng.choices(c.generators, weights=c.weights)[0]
            idx = cursor[gen]
            cursor[gen] += 1
            if idx >= _DATASET_SIZE:
                continue
            try:
                entry = streams[gen][idx]
            except Exception:  # a generator that fails on this index: skip it
                continue
            question = " ".join(str(entry["question"]).split())
            if question in seen or hash_split("math", question) != split:
                continue
            seen.add(question)
            entry = _json_safe({"question": entry["question"], "answer": entry["answer"], "metadata": entry.get("metadata", {})})
            out.append(
                Task(
                    id=f"math-{gen}-{short_hash(question)}",
                    data={
                        "generator": gen,
                        "question": str(entry["question"]),
                        "answer": str(entry["answer"]),
                        "entry": entry,
                    },
                )
            )
        return out

    def oracle(self, task: Task):
        """Answer with the generator's reference answer."""
        return lambda observation: f"answer: {task.data['answer']}"

    def start(self, task: Task) -> "MathEpisode":
        return MathEpisode(self, task)


class MathEpisode(Episode):
    def __init__(self, env: MathEnv, task: Task):
        self.env = env
        self.config: MathConfig = env.config
        self.task = task
        self.turn = 0
        self.tool_calls = 0
        self.tool_successes = 0
        self.done = False
        c = self.config
        hint = "Reply with answer: <final answer>"
        if c.tools and c.max_tool_calls > 0:
            hint += " or use a tool (" + ", ".join(f"{t}:" for t in c.tools) + ")"
        self._observation = f"{task.data['question'].strip()}\n\n{hint}."

    @property
    def observation(self) -> str:
        return self._observation

    def _turns_note(self) -> str:
        left = self.config.max_turns - self.turn
        if left == 1:
            return "Last turn: reply with answer: <final answer>."
        return f"Turns left: {left}."

    def _run_tool(self, tool: str, arg: str) -> tuple[str, bool]:
        """(observation text, ran without error)."""
        c = self.config
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

    def _well_formed(self, answer: str, explicit: bool) -> bool:
        if not explicit or not answer or len(answer) > 100:
            return False
        if parse_number(str(self.task.data.get("answer", ""))) is not None:
            return parse_number(answer) is not None
        return True

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult(self._observation, 0.0, True, {"invalid": True, "error": "the episode is already over"})
        c = self.config
        self.turn += 1
        info: dict = {"invalid": False, "turn": self.turn}
        reward = 0.0
        try:
            act = parse_action(action, c.tools)
        except Exception:  # parse_action never raises; belt and braces
            act = None
        if act is not None and act.kind == ANSWER and act.arg.strip():
            answer = act.arg.strip()
            entry = self.task.data.get("entry") or {"answer": self.task.data.get("answer", "")}
            correct = check_answer(answer, entry, self.env.scorer(self.task.data.get("generator", "")), c.use_math_verify)
            well_formed = self._well_formed(answer, act.explicit)
            reward = (
                c.correct_reward * correct
                + c.format_reward * well_formed
                + c.tool_reward * (self.tool_successes > 0)
            )
            self.done = True
            info.update(success=correct, answer=answer, well_formed=well_formed, tool_calls=self.tool_calls)
            feedback = "Correct!" if correct else "Incorrect."
            self._observation = f"{feedback} The episode is over."
            return StepResult(self._observation, float(reward), True, info)
        if act is not None and act.kind == TOOL:
            if self.tool_calls >= c.max_tool_calls:
                info["invalid"] = True
                info["error"] = "no tool calls left"
                feedback = "No tool calls left. Reply with answer: <final answer>."
            else:
                self.tool_calls += 1
                feedback, ok = self._run_tool(act.tool, act.arg)
                self.tool_successes += ok
                info["tool"] = act.tool
                info["tool_ok"] = ok
                if act.tool == "python":
                    info["isolation"] = c.python_isolation
        else:
            info["invalid"] = True
            info["error"] = "empty answer" if act is not None and act.kind == ANSWER else (
                act.error if act is not None else "unreadable reply"
            )
            tools = "".join(
                {"calculator": "calculator: <expression>\n", "python": "python: ```python code```\n"}[t]
                for t in c.tools
            ) if c.max_tool_calls > 0 else ""
            feedback = f"Invalid reply ({info['error']}). Reply with one of:\n{tools}answer: <final answer>"
        if self.turn >= c.max_turns:
            self.done = True
            info.update(success=False, answer=None, tool_calls=self.tool_calls)
            self._observation = f"{feedback}\nOut of turns without an answer. The episode is over."
            return StepResult(self._observation, 0.0, True, info)
        self._observation = f"{feedback}\n{self._turns_note()}"
        return StepResult(self._observation, 0.0, False, info)
