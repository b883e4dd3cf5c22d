"""A scripted oracle: follows a built-in task's reference plan by reading the observations.

Each plan step names an element by role and label (e.g. ("click", "link", "Blue Mug")); the oracle
finds its number in the current observation and emits the action, exactly as an agent would. It
shows every built-in task is solvable through the browser, and is used by the tests.
"""

from __future__ import annotations

import re

from esopt.envs.base import Task
from esopt.envs.web.tasks import Plan, oracle_plan


def find_element(observation: str, role: str, label: str) -> int | None:
    """The number of the first element `role "label"` in the observation."""
    m = re.search(r"\[(\d+)\] " + re.escape(role) + ' "' + re.escape(label.replace('"', "'")) + '"', observation)
    return int(m.group(1)) if m else None


def step_action(step: tuple, observation: str) -> str:
    kind = step[0]
    if kind == "stop":
        return f"stop [{step[1]}]"
    if kind == "goto":
        return f"goto [{step[1]}]"
    element = find_element(observation, step[1], step[2])
    if element is None:
        raise LookupError(f"oracle: no {step[1]} {step[2]!r} in the observation:\n{observation}")
    if kind == "click":
        return f"click [{element}]"
    if kind == "type":
        return f"type [{element}] [{step[3]}] [{int(step[4])}]"
    if kind == "select":
        return f"select [{element}] [{step[3]}]"
    raise ValueError(f"unknown plan step {step!r}")


class Oracle:
    """Call with each observation; returns the next action of the task's reference plan."""

    def __init__(self, task: Task, plan: Plan | None = None):
        self.plan = list(plan if plan is not None else oracle_plan(task))
        self.i = 0

    def __call__(self, observation: str) -> str:
        step = self.plan[min(self.i, len(self.plan) - 1)]
        self.i += 1
        return step_action(step, observation)
