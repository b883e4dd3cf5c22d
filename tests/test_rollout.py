"""Rollout loop and evaluation harness with a scripted policy (no model): exact, hand-checkable rewards."""

import re

import pytest

from esopt.envs import make_env
from esopt.envs.base import Task
from esopt.policy.base import Policy
from esopt.rollout import RolloutConfig, rollout
from esopt.train.evaluate import evaluate


class ScriptedPolicy(Policy):
    """Replies from a function of the last observation; records the prompts and grammars it was given."""

    def __init__(self, reply):
        self.reply = reply
        self.calls = []

    def generate(self, chats, sampling, action_regex=None, seed=0):
        self.calls.append((chats, action_regex))
        return [self.reply(chat[-1]["content"]) for chat in chats]

    def perturbed(self, member):
        raise NotImplementedError

    def apply(self, update):
        raise NotImplementedError

    def fingerprint(self):
        return "scripted"

    def save(self, directory):
        raise NotImplementedError

    def master_weights(self):
        return {}

    def load_master_weights(self, weights):
        raise NotImplementedError


def _solver(env, tasks):
    """A policy that fills the first empty cell with the solution's digit."""
    solutions = {env.start(t).observation: t.data["solution"] for t in tasks}

    def reply(observation):
        board_lines = [line for line in observation.splitlines() if re.match(r"^\d \|", line)]
        cells = [c for line in board_lines for c in line.split("|", 1)[1].split() if c != "|"]
        for key, solution in solutions.items():
            if all(c == "." or c == s for c, s in zip(cells, solution)) and len(cells) == len(solution):
                i = cells.index(".")
                return f"set {i // 4 + 1} {i % 4 + 1} {solution[i]}"
        return "garbage"

    return reply


def test_solver_gets_full_reward_in_h_star_turns():
    env = make_env("sudoku", {"size": 4, "empty_cells": 3})
    tasks = env.tasks("eval", 5, 0)
    result = rollout(ScriptedPolicy(_solver(env, tasks)), env, tasks, RolloutConfig())
    assert result.metrics == {"mean_reward": 1.0, "success": 1.0, "mean_turns": 3.0, "invalid_rate": 0.0}
    first = result.trajectories[0]
    assert [m["role"] for m in first.messages] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert first.rewards == [0.0, 0.0, 1.0] and first.final_info["success"] is True


def test_garbage_uses_every_turn_and_scores_zero():
    env = make_env("sudoku", {"size": 4, "empty_cells": 2})
    tasks = env.tasks("eval", 3, 0)
    policy = ScriptedPolicy(lambda obs: "I think the answer is blue")
    result = rollout(policy, env, tasks, RolloutConfig())
    assert result.metrics == {"mean_reward": 0.0, "success": 0.0, "mean_turns": 6.0, "invalid_rate": 1.0}
    assert len(policy.calls) == 6  # one batched call per turn for all live episodes


def test_history_window_and_grammars():
    env = make_env("sudoku", {"size": 4, "empty_cells": 2, "grammar": "legal"})
    tasks = env.tasks("eval", 2, 0)
    policy = ScriptedPolicy(lambda obs: "nonsense")
    rollout(policy, env, tasks, RolloutConfig(history_turns=0))
    chats, regexes = policy.calls[-1]
    assert [m["role"] for m in chats[0]] == ["system", "user"]  # only the current observation
    assert all(r.startswith("set (") for r in regexes)  # per-episode legal-move grammar
    policy = ScriptedPolicy(lambda obs: "nonsense")
    rollout(policy, env, tasks, RolloutConfig(history_turns=1, guided_decoding=False))
    chats, regexes = policy.calls[-1]
    assert [m["role"] for m in chats[0]] == ["system", "user", "assistant", "user"]
    assert regexes == [None, None]


def test_evaluate_reports_mean_and_pass_at_k():
    env = make_env("sudoku", {"size": 4, "empty_cells": 1, "max_turns": 1})
    tasks = env.tasks("eval", 4, 0)
    solve = _solver(env, tasks)
    count = {"n": 0}

    def every_other(obs):  # samples alternate: solved, garbage, solved, ...
        count["n"] += 1
        return solve(obs) if count["n"] % 2 else "garbage"

    report = evaluate(ScriptedPolicy(every_other), env, tasks, RolloutConfig(), samples=2)
    assert report["mean@2"] == pytest.approx(0.5)
    assert report["pass@2"] == pytest.approx(1.0)
    assert report["tasks"] == 4 and report["samples"] == 2
    assert report["per_task_invalid"] == [0.5] * 4 and report["invalid_episodes"] == pytest.approx(0.5)


def test_evaluate_reports_success_per_right_answer_over_its_own_tasks():
    """Sudoku H*=1 tasks carry their missing digit as a category: a policy that never gets the digit 1 right
    shows 0 there, one right on half the samples of the digit 2 shows 0.5, and each category's interval is over
    its own tasks (their mean success over samples), not over all tasks or all episodes."""
    from esopt.envs.metrics import wilson_interval

    env = make_env("sudoku", {"size": 4, "empty_cells": 1, "balanced_answers": True, "max_turns": 1})
    tasks = env.tasks("eval", 8, 0)
    solve = _solver(env, tasks)
    twos = {"n": 0}

    def policy(obs):  # never right on 1; right on one of each task's two samples on 2
        reply = solve(obs)
        if reply.endswith(" 2"):
            twos["n"] += 1
            return reply if twos["n"] % 2 else "garbage"
        return "garbage" if reply.endswith(" 1") else reply

    report = evaluate(ScriptedPolicy(policy), env, tasks, RolloutConfig(), samples=2)
    digits = [t.data["solution"][t.data["puzzle"].index(".")] if "." in t.data["puzzle"] else None for t in tasks]
    expected = {"1": 0.0, "2": 0.5, "3": 1.0, "4": 1.0}
    for d in "1234":
        n = sum(1 for x in digits if x == d)
        rate = report["by_category"][f"answer {d}"]
        assert rate["n"] == n > 0
        assert rate["success"] == expected[d]
        assert rate["ci95"] == wilson_interval(expected[d] * n, n)  # fractional per-task successes summed, as overall


class ScoringPolicy(ScriptedPolicy):
    """Gives the reply ending in digit d the probability weights[d - 1] (whatever the chat)."""

    def __init__(self, weights):
        super().__init__(lambda observation: "")
        self.weights = weights

    def reply_logprobs(self, chats, replies, members=None):
        import math

        return [[math.log(self.weights[int(reply[-1]) - 1]) for reply in candidates] for candidates in replies]


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_expected_reward_weights_every_admitted_reply_by_its_probability(temperature):
    from esopt.policy.base import SamplingConfig

    env = make_env("sudoku", {"size": 4, "empty_cells": 1, "grammar": "legal"})
    tasks = env.tasks("train", 6, 0)
    weights = [0.1, 0.2, 0.3, 0.4]
    config = RolloutConfig(expected_reward=True, sampling=SamplingConfig(temperature=temperature))
    result = rollout(ScoringPolicy(weights), env, tasks, config)
    tempered = [w ** (1 / temperature) for w in weights]
    for task, trajectory in zip(tasks, result.trajectories):
        digit = int(task.data["solution"][task.data["puzzle"].index(".")])
        assert trajectory.reward == pytest.approx(tempered[digit - 1] / sum(tempered))  # only the solution scores 1
        assert trajectory.actions[0].endswith(" 4")  # the likeliest reply is the one kept
        assert trajectory.success == (digit == 4)
        assert trajectory.final_info["replies_scored"] == 4
    assert result.metrics["mean_reward"] == pytest.approx(sum(t.reward for t in result.trajectories) / 6)


def test_log_expected_reward_scores_each_episode_by_the_log_of_its_expected_reward():
    """Hand-checked: the solution digit d has probability weights[d - 1] at temperature 1, so each episode's reward
    is log(weights[d - 1]), and a digit of probability 0 counts as the floor, not -inf."""
    import math

    from esopt.confutil import ConfigError
    from esopt.policy.base import SamplingConfig
    from esopt.rollout import LOG_REWARD_FLOOR

    env = make_env("sudoku", {"size": 4, "empty_cells": 1, "grammar": "legal", "balanced_answers": True})
    tasks = env.tasks("train", 8, 0)
    weights = [1e-12, 0.2, 0.3, 0.5 - 1e-12]
    config = RolloutConfig(expected_reward=True, log_expected_reward=True, sampling=SamplingConfig(temperature=1.0))
    result = rollout(ScoringPolicy(weights), env, tasks, config)
    for task, trajectory in zip(tasks, result.trajectories):
        digit = int(task.data["solution"][task.data["puzzle"].index(".")])
        assert trajectory.reward == pytest.approx(math.log(max(weights[digit - 1], LOG_REWARD_FLOOR)))
        assert trajectory.final_info["expected_reward"] == pytest.approx(weights[digit - 1])
    assert min(t.reward for t in result.trajectories) == pytest.approx(math.log(LOG_REWARD_FLOOR))
    with pytest.raises(ConfigError, match="log_expected_reward .* needs rollout.expected_reward"):
        RolloutConfig(log_expected_reward=True).check()


def test_choice_prefixes_cut_each_reply_after_its_last_choice():
    from esopt.rollout import choice_prefixes

    assert choice_prefixes(["set 2 3 1", "set 2 3 2", "set 2 3 4"]) == ["set 2 3 1", "set 2 3 2", "set 2 3 4"]
    assert choice_prefixes(["a: (1 + 8) * 7", "a: (1 + 8) - 7", "a: (1 - 8) * 7"]) == ["a: (1 + 8) *", "a: (1 + 8) -", "a: (1 -"]
    assert choice_prefixes(["ab", "abc", "x"]) == ["ab", "abc", "x"]  # a prefix of another stays whole
    assert choice_prefixes(["only one"]) == ["only one"]


def test_expected_reward_of_a_two_choice_grammar_is_scored_up_to_the_last_choice():
    import itertools
    import math

    from esopt.policy.base import SamplingConfig

    env = make_env("countdown", {"use_all_numbers": True, "shuffle_numbers": False, "answer_grammar": "operators"})
    task = Task(id="hand", data={"numbers": [11, 8, 7], "target": 21, "solution": ""})
    seen = []

    class OperatorPolicy(ScriptedPolicy):  # p(reply) from its operators: "-" twice as likely as any other
        def reply_logprobs(self, chats, replies, members=None):
            seen.extend(replies)
            return [[sum(math.log(2.0 if c == "-" else 1.0) for c in reply[8:]) for reply in candidates] for candidates in replies]

    config = RolloutConfig(expected_reward=True, sampling=SamplingConfig(temperature=1.0))
    (trajectory,) = rollout(OperatorPolicy(lambda observation: ""), env, [task], config).trajectories
    assert sorted(seen[0]) == sorted(f"answer: (11 {a} 8) {b}" for a, b in itertools.product("+-*/", repeat=2))
    weight = {a + b: (2.0 if a == "-" else 1.0) * (2.0 if b == "-" else 1.0) for a, b in itertools.product("+-*/", repeat=2)}
    # only (11 - 8) * 7 hits 21; every admitted reply is well formed (0.1)
    assert trajectory.reward == pytest.approx(0.1 + weight["-*"] / sum(weight.values()))
    assert trajectory.actions == ["answer: (11 - 8) - 7"] and trajectory.final_info["replies_scored"] == 16


def test_expected_reward_refuses_what_it_cannot_enumerate():
    from esopt.confutil import ConfigError
    from esopt.policy.base import SamplingConfig

    config = RolloutConfig(expected_reward=True, sampling=SamplingConfig(temperature=1.0))
    policy = ScoringPolicy([0.25] * 4)
    two_cells = make_env("sudoku", {"size": 4, "empty_cells": 2, "grammar": "legal"})
    with pytest.raises(ConfigError, match="episodes that end after one reply"):
        rollout(policy, two_cells, two_cells.tasks("train", 1, 0), config)
    countdown = make_env("countdown")
    with pytest.raises(ConfigError, match="admits more than 256 replies"):
        rollout(policy, countdown, countdown.tasks("train", 1, 0), config)
    for bad, message in (({"guided_decoding": False}, "needs rollout.guided_decoding"), ({"sampling": SamplingConfig()}, "temperature > 0")):
        with pytest.raises(ConfigError, match=message):
            RolloutConfig(expected_reward=True, **{"sampling": SamplingConfig(temperature=1.0), **bad}).validate()
