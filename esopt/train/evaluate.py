"""Evaluation harness: k episodes per task -> Mean@k, Pass@k (Max@k for graded rewards), turns, per category,
each rate with its 95% interval, the model's answer distribution and the best trivial policy's rate."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from esopt.confutil import Config, ConfigError, opt
from esopt.envs.base import SPLITS, Env, Task, shown_answer
from esopt.envs.metrics import max_at_k, mean_at_k, pass_at_k, wilson_interval
from esopt.policy.base import Policy
from esopt.policy.config import ModelConfig
from esopt.rollout import RolloutConfig, rollout
from esopt.runconfig import EnvSection


@dataclass
class EvalConfig(Config):
    """`esopt eval`: a model (or run) on tasks of one split, k episodes each."""

    model: ModelConfig = opt(ModelConfig(), "the model (--compare names two models or run directories instead)")
    env: EnvSection = opt(EnvSection(), "the task environment")
    rollout: RolloutConfig = opt(RolloutConfig(), "how episodes are run")
    tasks: int = opt(32, "number of tasks")
    split: str = opt("eval", "task split: train, val (for choosing settings) or eval (held out)")
    seed: int = opt(0, "task and decoding seed")
    samples: int = opt(1, "k episodes per task for Mean@k / Pass@k (use temperature > 0)")
    out: str | None = opt(None, "write trajectories (JSONL) here")

    def check(self) -> None:
        from esopt.envs import make_env

        if self.tasks < 1 or self.samples < 1:
            raise ConfigError("--tasks and --samples must be >= 1")
        if self.rollout.expected_reward:
            raise ConfigError("rollout.expected_reward scores ES training members; esopt eval plays real episodes")
        if self.split not in SPLITS:
            raise ConfigError(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        make_env(self.env.name, self.env.options)


def evaluate(
    policy: Policy,
    env: Env,
    tasks: list[Task],
    config: RolloutConfig,
    samples: int = 1,
    seed: int = 0,
    out: str | None = None,
) -> dict:
    """Run `samples` episodes of every task in one batched rollout and score them. `per_task_success`
    (each task's mean success over its samples, in task order) feeds paired comparisons."""
    if config.expected_reward:  # it scores replies and reports the likeliest one's success: not a sampled episode
        raise ConfigError("evaluate plays real episodes: pass a rollout config with expected_reward false")
    result = rollout(policy, env, [task for task in tasks for _ in range(samples)], config, seed=seed)
    by_task = [result.trajectories[i * samples : (i + 1) * samples] for i in range(len(tasks))]
    rewards = [[t.reward for t in group] for group in by_task]
    successes = [[t.success for t in group] for group in by_task]
    k = samples
    report: dict = {
        "tasks": len(tasks),
        "samples": k,
        f"mean@{k}": mean_at_k(rewards),
        f"success_mean@{k}": mean_at_k([[float(s) for s in row] for row in successes]),
        f"pass@{k}": pass_at_k(successes, k),
        f"max@{k}": max_at_k(rewards, k),
        "mean_turns": sum(t.turns for t in result.trajectories) / len(result.trajectories),
        "invalid_rate": result.metrics["invalid_rate"],
    }
    per_task = [sum(row) / k for row in successes]
    report[f"success_mean@{k}_ci95"] = wilson_interval(sum(per_task), len(tasks))
    answers = Counter(shown_answer(t.final_info) for t in result.trajectories)
    report["answers"] = dict(answers.most_common())
    trivial = env.trivial_baseline(tasks)
    if trivial is not None:
        report["trivial_policy"], report["trivial_success"] = trivial
    report["per_task_success"] = per_task
    # an episode with any invalid action; per task, so two models compare on the same tasks as success does
    report["per_task_invalid"] = [sum(any(t.invalid) for t in group) / k for group in by_task]
    report["invalid_episodes"] = sum(report["per_task_invalid"]) / len(tasks)
    report["invalid_episodes_ci95"] = wilson_interval(sum(report["per_task_invalid"]), len(tasks))
    # success per task category (e.g. the task's right answer), over tasks as the overall rate is
    categories: dict[str, list[float]] = defaultdict(list)
    for group, success in zip(by_task, per_task):
        if "category" in group[0].final_info:
            categories[str(group[0].final_info["category"])].append(success)
    report["by_category"] = {
        category: {"success": sum(values) / len(values), "ci95": wilson_interval(sum(values), len(values)), "n": len(values)}
        for category, values in sorted(categories.items())
    }
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            for trajectory in result.trajectories:
                f.write(json.dumps(trajectory.to_json()) + "\n")
    return report
