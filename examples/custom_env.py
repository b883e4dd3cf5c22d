"""A new env in under 50 lines: find a secret number in a range, told "higher" or "lower" after each guess.

No registration is needed to train on it: `--env` takes a module:Class reference (put this directory on
the path), and its options become flags. To give it a short name, package it as a plugin (plugin_env/).
    PYTHONPATH=examples esopt train --env custom_env:GuessEnv --env.span 16 --steps 5 --tasks_per_step 4
"""
import hashlib
import random
import re
from dataclasses import dataclass

from esopt.confutil import opt
from esopt.envs import Env, Episode, StepResult, Task
from esopt.envs.base import check_split, held_out_split


@dataclass
class GuessConfig:
    span: int = opt(32, "the secret lies in a range of this many whole numbers")
    max_turns: int = opt(6, "guesses per episode")


class GuessEnv(Env):
    name, Config = "guess", GuessConfig
    system_prompt = "Find the secret number. Reply with one number; you are told higher or lower after each guess."
    action_regex = r"[0-9]{1,4}"  # guided decoding keeps replies to this grammar
    max_turns = property(lambda self: self.config.max_turns)

    def tasks(self, split, n, seed):  # the same tasks for the same (split, n, seed); splits never overlap
        check_split(split)
        rng, out = random.Random(f"guess|{split}|{seed}"), {}
        while len(out) < n:  # a task's split is a hash of its content: train, or held out (val / eval)
            low = rng.randint(1, 1000)
            key = f"{low}|{rng.randint(low, low + self.config.span - 1)}"
            if ("train" if hashlib.sha256(key.encode()).digest()[0] % 4 else held_out_split(key)) == split:
                out[key] = Task(id=f"guess-{key}", data={"low": low, "secret": int(key.split("|")[1])})
        return list(out.values())

    def start(self, task):
        return GuessEpisode(task, self.config)


class GuessEpisode(Episode):
    def __init__(self, task, config):
        self.task, self.config, self.turn, self.done = task, config, 0, False

    @property
    def observation(self):  # what the agent sees first
        return f"The secret is between {self.task.data['low']} and {self.task.data['low'] + self.config.span - 1}."

    def step(self, action):  # malformed replies get feedback and use a turn; nothing here raises
        match = None if self.done else re.fullmatch(r"\s*(\d{1,4})\s*", str(action))
        self.turn += not self.done
        guess, secret = (int(match.group(1)) if match else None), self.task.data["secret"]
        solved = guess == secret
        self.done = self.done or solved or self.turn >= self.config.max_turns
        feedback = "Reply with one number." if guess is None else "Correct!" if solved else "Higher." if guess < secret else "Lower."
        info = {"invalid": guess is None, **({"success": solved, "answer": str(guess)} if self.done else {})}
        return StepResult(feedback, float(solved), self.done, info)
