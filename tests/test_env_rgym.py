"""The reasoning_gym env: any dataset of the catalogue, its own prompt and scorer, retries, mixtures, disjoint splits."""

import os
import random
from collections import Counter

import pytest

pytest.importorskip("reasoning_gym")

from esopt.cli import main  # noqa: E402
from esopt.confutil import ConfigError  # noqa: E402
from esopt.envs import make_env  # noqa: E402
from esopt.envs.base import SPLITS  # noqa: E402
from esopt.envs.rgym import catalogue, usable_datasets  # noqa: E402


def _answer(text: str) -> str:
    return f"Let me think. <answer>{text}</answer>"


def test_catalogue_lists_the_datasets_and_excludes_unusable_ones_with_a_reason(capsys):
    entries = catalogue()
    assert "mixture of datasets itself" in entries["composite"]["excluded"]
    assert {"letter_counting", "word_sorting", "chain_sum", "acre"} <= set(usable_datasets())
    assert len(usable_datasets()) >= 90
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    assert "datasets (" in out and "word_sorting" in out and "excluded: composite" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env.dataset", "composite"], "dataset 'composite' is unavailable: a mixture"),
        (["--env.dataset", "no_such_puzzle"], "unknown dataset 'no_such_puzzle'"),
        (["--env.datasets", "chain_sum:x"], "bad weight"),
        (["--env.datasets", "chain_sum:0"], "must not all be 0"),
        (["--env.attempts", "0"], "attempts must be an integer >= 1"),
    ],
)
def test_bad_choices_are_one_line_errors(capsys, tmp_path, args, message):
    assert main(["train", "--env", "reasoning_gym", *args, "--runs_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_one_turn_is_scored_by_the_datasets_own_scorer_under_its_own_prompt():
    env = make_env("reasoning_gym", {"dataset": "word_sorting"})
    assert "<answer>" in env.system_prompt and "calculator" not in env.system_prompt
    task = env.tasks("eval", 1, 0)[0]
    episode = env.start(task)
    assert episode.observation == task.data["question"].strip() and "sort" in episode.observation
    right = episode.step(_answer(task.data["answer"]))
    assert (right.reward, right.done, right.info["success"], right.info["category"]) == (1.0, True, True, "word_sorting")
    words = task.data["answer"].split(", ")
    reordered = env.start(task).step(_answer(", ".join(reversed(words))))
    assert reordered.done and not reordered.info["success"] and reordered.reward < 1.0
    untagged = env.start(task).step(task.data["answer"])  # the protocol asks for <answer> tags
    assert untagged.done and untagged.info["invalid"] and untagged.reward == 0.0 and untagged.info["answer"] is None


def test_multi_turn_returns_feedback_and_lets_the_agent_retry():
    env = make_env("reasoning_gym", {"dataset": "leg_counting", "attempts": 3, "retry_discount": 0.5})
    assert env.max_turns == 3 and "3 attempts" in env.system_prompt
    task = env.tasks("train", 1, 0)[0]
    episode = env.start(task)
    first = episode.step("no tags here")
    assert not first.done and first.info["invalid"] and "<answer>" in first.observation and "2 attempts left" in first.observation
    wrong = str(int(task.data["answer"]) + 1)
    second = episode.step(_answer(wrong))
    assert not second.done and second.reward == 0.0 and "scored 0.00" in second.observation
    third = episode.step(_answer(task.data["answer"]))
    assert third.done and third.info["success"] and third.reward == pytest.approx(0.25)  # 1.0 * 0.5**2
    out_of_attempts = env.start(task)
    results = [out_of_attempts.step(_answer(wrong)) for _ in range(3)]
    assert [r.done for r in results] == [False, False, True] and results[-1].info["success"] is False


def test_mixture_follows_its_weights_and_splits_never_overlap():
    env = make_env("reasoning_gym", {"datasets": ["chain_sum:3", "leg_counting:1", "word_sorting:0"]})
    split_tasks = {split: env.tasks(split, 80, 0) for split in SPLITS}
    counts = Counter(t.data["dataset"] for t in split_tasks["train"])
    assert set(counts) == {"chain_sum", "leg_counting"} and counts["chain_sum"] > 2 * counts["leg_counting"]
    questions = {split: {(t.data["dataset"], t.data["question"]) for t in tasks} for split, tasks in split_tasks.items()}
    assert all(len(q) == 80 for q in questions.values())
    assert not (questions["train"] & questions["val"] or questions["train"] & questions["eval"] or questions["val"] & questions["eval"])
    assert env.tasks("train", 80, 0) == split_tasks["train"] and env.tasks("train", 80, 1) != split_tasks["train"]


@pytest.mark.slow
@pytest.mark.timeout(1800)  # five short training runs: minutes on a busy machine
def test_es_step_on_five_random_datasets_from_the_catalogue(tmp_path, tiny_train_config, make_tiny_policy):
    """One ES step on the tiny model for each of five datasets drawn at random (a new draw every run;
    ESOPT_RG_SEED=<seed> repeats one)."""
    from esopt.train.es_trainer import ESTrainer

    seed = int(os.environ.get("ESOPT_RG_SEED") or random.SystemRandom().randrange(2**31))
    chosen = random.Random(seed).sample(usable_datasets(), 5)
    print(f"reasoning-gym datasets {chosen} (repeat with ESOPT_RG_SEED={seed})")
    for name in chosen:
        config = tiny_train_config(tmp_path, name, steps=1, tasks_per_step=2, eval_tasks=2, eval_every=0)
        config.env.name, config.env.options = "reasoning_gym", {"dataset": name}
        config.es.population = 2
        config.rollout.sampling.max_new_tokens = 6
        config.rollout.guided_decoding = False
        summary = ESTrainer.start(config, policy=make_tiny_policy()).run()
        assert (tmp_path / name / "history.jsonl").read_text().count("\n") == 1, f"{name} (ESOPT_RG_SEED={seed})"
        assert summary, f"{name} (ESOPT_RG_SEED={seed})"


def test_an_unusable_dataset_is_refused_before_a_run_starts():
    with pytest.raises(ConfigError, match="unavailable"):
        make_env("reasoning_gym", {"dataset": "composite"})
