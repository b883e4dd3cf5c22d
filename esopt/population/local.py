"""Evaluate members on the trainer's own policy: one after another with materialised weights, or (low-rank
noise on a policy that supports it) the whole population in one batched rollout over shared weights."""

from __future__ import annotations

import time

from esopt.population.base import Evaluator, MemberResult
from esopt.envs.base import Env, Task
from esopt.es import Member, Update
from esopt.policy.base import Policy
from esopt.rollout import RolloutConfig, RolloutResult, rollout


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
        generated_tokens=result.generated_tokens,
        trajectories=[t.to_json() for t in result.trajectories[:keep]],
    )


def evaluate_population(
    policy: Policy, env: Env, members: list[Member], tasks: list[Task], config: RolloutConfig, seed: int, keep: int = 0
) -> list[MemberResult]:
    """All members in ONE rollout over len(members) x len(tasks) episodes: the tasks repeated per member,
    each episode's rows tagged with its member (Policy.generate(members=...)). Same tasks and decode seed
    as `evaluate_member`, so greedy decoding gives each member the fitness it gets alone. The shared
    timings (generate, env, factor setup) are split evenly over the members so the trainer's sums hold."""
    n, g = len(tasks), len(members)
    t0 = time.perf_counter()
    with policy.population(members):
        t1 = time.perf_counter()
        result = rollout(
            policy, env, [task for _ in members for task in tasks], config, seed=seed,
            members=[m for m in members for _ in tasks],
        )
        t2 = time.perf_counter()
    restore_s = time.perf_counter() - t2
    results = []
    for k, member in enumerate(members):
        own = RolloutResult(result.trajectories[k * n : (k + 1) * n], 0.0, 0.0)
        results.append(
            MemberResult(
                index=member.index,
                fitness=own.metrics["mean_reward"],
                metrics=own.metrics,
                generate_s=result.generate_s / g,
                env_s=result.env_s / g,
                perturb_s=(t1 - t0) / g,
                restore_s=restore_s / g,
                generated_tokens=own.generated_tokens,
                trajectories=[t.to_json() for t in own.trajectories[:keep]],
            )
        )
    return results


class LocalEvaluator(Evaluator):
    def __init__(self, policy: Policy, env: Env, population_batching: bool = True):
        self.policy = policy
        self.env = env
        self.population_batching = population_batching
        """Evaluate low-rank members in one batched rollout when the policy supports it (else one by one)."""

    def batched(self, members: list[Member]) -> bool:
        """Whether `evaluate(members, ...)` uses the population-batched path."""
        return (
            self.population_batching
            and bool(members)
            and all(m.noise.kind == "lowrank" for m in members)
            and self.policy.supports_population(members)
        )

    def evaluate(
        self, members: list[Member], tasks: list[Task], config: RolloutConfig, seed: int, keep_trajectories: int = 0
    ) -> list[MemberResult]:
        if self.batched(members):
            return evaluate_population(self.policy, self.env, members, tasks, config, seed, keep_trajectories)
        return [evaluate_member(self.policy, self.env, m, tasks, config, seed, keep_trajectories) for m in members]

    def apply(self, update: Update, verify: bool = True) -> None:
        self.policy.apply(update)

    def fingerprints(self) -> list[str]:
        return [self.policy.fingerprint()]
