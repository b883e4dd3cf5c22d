"""The countdown env: reach a target number with + - * / over given numbers. `env.py` is the env (read
it first); `puzzles.py` draws the puzzles of a split, `operators.py` holds the operator task's arithmetic and
`scoring.py` scores an answer (well formed, correct)."""

from esopt.envs.countdown.env import CountdownConfig, CountdownEnv
from esopt.envs.countdown.scoring import Score, score_expression

__all__ = ["CountdownConfig", "CountdownEnv", "Score", "score_expression"]
