"""The math env: word problems solved with a calculator and a python tool. `env.py` is the env (read it
first); `problems.py` draws problems from reasoning-gym's generators per split, `answers.py` decides
whether an answer is right, `tools.py` runs the tools."""

from esopt.envs.math.answers import check_answer
from esopt.envs.math.env import MathConfig, MathEnv

__all__ = ["MathConfig", "MathEnv", "check_answer"]
