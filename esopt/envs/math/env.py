"""Math word problems with a calculator and a Python tool, in a ReAct-style text protocol.

Problems come from reasoning-gym's procedural generators (`problems.py`: drawing them, splits, task
data); the default mix is ``basic_arithmetic``, ``gsm_symbolic`` and ``simple_equations``. Each reply
is one action:

    calculator: 12*(3+4)             -> "calculator: 84"
    python:                          -> the program's stdout (run in esopt.sandbox, tight limits)
    ```python
    print(sum(range(10)))
    ```
    answer: 42                       -> ends the episode

(`esopt.envs.tools.actions.parse_action` also accepts "Final answer: 42", \\boxed{42}, <answer>42</answer>, "The
answer is 42", calculator(...) and a bare ```python block.) A malformed reply gets feedback and
uses up the turn (info["invalid"] = True); so does a tool call beyond `max_tool_calls`.

Reward, on the final turn only: `correct_reward` (1.0) when the answer is right (`answers.py`), plus
`format_reward` when the answer is well formed (given with an answer marker, and a plain number
when the reference answer is a number), plus `tool_reward` when at least one tool call ran
without error; both bonuses default to 0. Running out of turns without an answer scores 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from esopt.confutil import Config, ConfigError, is_int, is_number, opt
from esopt.envs.base import Env, Episode, StepResult, Task, check_split
from esopt.envs.math.answers import check_answer
from esopt.envs.math.problems import DEFAULT_GENERATORS, RESERVED_OPTIONS, Problems, create_dataset, generator_registry
from esopt.envs.math.tools import TOOLS, run_tool
from esopt.envs.tools.actions import ANSWER, TOOL, parse_action, parse_number
from esopt.sandbox import ISOLATIONS, IsolationUnavailable, require_isolation


@dataclass
class MathConfig(Config):
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

    def check(self) -> None:
        gens = self.generators
        if not isinstance(gens, (list, tuple)) or not gens or not all(isinstance(g, str) for g in gens):
            raise ConfigError(f"math.generators must be a non-empty list of names, got {gens!r}")
        self.generators = list(gens)
        known = generator_registry()
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
            bad = sorted(RESERVED_OPTIONS & set(options))
            if bad:
                raise ConfigError(f"{where}: {', '.join(bad)} is set by the env, not by options")
            try:
                create_dataset(name, 0, 1, options)[0]
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


class MathEnv(Env):
    """reasoning-gym math problems; calculator/python tools; reward for the final answer."""

    name = "math"
    Config = MathConfig
    config: MathConfig

    def __init__(self, config: MathConfig | None = None):
        super().__init__(config)
        c = self.config
        self.problems = Problems(c.generators, c.weights, c.generator_options)
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

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if not is_int(n) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        return self.problems.draw(split, n, seed)

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
            correct = check_answer(answer, entry, self.env.problems.scorer(self.task.data.get("generator", "")), c.use_math_verify)
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
                feedback, ok = run_tool(act.tool, act.arg, c)
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
