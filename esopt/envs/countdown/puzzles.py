"""Countdown puzzles: numbers, a target and one expression that reaches it, drawn per split.

By default they come from reasoning-gym's ``countdown`` generator (offline, seeded), one stream per (split,
seed). The generator combines its numbers left to right, `((a o b) o c) ...`, and then shuffles them;
`shuffle_numbers: false` keeps that order. With `balanced_operators`, puzzle i's numbers are instead drawn
uniformly until the i-th of the 4^(n-1) operator choices, left-nested over them in order, hits a target in
range, so every choice solves an equal share (with reasoning-gym's frequencies `a + b - c` solves about a
third of such puzzles). A puzzle belongs to the split its key (sorted numbers and target) hashes to, so
the splits are disjoint whatever seed draws them.
"""

from __future__ import annotations

import random
from typing import Callable

from esopt.confutil import ConfigError
from esopt.envs.base import Task
from esopt.envs.countdown.operators import left_nested, left_nested_value, operator_choices
from esopt.envs.splits import hash_split, short_hash, stable_int

DATASET_SIZE = 200_000
# A draw returns (numbers, target, solution), ([], 0, "") for an index the generator found nothing for, or
# None when the source is exhausted.
Draw = Callable[[int], "tuple[list[int], int, str] | None"]


class PuzzleSource:
    """Distinct puzzles of one countdown config, per split; keeps the generator's streams it opened."""

    def __init__(self, config):
        self.config = config
        self._streams: dict[int, object] = {}

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        draw = self._balanced_draw(split, seed) if self.config.balanced_operators else self._generator_draw(split, seed)
        out: list[Task] = []
        seen: set[str] = set()
        failures = 0
        while len(out) < n:
            puzzle = draw(len(out)) if failures <= 200 * n + 1000 else None
            if puzzle is None:
                raise ConfigError(  # the ranges hold too few distinct puzzles: the user's settings, not a bug
                    f"countdown: could not draw {n} distinct {split} puzzles; widen the number/target ranges"
                )
            numbers, target, solution = puzzle
            key = f"{sorted(numbers)}->{target}"
            if not numbers or key in seen or hash_split("countdown", key) != split:
                failures += 1
                continue
            seen.add(key)
            out.append(
                Task(id=f"countdown-{short_hash(key)}", data={"numbers": numbers, "target": target, "solution": solution})
            )
        return out

    def _stream(self, seed: int):
        if seed not in self._streams:
            import reasoning_gym

            c = self.config
            if len(self._streams) > 64:
                self._streams.clear()
            try:
                self._streams[seed] = reasoning_gym.create_dataset(
                    "countdown", seed=seed, size=DATASET_SIZE,
                    min_numbers=c.min_numbers, max_numbers=c.max_numbers, min_value=c.min_value,
                    max_value=c.max_value, min_target=c.min_target, max_target=c.max_target,
                    shuffle=c.shuffle_numbers,
                )
            except (AssertionError, TypeError, ValueError) as e:
                raise ConfigError(f"countdown: invalid generator settings ({e})") from None
        return self._streams[seed]

    def _generator_draw(self, split: str, seed: int) -> Draw:
        stream = self._stream(stable_int(f"esopt-countdown|{split}|{seed}") % 2**31)
        position = iter(range(DATASET_SIZE))

        def draw(index: int):
            idx = next(position, None)
            if idx is None:
                return None
            try:
                meta = stream[idx]["metadata"]
            except ValueError:  # the generator found no expression in range for this index
                return [], 0, ""
            return [int(x) for x in meta["numbers"]], int(meta["target"]), str(meta["expression"])

        return draw

    def _balanced_draw(self, split: str, seed: int) -> Draw:
        # reasoning-gym's generator makes some operator choices too rare to balance by filtering its puzzles
        c = self.config
        rng = random.Random(stable_int(f"esopt-countdown-balanced|{split}|{seed}"))

        def draw(index: int):
            count = rng.randint(c.min_numbers, c.max_numbers)
            choices = list(operator_choices(count))
            ops = choices[index % len(choices)]
            for _ in range(10_000):
                numbers = [rng.randint(c.min_value, c.max_value) for _ in range(count)]
                value = left_nested_value(numbers, ops)
                if value.denominator == 1 and c.min_target <= value <= c.max_target:
                    return numbers, int(value), left_nested(numbers, ops)
            return None

        return draw
