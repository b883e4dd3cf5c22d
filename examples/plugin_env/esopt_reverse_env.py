"""The `reverse` env of the example plugin: spell a made-up word backwards, in one turn."""

import hashlib
import random
import re
from dataclasses import dataclass

from esopt.confutil import ConfigError, opt
from esopt.envs import Env, Episode, StepResult, Task
from esopt.envs.base import check_split, held_out_split


@dataclass
class ReverseConfig:
    length: int = opt(5, "letters per word")

    def check(self):  # the rules of the options, run whenever the env is built
        if not 2 <= self.length <= 20:
            raise ConfigError(f"reverse.length must be between 2 and 20, got {self.length}")


class ReverseEnv(Env):
    name, Config = "reverse", ReverseConfig
    system_prompt = "Spell the given word backwards. Reply with the reversed word only."
    action_regex = "[a-z]{1,20}"
    max_turns = 1

    def tasks(self, split, n, seed):
        check_split(split)
        rng, words = random.Random(f"reverse|{split}|{seed}"), {}
        while len(words) < n:  # a word's split is a hash of it: train, or held out (val / eval)
            word = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=self.config.length))
            if ("train" if hashlib.sha256(word.encode()).digest()[0] % 4 else held_out_split(word)) == split:
                words[word] = Task(id=f"reverse-{word}", data={"word": word})
        return list(words.values())

    def start(self, task):
        return ReverseEpisode(task)

    def oracle(self, task):
        return lambda observation: task.data["word"][::-1]


class ReverseEpisode(Episode):
    def __init__(self, task):
        self.task, self.done = task, False

    @property
    def observation(self):
        return f"Word: {self.task.data['word']}"

    def step(self, action):
        if self.done:
            return StepResult("The episode is over.", 0.0, True, {"invalid": True})
        self.done = True
        reply = action.strip().lower() if isinstance(action, str) else ""
        if not re.fullmatch("[a-z]{1,20}", reply):
            return StepResult("Invalid: reply with letters only.", 0.0, True, {"invalid": True, "success": False, "answer": None})
        solved = reply == self.task.data["word"][::-1]
        return StepResult("Correct!" if solved else "Wrong.", float(solved), True, {"invalid": False, "success": solved, "answer": reply})
