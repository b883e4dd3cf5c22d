"""The sudoku env: fill the empty cells of a uniquely solvable puzzle, one cell per turn. `env.py` is the
env (read it first); `puzzles.py` solves, generates and splits puzzles; `actions.py` reads replies."""

from esopt.envs.sudoku.actions import parse_action
from esopt.envs.sudoku.env import SudokuConfig, SudokuEnv
from esopt.envs.sudoku.puzzles import generate_puzzle, is_valid_solution, puzzle_split, solve

__all__ = ["SudokuConfig", "SudokuEnv", "generate_puzzle", "is_valid_solution", "parse_action", "puzzle_split", "solve"]
