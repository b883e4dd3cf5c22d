"""One contract for every registered env, built-in and plugin alike (new envs are picked up from the
registry): deterministic tasks per seed, disjoint train/val/eval splits, garbage actions that never raise
and count as invalid with no reward and with feedback, episodes that end by max_turns, nothing after the
end, and an oracle that solves its tasks where the env has one. Env-specific behaviour stays in the
per-env test files."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from esopt.confutil import ConfigError, leaf_fields
from esopt.envs import env_class, env_names, make_env
from esopt.envs.base import SPLITS, Env, StepResult

# The examples' envs obey the contract too; custom_env.py is not registered, --env names it by reference.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
ENVS = env_names() + ["custom_env:GuessEnv"]

N = 8  # tasks per (split, seed): enough to expose overlaps and repeats, few enough to stay fast
SEEDS = (0, 1)

# Replies no env accepts as an action: empty, blank, control characters, a lone surrogate (not encodable
# as UTF-8), deep brackets (parsers that recurse), chat-template tokens, and a long nonsense reply.
GARBAGE = ["", " \n\t ", "\x00\x07\x1b[2J\x7f", "\ud800", "{[(" * 3000, "<|im_end|><|endoftext|>", "zq " * 4000]


def _needs_browser() -> list:
    from esopt.envs.web.browser import find_chromium, playwright_available

    chromium = find_chromium(None)
    available = playwright_available() and chromium and os.path.exists(chromium)
    return [pytest.mark.browser, pytest.mark.skipif(not available, reason="the web env's episodes need Chromium")]


# Envs whose episodes need something beyond Python packages; their task checks run everywhere.
EPISODE_MARKS = {"web": _needs_browser}


def _episode_params():
    return [pytest.param(name, marks=EPISODE_MARKS[name]() if name in EPISODE_MARKS else []) for name in ENVS]


@pytest.fixture(scope="module")
def envs():
    """One default-configured instance per env, shared by the module's tests and closed at its end."""
    made: dict[str, Env] = {}
    yield lambda name: made[name] if name in made else made.setdefault(name, make_env(name))
    for env in made.values():
        if hasattr(env, "close"):
            env.close()


def _key(task) -> str:
    return json.dumps(task.data, sort_keys=True)


def _check_result(result: StepResult) -> None:
    assert isinstance(result, StepResult)
    assert isinstance(result.observation, str) and result.observation.strip(), "every step gives feedback"
    assert isinstance(result.reward, float) and isinstance(result.done, bool) and isinstance(result.info, dict)
    assert isinstance(result.info.get("invalid"), bool), "info['invalid'] says whether the action was malformed"


@pytest.mark.parametrize("name", ENVS)
def test_env_loads_and_describes_itself(name):
    cls = env_class(name)
    env = make_env(name)
    assert env.name == cls.name and (name == cls.name or ":" in name), "registered under its own name"
    assert isinstance(env.system_prompt, str) and env.system_prompt.strip()
    assert isinstance(env.max_turns, int) and env.max_turns >= 1
    if env.action_regex is not None:
        re.compile(env.action_regex)
    assert list(leaf_fields(cls.Config)), "options are listed by `esopt envs` and set by --env.OPTION flags"
    json.dumps(env.describe())
    with pytest.raises(ConfigError):
        make_env(name, {"no_such_option_anywhere": 1})


@pytest.mark.parametrize("name", ENVS)
def test_tasks_are_deterministic_per_seed(name, envs):
    env = envs(name)
    for split in SPLITS:
        tasks = env.tasks(split, N, 0)
        assert len(tasks) == N and len({t.id for t in tasks}) == N, "no repeated task within one draw"
        assert [(t.id, t.data) for t in env.tasks(split, N, 0)] == [(t.id, t.data) for t in tasks]
        assert [(t.id, t.data) for t in make_env(name).tasks(split, N, 0)] == [(t.id, t.data) for t in tasks]
        assert all(json.loads(json.dumps(t.data)) == t.data for t in tasks), "task data travels as JSON"
        assert [t.id for t in env.tasks(split, N, 1)] != [t.id for t in tasks], "another seed, other tasks"
    assert env.tasks("train", 0, 0) == []
    with pytest.raises(ValueError):
        env.tasks("test", 1, 0)


@pytest.mark.parametrize("name", ENVS)
def test_splits_are_disjoint(name, envs):
    env = envs(name)
    drawn = {split: [t for seed in SEEDS for t in env.tasks(split, N, seed)] for split in SPLITS}
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1:]:
            assert not {t.id for t in drawn[a]} & {t.id for t in drawn[b]}, (a, b)
            assert not {_key(t) for t in drawn[a]} & {_key(t) for t in drawn[b]}, (a, b)


@pytest.mark.parametrize("name", _episode_params())
def test_garbage_never_raises_and_counts_as_invalid(name, envs):
    env = envs(name)
    task = env.tasks("train", 1, 0)[0]
    for action in GARBAGE:
        result = env.start(task).step(action)
        _check_result(result)
        assert result.info["invalid"] is True, (action[:20], result.info)
        assert result.reward <= 0.0 and result.info.get("success") is not True, (action[:20], result)


@pytest.mark.parametrize("name", _episode_params())
def test_episodes_end_by_max_turns_and_stay_ended(name, envs):
    env = envs(name)
    for task in env.tasks("eval", 2, 0):
        episode = env.start(task)
        assert isinstance(episode.observation, str) and episode.observation.strip()
        results = []
        while not (results and results[-1].done):
            assert len(results) < env.max_turns, f"no end after max_turns={env.max_turns} garbage actions"
            results.append(episode.step(GARBAGE[len(results) % len(GARBAGE)]))
            _check_result(results[-1])
        assert sum(r.reward for r in results) <= 0.0 and results[-1].info.get("success") is not True
        after = episode.step("answer: 1")
        assert after.done and after.reward == 0.0 and after.info.get("invalid") is True, "nothing after the end"


@pytest.mark.parametrize("name", _episode_params())
def test_oracle_solves_its_tasks(name, envs):
    env = envs(name)
    tasks = env.tasks("train", 2, 0) + env.tasks("eval", 1, 0)
    if env.oracle(tasks[0]) is None:
        pytest.skip(f"{name} has no oracle")
    for task in tasks:
        policy, episode = env.oracle(task), env.start(task)
        observation, results = episode.observation, []
        while not (results and results[-1].done):
            assert len(results) < env.max_turns, "the oracle's episode ran past max_turns"
            action = policy(observation)
            grammar = episode.action_regex or env.action_regex
            assert grammar is None or re.fullmatch(grammar, action), f"oracle action {action!r} is outside the grammar"
            results.append(episode.step(action))
            _check_result(results[-1])
            observation = results[-1].observation
        assert not any(r.info["invalid"] for r in results), [r.observation for r in results]
        assert results[-1].info.get("success") is True and sum(r.reward for r in results) >= 1.0, results[-1]
