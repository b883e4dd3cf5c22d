"""The environment protocol every task family implements.

An env is configured once (a dataclass `Config`), yields tasks for a split and
seed, and starts episodes. An episode takes one action string per turn and
returns the next observation, a reward and whether it is over. Envs never see
a policy: the rollout loop sits between the two.
"""

from __future__ import annotations

import abc
import hashlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

from esopt.confutil import validate_config

SPLITS = ("train", "val", "eval")
"""train: what ES trains on; val: where settings are chosen; eval: held out for reporting only."""


@dataclass(frozen=True)
class Task:
    """One task instance: a stable id plus JSON-serialisable data the env needs to run it."""

    id: str
    data: dict = field(default_factory=dict)


@dataclass
class StepResult:
    observation: str
    """Text the agent sees next (feedback on its action plus the new state)."""
    reward: float
    """Reward for this turn; an episode's return is the sum over its turns."""
    done: bool
    info: dict = field(default_factory=dict)
    """Diagnostics. Conventional keys: `invalid` (bool, the action was malformed or illegal),
    `success` (bool, set on the final turn), `answer` (str, set on the final turn: what the agent
    answered, so evaluations can show the answer distribution and expose a collapse to one answer),
    `answer_form` (optional str: the answer with the task's particulars left out, e.g. countdown's
    operators `(a / b) * c`, where every task's answers differ; answer distributions count it instead)."""


def shown_answer(info: dict) -> str:
    """What answer distributions count for an episode's final info: its `answer_form`, else its `answer`."""
    return str(info.get("answer_form", info.get("answer", "")))


class Episode(abc.ABC):
    """A running episode. It ends itself (done=True) at the env's max_turns."""

    @property
    @abc.abstractmethod
    def observation(self) -> str:
        """The first observation (the task as the agent first sees it)."""

    @abc.abstractmethod
    def step(self, action: str) -> StepResult:
        """Apply one action string. Malformed input must give feedback and a penalty, never raise."""

    @property
    def action_regex(self) -> str | None:
        """This turn's grammar for guided decoding, when it depends on the state (e.g. only legal
        moves); None = the env's static `action_regex`."""
        return None


class Env(abc.ABC):
    """Base class of every environment. Subclasses set `name` and `Config` (a dataclass of the env's options;
    their rules go in its `check()`, which runs whenever the env is built) and implement the methods."""

    name: ClassVar[str]
    Config: ClassVar[type]

    def __init__(self, config: Any = None):
        self.config = config if config is not None else self.Config()
        validate_config(self.config)

    @property
    @abc.abstractmethod
    def system_prompt(self) -> str:
        """Instructions placed in the system message of every episode."""

    @property
    def action_regex(self) -> str | None:
        """A regex every well-formed action matches in full, used for guided decoding; None = free text."""
        return None

    @property
    @abc.abstractmethod
    def max_turns(self) -> int:
        """Turns after which an episode ends (the episode enforces it)."""

    @abc.abstractmethod
    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        """`n` tasks of `split` ("train", "val" or "eval"), the same for the same (split, n, seed).
        The three splits never overlap."""

    @abc.abstractmethod
    def start(self, task: Task) -> Episode:
        """Begin an episode on `task`."""

    def trivial_baseline(self, tasks: list[Task]) -> tuple[str, float] | None:
        """(description, success rate on `tasks`) of the best policy that ignores the observation, e.g.
        always giving the most frequent answer; a learned rate means little unless it beats this. None
        when the env defines none."""
        return None

    @classmethod
    def listing(cls) -> list[str]:
        """Lines `esopt envs` prints under the env's options, e.g. the datasets it can run."""
        return []

    def oracle(self, task: Task) -> Callable[[str], str] | None:
        """A reference policy for `task` (observation -> action) that solves it, or None when the env has
        none. It shows every task is solvable: the env contract test runs it on every registered env."""
        return None

    def describe(self) -> dict:
        return {"name": self.name, **dataclasses.asdict(self.config)}


def held_out_split(key: str) -> str:
    """Which half of the held-out pool a task with content `key` belongs to: "val" or "eval".

    Envs first decide by a hash whether a task is held out (never trained on); that pool is then cut
    in two by a second hash, so choosing settings on val never touches the reported eval tasks and the
    train split stays what it always was."""
    digest = hashlib.sha256(f"esopt-val|{key}".encode("utf-8", "replace")).digest()
    return "val" if digest[0] % 2 else "eval"


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
