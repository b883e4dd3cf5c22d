"""Evaluate members one after another on the trainer's own policy."""

from __future__ import annotations

import time

from esopt.dist.base import Evaluator, MemberResult
from esopt.envs.base import Env, Task
from esopt.es import Member, Update
from esopt.policy.base import Policy
from esopt.rollout import RolloutConfig, rollout


def evaluate_member(
    policy: Policy, env: Env, member: Member, tasks: list[Task], config: RolloutConfig, seed: int, keep: int = 0
) -> MemberResult:
    """Run the step's tasks with the member's perturbation applied; weights are restored on return."""
    t0 = time.perf_counter()
    with policy.perturbed(member):
        t1 = time.perf_counter()
        result = rollout(policy, env, tasks, config, seed=seed)
        t2 = time.perf_counter()
    return MemberResult(
        index=member.index,
        fitness=result.metrics["mean_reward"],
        metrics=result.metrics,
        generate_s=result.generate_s,
        env_s=result.env_s,
        perturb_s=t1 - t0,
        restore_s=time.perf_counter() - t2,
        trajectories=[t.to_json() for t in result.trajectories[:keep]],
    )


class LocalEvaluator(Evaluator):
    def __init__(self, policy: Policy, env: Env):
        self.policy = policy
        self.env = env

    def evaluate(
        self, members: list[Member], tasks: list[Task], config: RolloutConfig, seed: int, keep_trajectories: int = 0
    ) -> list[MemberResult]:
        return [evaluate_member(self.policy, self.env, m, tasks, config, seed, keep_trajectories) for m in members]

    def apply(self, update: Update) -> None:
        self.policy.apply(update)

    def fingerprints(self) -> list[str]:
        return [self.policy.fingerprint()]
