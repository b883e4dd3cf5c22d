"""One weight replica on a worker: its own policy, its own env, members evaluated one at a time.

`Replica` is a plain class (Ray wraps it as an actor in ray_evaluator.py, tests can use it directly).
It is built from a picklable policy factory (base weights), optionally a checkpoint directory, and
the list of updates applied after that, so a replacement for a dead worker reaches exactly the
driver's weights by replay: only seeds and coefficients cross process boundaries, never weights.
"""

from __future__ import annotations

import os
import resource
from typing import Callable

import torch

from esopt.population.base import MemberResult
from esopt.population.local import evaluate_member
from esopt.envs import make_env
from esopt.envs.base import Task
from esopt.es import Member, Update
from esopt.policy.base import Policy
from esopt.rollout import RolloutConfig

PolicyFactory = Callable[[], Policy]
"""A picklable zero-argument callable that returns a policy holding the run's base weights."""


def model_policy(model) -> Policy:
    """Factory for the run's model (a ModelConfig): `functools.partial(model_policy, config.model)`."""
    from esopt.policy import load_policy

    return load_policy(model)


def set_threads(threads: int) -> None:
    """Limit torch's intra-op threads (and inter-op threads, where torch still allows it)."""
    if threads > 0:
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(threads)
        except RuntimeError:  # only settable before the first inter-op parallel work
            pass


class Replica:
    def __init__(
        self,
        factory: PolicyFactory,
        env_name: str,
        env_options: dict,
        threads: int = 0,
        checkpoint: str | None = None,
        base_version: int = 0,
        updates: list[Update] | None = None,
    ):
        set_threads(threads)
        self.policy = factory()
        set_threads(threads)  # a factory may set its own thread count (model.threads)
        if checkpoint is not None:
            self.policy.load_checkpoint(checkpoint)
        updates = list(updates or [])
        for update in updates:
            self.policy.apply(update)
        self.version = base_version + len(updates)
        self.env = make_env(env_name, env_options)

    def ready(self) -> tuple[int, str, int]:
        """(weights version, fingerprint, pid): the driver checks these before using the replica."""
        return self.version, self.policy.fingerprint(), os.getpid()

    def fingerprint(self) -> tuple[int, str]:
        return self.version, self.policy.fingerprint()

    def evaluate(
        self,
        member: Member,
        tasks: list[Task],
        config: RolloutConfig,
        seed: int,
        keep: int = 0,
    ) -> tuple[int, MemberResult]:
        """(the version evaluated at, the member's result)."""
        return self.version, evaluate_member(self.policy, self.env, member, tasks, config, seed, keep)

    def apply(self, update: Update) -> tuple[int, str]:
        """Apply the update; return (new version, fingerprint)."""
        self.policy.apply(update)
        self.version += 1
        return self.version, self.policy.fingerprint()

    def rss_mb(self) -> float:
        """Peak resident memory of this worker process (MB)."""
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
