"""Countdown: combine the given numbers with + - * / and parentheses to hit a target.

Tasks come from reasoning-gym's ``countdown`` generator (offline, seeded) or a balanced draw of its own
(`puzzles.py`): numbers, a target and one reference solution. The prompt is the env's own (short, plain
text).

The operator task (`answer_grammar: operators`): guided decoding admits only the left-nested
expression over the numbers in the given order, so with unshuffled numbers one of the 4^(n-1)
operator choices always hits and choosing it is the whole task (the arithmetic, without the search
over orders). With `balanced_operators` every choice solves an equal share (with three numbers 1-20 and
targets 1-60 the best constant one, `(a / b) * c`, still solves 0.16 of 128 val puzzles, as `/ 1` and
`* 1` and the like coincide; uniform guessing 0.10).

Reward: `format_reward` (0.1) for a well-formed answer, plus `correct_reward` (1.0) when it also
evaluates exactly to the target (the ES-at-Scale paper's scheme; `scoring.py` says what well formed
and correct mean). `closeness_reward` (default 0) adds partial credit for a well-formed wrong answer
near the target, a denser training reward; the success metric is unchanged.

Trivial policy: answering with the target itself is correct whenever the target is one of the given
numbers (8 of 64 val puzzles with three numbers up to 20 and targets 5-40 under the at-most-once
rule; never under `use_all_numbers`), and one fixed operator template, flat or left-nested, over the
numbers in their given order often is; `trivial_baseline` reports the best of them.

Number rule. By default each number may be used *at most once* (this brief's rule; the original
Countdown game's rule). reasoning-gym's own scorer, the ES-at-Scale code and TinyZero instead
require every number exactly once (multiset equality), and reasoning-gym scores 1.0 / 0.05 (wrong
numbers or value) / 0.01 (unparsable), evaluating with sympy's `parse_expr`. Set
`use_all_numbers: true` for the exactly-once rule; the prompt states whichever rule is active.
reasoning-gym's generator builds its target from all numbers, so a solution exists under both.

Protocol: reply ``answer: <expression>`` (also accepted: \\boxed{...}, <answer>...</answer>,
"The answer is ...", or a reply that is just the expression; a trailing "= <target>" is
dropped). With `multi_turn`, the agent may first call ``calculator: <expression>`` (up to
`max_tool_calls` times) within `max_turns`; single-turn episodes last exactly one turn.

Task data: ``{"numbers": [int], "target": int, "solution": str}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from esopt.confutil import Config, ConfigError, is_int, is_number, opt
from esopt.envs.base import Env, Episode, StepResult, Task, check_split
from esopt.envs.countdown.operators import (
    LETTERS, hitting_forms, left_nested, letter_form, operator_choices, operator_slots_regex, value_lines,
)
from esopt.envs.countdown.puzzles import PuzzleSource
from esopt.envs.countdown.scoring import bare_expression, score_expression
from esopt.envs.tools.actions import ANSWER, INVALID, TOOL, Action, parse_action, truncate
from esopt.envs.tools.calculator import calculate

ANSWER_GRAMMARS = ("free", "operators")
OBSERVATIONS = ("plain", "first_values", "all_values")


@dataclass
class CountdownConfig(Config):
    min_numbers: int = opt(3, "Fewest numbers given per puzzle (>= 2).")
    max_numbers: int = opt(4, "Most numbers given per puzzle.")
    min_value: int = opt(1, "Smallest given number (>= 1).")
    max_value: int = opt(100, "Largest given number.")
    min_target: int = opt(10, "Smallest target (>= 1).")
    max_target: int = opt(100, "Largest target.")
    use_all_numbers: bool = opt(
        False,
        "false: each number at most once (default); true: every number exactly once "
        "(reasoning-gym's and the ES-at-Scale paper's rule).",
    )
    shuffle_numbers: bool = opt(
        True,
        "true: the numbers in random order (reasoning-gym's default); false: in the order the generator combined "
        "them, left to right, so that some `(a o b) o c` over them in that order hits the target.",
    )
    answer_grammar: str = opt(
        "free",
        "free: any expression over + - * / and parentheses; operators: guided decoding admits only "
        "`answer: (a o b) o c` (left-nested, the numbers in the given order): the agent picks the 4^(n-1) "
        "operators, and rollout.expected_reward can score every admitted reply. Single-turn episodes only.",
    )
    balanced_operators: bool = opt(
        False,
        "With shuffle_numbers false: puzzle i's numbers are drawn uniformly (not by reasoning-gym) until the i-th of "
        "the 4^(n-1) operator choices, left-nested over them in order, hits a target in range, so each choice "
        "solves an equal share of the puzzles (with reasoning-gym's frequencies `a + b - c` solves about a third).",
    )
    observation: str = opt(
        "plain",
        "plain: the numbers and the target; first_values (with answer_grammar operators): also the value of "
        "`a o b` for each operator, the first step's facts spelled out, so one step of arithmetic is left; "
        "all_values: the value of every admitted answer, so the task is to find the one that equals the target.",
    )
    multi_turn: bool = opt(False, "If true, the agent may use the calculator before answering.")
    max_turns: int = opt(4, "Turns per episode when multi_turn (single-turn episodes have 1).")
    max_tool_calls: int = opt(3, "Calculator calls allowed per episode when multi_turn.")
    format_reward: float = opt(0.1, "Reward for a well-formed answer (allowed numbers, + - * / only).")
    correct_reward: float = opt(1.0, "Added when the answer also evaluates to the target.")
    closeness_reward: float = opt(
        0.0,
        "Dense training signal: a well-formed wrong answer also earns closeness_reward * max(0, 1 - "
        "|value - target| / target). Success stays an exact hit.",
    )

    def check(self) -> None:
        for name in ("min_numbers", "max_numbers", "min_value", "max_value", "min_target", "max_target",
                     "max_turns", "max_tool_calls"):
            if not is_int(getattr(self, name)):
                raise ConfigError(f"countdown.{name} must be an integer, got {getattr(self, name)!r}")
        if not 2 <= self.min_numbers <= self.max_numbers <= 12:
            raise ConfigError(
                f"countdown.min_numbers/max_numbers must satisfy 2 <= min <= max <= 12, "
                f"got {self.min_numbers}/{self.max_numbers}"
            )
        if not 1 <= self.min_value <= self.max_value:
            raise ConfigError(
                f"countdown.min_value/max_value must satisfy 1 <= min <= max, got {self.min_value}/{self.max_value}"
            )
        if not 1 <= self.min_target <= self.max_target:
            raise ConfigError(
                f"countdown.min_target/max_target must satisfy 1 <= min <= max, "
                f"got {self.min_target}/{self.max_target}"
            )
        for name in ("use_all_numbers", "multi_turn", "shuffle_numbers", "balanced_operators"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"countdown.{name} must be true or false, got {getattr(self, name)!r}")
        if self.answer_grammar not in ANSWER_GRAMMARS:
            raise ConfigError(
                f"countdown.answer_grammar must be one of {', '.join(ANSWER_GRAMMARS)}, got {self.answer_grammar!r}"
            )
        if self.answer_grammar == "operators" and self.multi_turn:
            raise ConfigError("countdown.answer_grammar operators is for single-turn episodes: set multi_turn false")
        if self.observation not in OBSERVATIONS:
            raise ConfigError(f"countdown.observation must be one of {', '.join(OBSERVATIONS)}, got {self.observation!r}")
        if self.observation != "plain" and self.answer_grammar != "operators":
            raise ConfigError(f"countdown.observation {self.observation} lists the operators grammar's values: set answer_grammar operators")
        if self.balanced_operators and self.shuffle_numbers:
            raise ConfigError("countdown.balanced_operators needs shuffle_numbers false (the operators of the numbers in order)")
        if self.max_turns < 1:
            raise ConfigError(f"countdown.max_turns must be >= 1, got {self.max_turns}")
        if self.max_tool_calls < 0:
            raise ConfigError(f"countdown.max_tool_calls must be >= 0, got {self.max_tool_calls}")
        for name in ("format_reward", "correct_reward", "closeness_reward"):
            if not is_number(getattr(self, name)):
                raise ConfigError(f"countdown.{name} must be a number, got {getattr(self, name)!r}")
        if self.closeness_reward < 0:
            raise ConfigError(f"countdown.closeness_reward must be >= 0, got {self.closeness_reward}")


class CountdownEnv(Env):
    """Reach the target with + - * / over the given numbers; optional calculator turns."""

    name = "countdown"
    Config = CountdownConfig
    config: CountdownConfig

    def __init__(self, config: CountdownConfig | None = None):
        super().__init__(config)
        self._puzzles = PuzzleSource(self.config)

    @property
    def max_turns(self) -> int:
        return self.config.max_turns if self.config.multi_turn else 1

    @property
    def action_regex(self) -> str:
        """One line `answer: <expression>` (or `calculator: <expression>` in multi-turn mode)."""
        verbs = "(answer|calculator)" if self.config.multi_turn else "answer"
        return verbs + r": [0-9+\-*/() ]{1,60}"

    @property
    def rule(self) -> str:
        return "Use every number exactly once." if self.config.use_all_numbers else "Use each number at most once."

    @property
    def system_prompt(self) -> str:
        c = self.config
        lines = [
            "Make the target number from the given numbers with + - * / and parentheses. " + self.rule,
        ]
        if c.multi_turn and c.max_tool_calls > 0:
            lines += [
                "Each reply must be ONE of these:",
                "calculator: <expression>   (example: calculator: (25-5)*4)",
                "answer: <expression>   (example: answer: (25-5)*4)",
                f"You have {c.max_turns} turns; reply with answer: before they run out.",
            ]
        else:
            lines += ["Reply with one line: answer: <expression>", "Example: answer: (25-5)*4"]
        if c.answer_grammar == "operators":
            count = c.max_numbers
            lines[-2:] = [
                "Keep the numbers in the given order and choose the operators: answer: "
                + left_nested(list(LETTERS[:count]), ["op"] * (count - 1)),
                "Example: answer: " + left_nested([25, 5, 4, *range(2, 11)][:count], "-*+" * 4),
            ]
        return "\n".join(lines)

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if not is_int(n) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        return self._puzzles.tasks(split, n, seed)

    def trivial_baseline(self, tasks: list[Task]) -> tuple[str, float] | None:
        """The best arithmetic-free policy on `tasks`: answering the target itself (correct when it is a
        given number and the rule allows a partial answer), or one fixed operator template over the numbers
        in their given order (e.g. always `a + b - c`), whichever solves the most."""
        if not tasks:
            return None
        rule = self.config.use_all_numbers

        def solved(answer) -> int:
            return sum(score_expression(answer(t.data["numbers"], t.data["target"]), t.data["numbers"],
                                        t.data["target"], rule).correct for t in tasks)

        best = ("answer the target", solved(lambda numbers, target: str(target)))
        longest = max(len(t.data["numbers"]) for t in tasks)
        if longest <= 5:  # 4^(n-1) templates, flat or left-nested
            for ops in operator_choices(longest):
                def flat(numbers, target, ops=ops):
                    return " ".join(f"{n} {ops[i]}" for i, n in enumerate(numbers[:-1])) + f" {numbers[-1]}"

                def nested(numbers, target, ops=ops):
                    return left_nested(numbers, ops[: len(numbers) - 1])

                for fill in (flat, nested):
                    hits = solved(fill)
                    if hits > best[1]:
                        best = ("always " + fill(list(LETTERS[:longest]), None), hits)
        return best[0], best[1] / len(tasks)

    def oracle(self, task: Task):
        """Answer with the expression the task was generated from."""
        return lambda observation: f"answer: {task.data['solution']}"

    def start(self, task: Task) -> "CountdownEpisode":
        return CountdownEpisode(self, task)


class CountdownEpisode(Episode):
    def __init__(self, env: CountdownEnv, task: Task):
        self.env = env
        self.config: CountdownConfig = env.config
        self.numbers = [int(x) for x in task.data["numbers"]]
        self.target = int(task.data["target"])
        self.turn = 0
        self.tool_calls = 0
        self.done = False
        nums = ", ".join(map(str, self.numbers))
        c = self.config
        how = "Reply with answer: <expression>"
        if c.multi_turn and c.max_tool_calls > 0:
            how += " (or calculator: <expression> to check a step)"
        self._observation = f"Numbers: {nums}\nTarget: {self.target}\n{self._values()}{env.rule}\n{how}."
        self.category = self._right_forms() if c.answer_grammar == "operators" else None

    def _right_forms(self) -> str:
        """Which admitted answers hit the target, as letter forms (`answer a + b`, or `answer a * b | a / b`
        when two coincide): evaluation reports success per such category, which shows an answer the policy
        never gets right even when its overall rate rises."""
        return "answer " + (" | ".join(hitting_forms(self.numbers, self.target)) or "(no template)")

    def _values(self) -> str:
        """The observation's lines of computed values (none for the plain view)."""
        view = self.config.observation
        if view == "plain":
            return ""
        steps = 1 if view == "first_values" else len(self.numbers) - 1
        return "Values:\n" + "\n".join(value_lines(self.numbers, steps)) + "\n"

    @property
    def observation(self) -> str:
        return self._observation

    @property
    def action_regex(self) -> str | None:
        if self.config.answer_grammar != "operators":
            return None
        return "answer: " + operator_slots_regex(self.numbers)

    @property
    def tools(self) -> list[str]:
        c = self.config
        return ["calculator"] if c.multi_turn and c.max_tool_calls > 0 else []

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult(self._observation, 0.0, True, {"invalid": True, "error": "the episode is already over"})
        c = self.config
        self.turn += 1
        info: dict = {"invalid": False, "turn": self.turn}
        if self.category is not None:
            info["category"] = self.category
        act = parse_action(action, self.tools)
        if act.kind == INVALID:
            bare = bare_expression(action)
            if bare is not None:
                act = Action(ANSWER, arg=bare, explicit=False)
        if act.kind == ANSWER and act.arg.strip():
            s = score_expression(act.arg, self.numbers, self.target, c.use_all_numbers,
                                 c.format_reward, c.correct_reward, c.closeness_reward)
            self.done = True
            info.update(
                success=s.correct, answer=act.arg, well_formed=s.well_formed, tool_calls=self.tool_calls,
                invalid=not s.well_formed,
            )
            if c.answer_grammar == "operators":
                info["answer_form"] = letter_form(self.numbers, act.arg)
            if s.error:
                info["error"] = s.error
            if s.correct:
                fb = "Correct!"
            elif s.well_formed:
                fb = f"Wrong: the expression {s.error}."
            else:
                fb = f"Invalid answer: {s.error}."
            self._observation = f"{fb} The episode is over."
            return StepResult(self._observation, s.reward, True, info)
        if act.kind == TOOL:
            if self.tool_calls >= c.max_tool_calls:
                info["invalid"] = True
                info["error"] = "no tool calls left"
                feedback = "No calculator calls left. Reply with answer: <expression>."
            else:
                self.tool_calls += 1
                result = calculate(act.arg) if act.arg.strip() else "error: no expression"
                info["tool"] = "calculator"
                info["tool_ok"] = not result.startswith("error:")
                feedback = f"calculator: {truncate(result, 300)}"
        else:
            info["invalid"] = True
            info["error"] = "empty answer" if act.kind == ANSWER else (act.error or "unreadable reply")
            feedback = f"Invalid reply ({info['error']}). Reply with answer: <expression>."
        if self.turn >= self.env.max_turns:
            self.done = True
            info.update(success=False, answer=None, well_formed=False, tool_calls=self.tool_calls)
            self._observation = f"{feedback}\nNo answer given. The episode is over."
            return StepResult(self._observation, 0.0, True, info)
        left = self.env.max_turns - self.turn
        note = "Last turn: reply with answer: <expression>." if left == 1 else f"Turns left: {left}."
        self._observation = f"{feedback}\n{note}"
        return StepResult(self._observation, 0.0, False, info)
