"""Sudoku: fill the empty cells of a uniquely solvable 4x4 or 9x9 puzzle, one cell per turn.

The minimum successful horizon H* is the number of empty cells (`empty_cells`): a perfect agent
needs exactly H* turns. Only the end of an episode is rewarded: 1.0 when the final board is the
(unique) solution, else 0.0 (or, with `partial_credit`, the fraction of originally empty cells that
hold the right digit). Wrong digits are accepted silently (conflicts are not revealed); a malformed
or illegal action is reported, scores nothing and uses up the turn.

Task data: ``{"puzzle": str, "solution": str}``, row-major strings of ``size*size`` characters;
``"1".."9"`` are digits and ``"."`` marks an empty cell (``solve`` also accepts ``"0"``).

Accepted actions (case and whitespace tolerant; the first action found in the reply counts):
``set <row> <col> <value>`` (1-based), ``r<row>c<col>=<value>``, and JSON
``{"row": r, "col": c, "value": v}``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from esopt.confutil import Config, ConfigError, opt
from esopt.envs.base import Env, Episode, StepResult, Task, check_split
from esopt.envs.splits import short_hash, stable_int
from esopt.envs.sudoku.actions import _BIG, parse_action
from esopt.envs.sudoku.puzzles import (
    EMPTY, MAX_EMPTY, _first_answer, _Geometry, _parse_grid, _to_str, generate_puzzle, is_valid_solution, puzzle_split,
)

OBSERVATIONS = ("board", "marks", "board+marks")
_MAX_ATTEMPTS = 20_000  # per task, across split rejections, duplicates and failed removals
_DUP_ATTEMPTS = 64  # per task: retries to avoid a duplicate before accepting one


@dataclass
class SudokuConfig(Config):
    size: int = opt(4, "Board size: 4 (2x2 boxes) or 9 (3x3 boxes).")
    empty_cells: int = opt(
        2,
        "H*, the minimum successful horizon: exactly this many empty cells per puzzle "
        f"(1..{MAX_EMPTY[4]} for size 4, 1..{MAX_EMPTY[9]} for size 9).",
    )
    max_turns: int | None = opt(
        None,
        "Turns per episode; None = 3 * empty_cells. Fewer than empty_cells (with partial_credit) plays only the "
        "first turns of each puzzle, scored by the cells they got right: a training task, not a solvable one.",
    )
    grammar: str = opt(
        "format",
        "Guided-decoding grammar: 'format' (any `set <row> <col> <value>` in range) or 'legal' "
        "(row and column restricted to the currently empty cells: action masking).",
    )
    observation: str = opt(
        "board",
        "What each observation shows: 'board' (the grid and the list of empty cells), 'marks' (for every "
        "empty cell, which digits its row, column and box already use and which are free: the facts a "
        "solver needs, spelled out) or 'board+marks' (both).",
    )
    balanced_answers: bool = opt(
        False,
        "If true, the k-th puzzle of every task set needs digit (k mod size) + 1 in its first empty cell, so "
        "each digit is the answer equally often and no constant answer beats chance (1/size).",
    )
    partial_credit: bool = opt(
        False,
        "If true, an unsolved episode scores the fraction of originally empty cells holding the "
        "solution's digit instead of 0 (a solved board still scores 1).",
    )
    fill_order: str = opt(
        "any",
        "'any' (the agent picks which empty cell to fill) or 'reading' (each turn names the cell to fill, the "
        "first empty one in reading order: an action on another cell is invalid, the legal grammar admits only "
        "it, and the marks view lists only it, so each turn is one cell's decision on the board so far).",
    )
    one_turn: bool = opt(
        False,
        "A training task of one reply from along the solution path: the episode starts as if the agent had "
        "filled the puzzle's first k empty cells (reading order) rightly, k drawn per task from 0..empty_cells-1, "
        "showing what it would then see (that last feedback, its turns left), and ends after one reply, scored "
        "by partial credit (so a right reply earns 1/empty_cells more than a wrong one on every turn). For "
        "rollout.expected_reward on multi-turn puzzles; evaluate whole ones with eval_env_options {one_turn: false}.",
    )

    def check(self) -> None:
        if isinstance(self.size, bool) or self.size not in (4, 9):
            raise ConfigError(f"sudoku.size must be 4 or 9, got {self.size!r}")
        hi = MAX_EMPTY[self.size]
        if isinstance(self.empty_cells, bool) or not isinstance(self.empty_cells, int) or not (
            1 <= self.empty_cells <= hi
        ):
            raise ConfigError(
                f"sudoku.empty_cells must be an integer in 1..{hi} for size {self.size}, "
                f"got {self.empty_cells!r}"
            )
        if self.max_turns is not None and (
            isinstance(self.max_turns, bool) or not isinstance(self.max_turns, int) or self.max_turns < 1
        ):
            raise ConfigError(f"sudoku.max_turns must be None or an integer >= 1, got {self.max_turns!r}")
        if self.max_turns is not None and self.max_turns < self.empty_cells and not self.partial_credit:
            raise ConfigError(
                f"sudoku.max_turns {self.max_turns} < empty_cells {self.empty_cells} never solves a puzzle, so every "
                "reward would be 0; set partial_credit true (or max_turns >= empty_cells)"
            )
        if self.grammar not in ("format", "legal"):
            raise ConfigError(f"sudoku.grammar must be 'format' or 'legal', got {self.grammar!r}")
        if self.observation not in OBSERVATIONS:
            raise ConfigError(
                f"sudoku.observation must be one of {', '.join(OBSERVATIONS)}, got {self.observation!r}"
            )
        if not isinstance(self.balanced_answers, bool):
            raise ConfigError(f"sudoku.balanced_answers must be true or false, got {self.balanced_answers!r}")
        if not isinstance(self.partial_credit, bool):
            raise ConfigError(f"sudoku.partial_credit must be true or false, got {self.partial_credit!r}")
        if self.fill_order not in ("any", "reading"):
            raise ConfigError(f"sudoku.fill_order must be 'any' or 'reading', got {self.fill_order!r}")
        if not isinstance(self.one_turn, bool):
            raise ConfigError(f"sudoku.one_turn must be true or false, got {self.one_turn!r}")
        if self.one_turn and not self.partial_credit:
            raise ConfigError("sudoku.one_turn scores one reply of a puzzle, which never solves it alone: set partial_credit true")
        if self.one_turn and self.max_turns is not None and self.max_turns < self.empty_cells:
            raise ConfigError(
                f"sudoku.one_turn shows the turns left of a whole episode: max_turns {self.max_turns} must be >= "
                f"empty_cells {self.empty_cells}"
            )


class SudokuEnv(Env):
    """Fill a uniquely solvable Sudoku one cell per turn; reward only at the end."""

    name = "sudoku"
    Config = SudokuConfig
    config: SudokuConfig

    @property
    def size(self) -> int:
        return self.config.size

    @property
    def max_turns(self) -> int:
        c = self.config
        return c.max_turns if c.max_turns is not None else 3 * c.empty_cells

    @property
    def action_regex(self) -> str:
        d = f"[1-{self.size}]"
        return f"set {d} {d} {d}"

    @property
    def system_prompt(self) -> str:
        n, b = self.size, math.isqrt(self.size)
        return (
            f"You solve a {n}x{n} Sudoku: each row, column and {b}x{b} box holds every digit 1-{n} once. "
            "Each turn, fill one empty cell (.) by replying only: set <row> <col> <value>"
        )

    # -- tasks ---------------------------------------------------------------------------------

    def _rng(self, split: str, seed: int, index: int, attempt: int) -> random.Random:
        c = self.config
        key = f"esopt-sudoku|{c.size}|{c.empty_cells}|{split}|{seed}|{index}|{attempt}"
        return random.Random(stable_int(key))

    def _task(self, puzzle: str, solution: str) -> Task:
        c = self.config
        digest = short_hash(puzzle, 8)
        return Task(
            id=f"sudoku{c.size}-h{c.empty_cells}-{digest}",
            data={"puzzle": puzzle, "solution": solution},
        )

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        check_split(split)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative integer, got {n!r}")
        c = self.config
        out: list[Task] = []
        seen: set[str] = set()
        for index in range(n):
            dups = 0
            for attempt in range(_MAX_ATTEMPTS):
                made = generate_puzzle(c.size, c.empty_cells, self._rng(split, seed, index, attempt))
                if made is None or puzzle_split(made[0]) != split:
                    continue
                if c.balanced_answers and _first_answer(*made) != index % c.size + 1:
                    continue
                if made[0] in seen and dups < _DUP_ATTEMPTS:
                    dups += 1
                    continue
                seen.add(made[0])
                out.append(self._task(*made))
                break
            else:
                raise RuntimeError(
                    f"could not generate a {c.size}x{c.empty_cells}-empty {split} puzzle "
                    f"in {_MAX_ATTEMPTS} attempts"
                )
        return out

    def trivial_baseline(self, tasks: list[Task]) -> tuple[str, float] | None:
        """Writing one fixed digit into every empty cell, for the digit that solves the most of `tasks`."""
        if not tasks:
            return None
        solved = {d: 0 for d in range(1, self.size + 1)}
        for task in tasks:
            puzzle, _ = _parse_grid(task.data["puzzle"], self.size)
            solution, _ = _parse_grid(task.data["solution"], self.size)
            digits = {solution[i] for i, d in enumerate(puzzle) if d == 0}
            if len(digits) == 1:
                solved[digits.pop()] += 1
        best = max(solved, key=lambda d: (solved[d], -d))
        return f"always {best}", solved[best] / len(tasks)

    # -- episodes ------------------------------------------------------------------------------

    def oracle(self, task: Task):
        """Fill the empty cells in reading order from the unique solution."""
        n, puzzle, solution = self.size, task.data["puzzle"], task.data["solution"]
        actions = iter(f"set {i // n + 1} {i % n + 1} {solution[i]}" for i, cell in enumerate(puzzle) if cell == ".")
        return lambda observation: next(actions)

    def start(self, task: Task) -> "SudokuEpisode":
        return SudokuEpisode(self, task)


class SudokuEpisode(Episode):
    def __init__(self, env: SudokuEnv, task: Task):
        self.env = env
        self.task = task
        puzzle, self.size = _parse_grid(task.data["puzzle"], env.size)
        self.solution, _ = _parse_grid(task.data["solution"], self.size)
        self.board = list(puzzle)
        self.given = [d != 0 for d in puzzle]
        self.targets = [i for i, d in enumerate(puzzle) if d == 0]
        self.turn = 0
        self.done = False
        feedback = "New puzzle."
        if env.config.one_turn:  # the state after the agent's own first k right fills, as it would see it
            for i in self.targets[: stable_int(f"esopt-sudoku-one-turn|{task.id}") % len(self.targets)]:
                feedback = self._apply(f"set {i // self.size + 1} {i % self.size + 1} {self.solution[i]}")
                self.turn += 1
        self.first_turn = self.turn
        self._observation = self._render(feedback)

    @property
    def observation(self) -> str:
        return self._observation

    @property
    def action_regex(self) -> str | None:
        if self.env.config.grammar != "legal":
            return None
        n = self.size
        cells = "|".join(f"{i // n + 1} {i % n + 1}" for i in self._open()) or f"[1-{n}] [1-{n}]"
        return f"set ({cells}) [1-{n}]"

    @property
    def turns_left(self) -> int:
        return max(0, self.env.max_turns - self.turn)

    def _empty(self) -> list[int]:
        return [i for i in self.targets if self.board[i] == 0]

    def _open(self) -> list[int]:
        """The cells an action may fill this turn: every empty one, or under fill_order 'reading' the first."""
        empty = self._empty()
        return empty[:1] if self.env.config.fill_order == "reading" else empty

    def _used_digits(self, cell: int) -> set[int]:
        """Digits already placed in the row, column or box of `cell`."""
        g = _Geometry.of(self.size)
        return {
            self.board[j]
            for j in range(g.cells)
            if self.board[j] and (g.row[j] == g.row[cell] or g.col[j] == g.col[cell] or g.box[j] == g.box[cell])
        }

    def _marks(self) -> list[str]:
        n = self.size
        lines = []
        for i in self._open():
            used = self._used_digits(i)
            marks = " ".join(f"{d}:{'used' if d in used else 'free'}" for d in range(1, n + 1))
            lines.append(f"Cell ({i // n + 1},{i % n + 1}) {marks}")
        return lines

    def _render(self, feedback: str) -> str:
        view = self.env.config.observation
        lines = self._board_lines() if view in ("board", "board+marks") else []
        if view in ("marks", "board+marks"):
            lines.extend(self._marks())
        lines.append(feedback)
        if not self.done:
            if self.env.config.fill_order == "reading" and view == "board":  # the marks name the cell already
                i = self._empty()[0]
                lines.append(f"Fill cell ({i // self.size + 1},{i % self.size + 1}) now.")
            lines.append(f"Turns left: {self.turns_left}. Reply: set <row> <col> <value>")
        return "\n".join(lines)

    def _board_lines(self) -> list[str]:
        n, b = self.size, math.isqrt(self.size)
        head = "  |" + "|".join(
            " " + " ".join(str(c + 1) for c in range(s, s + b)) + " " for s in range(0, n, b)
        )
        rule = "--+" + "+".join("-" * (2 * b + 1) for _ in range(n // b))
        lines = [head.rstrip(), rule]
        for r in range(n):
            if r and r % b == 0:
                lines.append(rule)
            cells = [str(d) if d else EMPTY for d in self.board[r * n : (r + 1) * n]]
            lines.append(
                f"{r + 1} |" + "|".join(" " + " ".join(cells[s : s + b]) + " " for s in range(0, n, b)).rstrip()
            )
        empty = self._empty()
        if empty:
            lines.append("Empty (row,col): " + " ".join(f"({i // n + 1},{i % n + 1})" for i in empty))
        return lines

    def _apply(self, action: str) -> str:
        """Fill a cell from `action`. Returns feedback; it starts with "Invalid:" when the action
        was malformed or illegal (and the board is unchanged)."""
        n = self.size
        parsed = parse_action(action)
        if parsed is None:
            return f"Invalid: no action found. Reply exactly: set <row> <col> <value> (numbers 1-{n})."
        r, c, v = parsed
        for label, x in (("row", r), ("column", c), ("value", v)):
            if not 1 <= x <= n:
                shown = x if abs(x) < _BIG else "too large"
                return f"Invalid: {label} {shown} is out of range 1-{n}."
        i = (r - 1) * n + (c - 1)
        if self.given[i]:
            return f"Invalid: cell ({r},{c}) is a given digit and cannot be changed."
        if self.board[i]:
            return f"Invalid: cell ({r},{c}) is already filled."
        if i not in self._open():
            j = self._open()[0]
            return f"Invalid: fill cell ({j // n + 1},{j % n + 1}) first (cells are filled in reading order)."
        self.board[i] = v
        return f"OK: put {v} at ({r},{c})."

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult(
                self._observation, 0.0, True, {"invalid": True, "error": "the episode is already over"}
            )
        try:
            feedback = self._apply(action)
        except Exception as e:  # defensive: never raise on an action string
            feedback = f"Invalid: could not read the action ({type(e).__name__})."
        self.turn += 1
        invalid = feedback.startswith("Invalid:")
        info: dict = {"invalid": invalid, "turn": self.turn}
        if invalid:
            info["error"] = feedback
        full = not self._empty()
        reward = 0.0
        if full or self.turn >= self.env.max_turns or (self.env.config.one_turn and self.turn > self.first_turn):
            self.done = True
            correct = sum(self.board[i] == self.solution[i] for i in self.targets)
            success = full and is_valid_solution(_to_str(self.board), self.size)
            if success:
                reward = 1.0
            elif self.env.config.partial_credit:
                reward = correct / len(self.targets) if self.targets else 0.0
            answer = " ".join(str(self.board[i]) if self.board[i] else EMPTY for i in self.targets)
            info.update(success=success, filled_correct=correct, empty_cells=len(self.targets), answer=answer)
            if len(self.targets) == 1:  # evaluation reports success per right digit (a digit never learned shows)
                info["category"] = f"answer {self.solution[self.targets[0]]}"
            if success:
                feedback += " The board is solved!"
            elif full:
                feedback += " The board is full but not a valid solution. Episode over."
            else:
                feedback += " Out of turns. Episode over."
        self._observation = self._render(feedback)
        return StepResult(self._observation, reward, self.done, info)
