"""Sudoku puzzles: the solver (counting solutions), unique-solution generation with exactly H* empty
cells, and the split a puzzle belongs to (by a stable hash of the puzzle)."""

from __future__ import annotations

import math
import random

from esopt.envs.base import held_out_split
from esopt.envs.splits import stable_int

EMPTY = "."
# Largest supported number of empty cells. A 4x4 puzzle needs >= 4 clues and a 9x9 one >= 17 to be
# uniquely solvable; the caps below stay inside what the greedy remover reaches reliably.
MAX_EMPTY = {4: 12, 9: 55}
EVAL_FRACTION = 5  # one puzzle in EVAL_FRACTION goes to the eval split (by a hash of the puzzle)


class _Geometry:
    """Row/column/box index of every cell of an n x n grid (n a perfect square)."""

    _cache: dict[int, "_Geometry"] = {}

    def __init__(self, n: int):
        b = math.isqrt(n)
        if b * b != n or n < 1:
            raise ValueError(f"sudoku size must be a perfect square, got {n}")
        self.n, self.b, self.cells = n, b, n * n
        self.row = [i // n for i in range(n * n)]
        self.col = [i % n for i in range(n * n)]
        self.box = [(r // b) * b + (c // b) for r, c in zip(self.row, self.col)]
        self.full = (1 << n) - 1

    @classmethod
    def of(cls, n: int) -> "_Geometry":
        if n not in cls._cache:
            cls._cache[n] = _Geometry(n)
        return cls._cache[n]


def _search(
    grid: list[int],
    n: int,
    limit: int,
    rng: random.Random | None = None,
    forbid: tuple[int, int] | None = None,
) -> list[list[int]]:
    """Up to `limit` completions of `grid` (0 = empty). `forbid=(cell, digit)` excludes that
    digit from that cell. `rng` shuffles the digit order (for random full grids)."""
    g = _Geometry.of(n)
    grid = list(grid)
    rows, cols, boxes = [0] * n, [0] * n, [0] * n
    for i, d in enumerate(grid):
        if d:
            bit = 1 << (d - 1)
            r, c, x = g.row[i], g.col[i], g.box[i]
            if (rows[r] | cols[c] | boxes[x]) & bit:
                return []  # the givens already conflict
            rows[r] |= bit
            cols[c] |= bit
            boxes[x] |= bit
    empties = [i for i, d in enumerate(grid) if d == 0]
    fcell, fbit = (forbid[0], 1 << (forbid[1] - 1)) if forbid else (-1, 0)
    if fcell >= 0 and grid[fcell]:
        return [] if grid[fcell] == forbid[1] else _search(grid, n, limit, rng)
    R, C, B, full = g.row, g.col, g.box, g.full
    out: list[list[int]] = []

    def rec() -> bool:
        best, best_mask, best_count = -1, 0, n + 1
        for i in empties:
            if grid[i]:
                continue
            m = full & ~(rows[R[i]] | cols[C[i]] | boxes[B[i]])
            if i == fcell:
                m &= ~fbit
            k = m.bit_count()
            if k < best_count:
                best, best_mask, best_count = i, m, k
                if k <= 1:
                    break
        if best < 0:
            out.append(list(grid))
            return len(out) >= limit
        if best_count == 0:
            return False
        digits = [d + 1 for d in range(n) if best_mask >> d & 1]
        if rng is not None:
            rng.shuffle(digits)
        r, c, x = R[best], C[best], B[best]
        for d in digits:
            bit = 1 << (d - 1)
            grid[best] = d
            rows[r] |= bit
            cols[c] |= bit
            boxes[x] |= bit
            stop = rec()
            rows[r] &= ~bit
            cols[c] &= ~bit
            boxes[x] &= ~bit
            grid[best] = 0
            if stop:
                return True
        return False

    rec()
    return out


def _parse_grid(puzzle: str, size: int | None = None) -> tuple[list[int], int]:
    s = "".join(puzzle.split())
    if size is None:
        size = math.isqrt(len(s))
    if size not in (4, 9) or len(s) != size * size:
        raise ValueError(f"expected a 16- or 81-character puzzle string, got {len(s)} characters")
    grid = []
    for ch in s:
        if ch in ".0":
            grid.append(0)
        elif ch.isdigit() and 1 <= int(ch) <= size:
            grid.append(int(ch))
        else:
            raise ValueError(f"bad character {ch!r} in a {size}x{size} puzzle")
    return grid, size


def _to_str(grid: list[int]) -> str:
    return "".join(str(d) if d else EMPTY for d in grid)


def solve(puzzle: str, size: int | None = None, limit: int = 2) -> list[str]:
    """Up to `limit` solutions of `puzzle` (row-major; "." or "0" = empty; size inferred from the
    length when None). An inconsistent puzzle has none. `len(solve(p)) == 1` means unique."""
    grid, size = _parse_grid(puzzle, size)
    return [_to_str(s) for s in _search(grid, size, max(1, int(limit)))]


def is_valid_solution(grid: str, size: int | None = None) -> bool:
    """True iff `grid` is a full board whose rows, columns and boxes each hold every digit once."""
    try:
        cells, size = _parse_grid(grid, size)
    except ValueError:
        return False
    if 0 in cells:
        return False
    g = _Geometry.of(size)
    for key in (g.row, g.col, g.box):
        seen = [0] * size
        for i, d in enumerate(cells):
            seen[key[i]] |= 1 << (d - 1)
        if any(m != g.full for m in seen):
            return False
    return True


def random_grid(size: int, rng: random.Random) -> str:
    """A random full valid grid (randomised backtracking)."""
    return _to_str(_search([0] * (size * size), size, 1, rng=rng)[0])


def generate_puzzle(size: int, empty_cells: int, rng: random.Random) -> tuple[str, str] | None:
    """(puzzle, solution) with exactly `empty_cells` empty cells and a unique solution, or None if
    this random grid/removal order got stuck before reaching that many (the caller retries).

    Cells are removed in random order; a removal is kept only if no completion other than the
    solution exists, i.e. no solution has a different digit in the removed cell."""
    solution = _search([0] * (size * size), size, 1, rng=rng)[0]
    grid = list(solution)
    order = list(range(size * size))
    rng.shuffle(order)
    removed = 0
    for cell in order:
        if removed == empty_cells:
            break
        digit = grid[cell]
        grid[cell] = 0
        if removed and _search(grid, size, 1, forbid=(cell, digit)):
            grid[cell] = digit  # another solution would appear: keep this clue
        else:
            removed += 1
    if removed < empty_cells:
        return None
    return _to_str(grid), _to_str(solution)


def _first_answer(puzzle: str, solution: str) -> int:
    """The solution's digit in the puzzle's first empty cell."""
    first = next(i for i, ch in enumerate(puzzle) if ch in ".0")
    return int(solution[first])


def puzzle_split(puzzle: str) -> str:
    """The split a puzzle belongs to ("train", "val" or "eval"), from a stable hash of its string."""
    if stable_int("esopt-sudoku-split|" + puzzle) % EVAL_FRACTION:
        return "train"
    return held_out_split("sudoku|" + puzzle)
