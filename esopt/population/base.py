"""The evaluator contract the ES trainer uses: evaluate members, apply updates, prove replicas agree."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

from esopt.envs.base import Task
from esopt.es import Member, Update
from esopt.rollout import RolloutConfig


@dataclass
class MemberResult:
    """What comes back from evaluating one member on the step's tasks (scalars and trajectory dicts only,
    so it crosses process boundaries cheaply)."""

    index: int
    fitness: float
    metrics: dict[str, float]
    generate_s: float = 0.0
    env_s: float = 0.0
    perturb_s: float = 0.0
    restore_s: float = 0.0
    generated_tokens: int = 0
    trajectories: list[dict] = field(default_factory=list)


class Evaluator(abc.ABC):
    """Evaluates ES members against the current weights and keeps every weight replica in step."""

    @abc.abstractmethod
    def evaluate(
        self, members: list[Member], tasks: list[Task], config: RolloutConfig, seed: int, keep_trajectories: int = 0
    ) -> list[MemberResult]:
        """One result per member, in the order of `members`. Fitness is the member's mean episode reward.
        `keep_trajectories` trajectories (as dicts) are returned per member."""

    @abc.abstractmethod
    def apply(self, update: Update, verify: bool = True) -> None:
        """Apply the update on every replica. With `verify`, return only once every replica has it and
        matches (RuntimeError naming the ones that differ); without, replicas may apply it later."""

    @abc.abstractmethod
    def fingerprints(self) -> list[str]:
        """The weight fingerprint of every replica (all equal when they are in sync)."""

    def verify(self) -> None:
        """Wait for every update sent so far and raise RuntimeError if a replica differs."""

    def rebase(self, checkpoint: str, version: int) -> None:
        """A checkpoint of the current weights (after `version` updates) was saved: replicas rebuilt
        from now on may start from it instead of replaying every update from the base weights."""

    def metrics(self) -> dict[str, float]:
        """Evaluator-side numbers for metrics.jsonl (e.g. worker restarts and memory)."""
        return {}

    def close(self) -> None:
        """Release workers."""
