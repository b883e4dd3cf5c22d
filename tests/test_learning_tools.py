"""What honest learning measurements rest on: the val split, the sudoku marks view and trivial baseline,
rate intervals and paired gains, jump-forward guided decoding and the eval CLI."""

import random
import re

import pytest

from esopt.envs import make_env
from esopt.envs.metrics import paired_difference, wilson_interval
from esopt.policy.base import SamplingConfig
from esopt.policy.guided import forced_prefix


# ---- splits ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, options",
    [("sudoku", {"size": 4, "empty_cells": 1}), ("countdown", {"max_numbers": 3, "max_value": 20}), ("math", {})],
)
def test_train_val_eval_splits_are_disjoint_and_deterministic(name, options):
    env = make_env(name, options)
    splits = {split: env.tasks(split, 40, 3) for split in ("train", "val", "eval")}
    keys = {split: {str(t.data) for t in tasks} for split, tasks in splits.items()}
    assert all(len(k) == 40 for k in keys.values())
    assert not (keys["train"] & keys["val"]) and not (keys["train"] & keys["eval"]) and not (keys["val"] & keys["eval"])
    assert [t.id for t in env.tasks("val", 40, 3)] == [t.id for t in splits["val"]]


def test_val_split_leaves_the_train_split_unchanged():
    # The val split is carved from the old held-out pool, so training runs made before it existed
    # draw the same training puzzles (and reach the same weights).
    from esopt.envs.sudoku import puzzle_split

    env = make_env("sudoku", {"size": 4, "empty_cells": 1})
    puzzles = [t.data["puzzle"] for t in env.tasks("train", 30, 0)]
    import hashlib

    def old_split(p):
        h = int.from_bytes(hashlib.sha256(("esopt-sudoku-split|" + p).encode()).digest()[:8], "big")
        return "eval" if h % 5 == 0 else "train"

    assert all(old_split(p) == "train" == puzzle_split(p) for p in puzzles)


# ---- sudoku: marks view, answers, trivial baseline ---------------------------------------------------
def _task(puzzle, solution):
    from esopt.envs.base import Task

    return Task(id="t", data={"puzzle": puzzle, "solution": solution})


SOLUTION = "1234341221434321"


def test_marks_view_lists_used_and_free_digits_of_each_empty_cell():
    env = make_env("sudoku", {"size": 4, "empty_cells": 2, "observation": "marks"})
    puzzle = "." + SOLUTION[1:6] + "." + SOLUTION[7:]  # (1,1) needs 1, (2,3) needs 1
    episode = env.start(_task(puzzle, SOLUTION))
    lines = episode.observation.splitlines()
    assert lines[0] == "Cell (1,1) 1:free 2:used 3:used 4:used"
    assert lines[1] == "Cell (2,3) 1:free 2:used 3:used 4:used"
    assert "|" not in episode.observation  # no board in this view
    result = episode.step("set 1 1 3")  # wrong digit: (2,3)'s marks do not change, 3 is now used twice
    assert result.observation.splitlines()[0] == "Cell (2,3) 1:free 2:used 3:used 4:used"
    result = episode.step("set 2 3 1")
    assert result.done and not result.info["success"] and result.info["answer"] == "3 1"


def test_board_view_is_unchanged_by_default():
    env = make_env("sudoku", {"size": 4, "empty_cells": 1})
    episode = env.start(_task("." + SOLUTION[1:], SOLUTION))
    assert episode.observation.startswith("  | 1 2 | 3 4\n--+-----+-----\n1 | . 2 | 3 4")
    assert "Empty (row,col): (1,1)" in episode.observation and "free" not in episode.observation


def test_trivial_baseline_is_the_best_constant_digit():
    env = make_env("sudoku", {"size": 4, "empty_cells": 1})
    tasks = [_task(SOLUTION[:i] + "." + SOLUTION[i + 1 :], SOLUTION) for i in (0, 1, 5, 4, 2)]  # digits 1 2 4 3 3
    assert env.trivial_baseline(tasks) == ("always 3", 0.4)


# ---- intervals ---------------------------------------------------------------------------------
def test_wilson_interval_matches_the_textbook_values():
    low, high = wilson_interval(8, 64)  # p = 0.125
    assert low == pytest.approx(0.0648, abs=5e-4) and high == pytest.approx(0.2276, abs=5e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] == pytest.approx(0.2775, abs=5e-4)
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0) and wilson_interval(10, 10)[0] == pytest.approx(0.7225, abs=5e-4)


def test_paired_difference_sees_a_consistent_gain_and_not_noise():
    rng = random.Random(0)
    before = [float(rng.random() < 0.2) for _ in range(200)]
    after = [1.0 if b else float(rng.random() < 0.3) for b in before]  # never worse, often better
    d = paired_difference(after, before)
    assert d["diff"] == pytest.approx(sum(after) / 200 - sum(before) / 200)
    assert 0 < d["low"] < d["diff"] < d["high"] and d["p"] < 0.001
    noise = paired_difference([float(rng.random() < 0.3) for _ in range(200)], [float(rng.random() < 0.3) for _ in range(200)])
    assert noise["low"] < 0 < noise["high"] and noise["p"] > 0.01
    with pytest.raises(ValueError):
        paired_difference([1.0], [1.0, 0.0])


# ---- jump-forward guided decoding -------------------------------------------------------------------
@pytest.mark.parametrize(
    "regex, prefix, rest",
    [
        ("set (4 3) [1-4]", "set 4 3", r"\ [1-4]"),
        ("set (1 1|2 2) [1-4]", "set", r"\ (1 1|2 2) [1-4]"),
        ("ab|cd", "", "ab|cd"),
        ("abc*d", "ab", "c*d"),
        (r"a\.b(c)?", "a.b", "(c)?"),
        ("(?:ab)c", "", "(?:ab)c"),
        ("answer: .*", "answer:", r"\ .*"),
    ],
)
def test_forced_prefix_splits_a_regex_exactly(regex, prefix, rest):
    assert forced_prefix(regex) == (prefix, rest)
    samples = ["set 4 3 2", "set 4 3 x", "set 1 1 4", "ab", "cd", "abd", "abccd", "a.bc", "a.b", "abc", "answer: 7", "answer:7"]
    for s in samples:
        whole = re.fullmatch(regex, s) is not None
        split = s.startswith(prefix) and re.fullmatch(rest, s[len(prefix):]) is not None
        assert whole == split, (regex, s)


def test_jump_forward_gives_the_same_replies_with_fewer_generated_tokens(make_tiny_policy):
    policy = make_tiny_policy()
    chats = [[{"role": "user", "content": f"Fill cell {i}"}] for i in range(6)]
    regexes = ["set (2 3) [1-4]", "set (1 1|4 4) [1-4]", "set [1-4] [1-4] [1-4]", "set (2 3) [1-4]", None, "x"]
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=12)
    policy.jump_forward = False
    plain = policy.generate(chats, greedy, action_regex=regexes)
    plain_tokens = list(policy.last_reply_tokens)
    policy.jump_forward = True
    fast = policy.generate(chats, greedy, action_regex=regexes)
    assert fast == plain
    assert all(re.fullmatch(r, reply) for r, reply in zip(regexes, fast) if r)
    assert fast[5] == "x" and policy.last_reply_tokens[5] == 1  # only the end-of-sequence token
    assert policy.last_reply_tokens[0] < plain_tokens[0]


def test_balanced_answers_make_every_digit_the_answer_equally_often():
    env = make_env("sudoku", {"size": 4, "empty_cells": 1, "grammar": "legal", "balanced_answers": True})
    tasks = env.tasks("train", 12, 5)
    answers = [int(t.data["solution"][t.data["puzzle"].index(".")]) for t in tasks]
    assert answers == [1, 2, 3, 4] * 3
    assert env.trivial_baseline(tasks) == ("always 1", 0.25)
    unbalanced = make_env("sudoku", {"size": 4, "empty_cells": 1, "grammar": "legal"}).tasks("train", 12, 5)
    assert [int(t.data["solution"][t.data["puzzle"].index(".")]) for t in unbalanced] != answers


def test_heldout_comparison_pairs_success_and_invalid_episodes_task_by_task(tmp_path):
    import json

    from esopt.train.report import EVAL_KEYS, eval_section, heldout_comparison

    def write(step, rows):
        path = tmp_path / "trajectories" / f"eval_step{step:05d}.jsonl"
        path.parent.mkdir(exist_ok=True)
        records = [{"success": s, "invalid": i, "final_info": {"answer": a, **({"category": c} if c else {})}} for s, i, a, c in rows]
        records.append({"success": False, "invalid": [False]})  # an episode without final_info: no category
        path.write_text("".join(json.dumps(r) + "\n" for r in records))

    write(0, [(False, [True], "x", "answer 3"), (False, [True], "x", "answer a * b | a / b"), (True, [False], "4", "answer 4"),
              (False, [False, True], "2", "answer 3"), (False, [False], "1", None)])
    write(5, [(True, [False], "3", "answer 3"), (False, [True], "x", "answer a * b | a / b"), (True, [False], "4", "answer 4"),
              (False, [False], "2", "answer 3"), (True, [False], "1", "answer 1")])  # only the after episode named its category
    h = heldout_comparison(tmp_path, 0, 5)
    assert h["gain"]["diff"] == pytest.approx(1 / 3) and h["gain"]["n"] == 6
    assert h["invalid_episodes"] == (0.5, 1 / 6) and h["invalid_change"]["diff"] == pytest.approx(-1 / 3)
    assert h["answers"]["before"][0] == ("x", 2)
    assert list(h["category_successes"]) == ["answer 1", "answer 3", "answer 4", "answer a * b | a / b"]  # sorted
    assert h["category_successes"]["answer 3"] == {"before": [0.0, 0.0], "after": [1.0, 0.0]}
    assert h["category_successes"]["answer 1"] == {"before": [0.0], "after": [1.0]}
    summary = {"before": dict.fromkeys(EVAL_KEYS, 0.0), "after": dict.fromkeys(EVAL_KEYS, 0.0), "eval_steps": (0, 5), "heldout": h}
    section = eval_section(summary, "6 val tasks")
    assert "| answer 3 | 2 | 0.000 [0.000, 0.658] | 0.500 [0.095, 0.905] |" in section
    bar_row = next(line for line in section if line.startswith("| answer a * b"))
    assert bar_row.replace("\\|", "").count("|") == 5  # the bar in the category is escaped: still four cells


def test_ablation_pairs_each_run_with_the_reference_on_the_same_tasks(tmp_path):
    import json

    from benchmarks.ablation import versus

    def run(name: str, successes: dict[str, bool]) -> "object":
        directory = tmp_path / name / "trajectories"
        directory.mkdir(parents=True)
        (directory / "eval_step00000.jsonl").write_text(json.dumps({"task_id": "t0", "success": False}) + "\n")
        lines = [json.dumps({"task_id": k, "success": v}) for k, v in successes.items()]
        (directory / "eval_step00020.jsonl").write_text("\n".join(lines) + "\n")
        return tmp_path / name

    tasks = [f"t{i}" for i in range(40)]
    reference = run("ref", {t: i < 10 for i, t in enumerate(tasks)})
    better = run("better", {t: int(t[1:]) < 20 for t in reversed(tasks)})  # the last eval counts, in any order
    other_tasks = run("other", {f"u{i}": True for i in range(40)})
    assert versus(better, reference).startswith("+0.250 [+0.1")  # 10 more solved of 40, none lost
    assert versus(other_tasks, reference) == "-"  # different tasks: no paired difference


def test_learning_benchmark_curve_counts_training_seconds_and_episodes_up_to_each_evaluation(tmp_path):
    """A curve row per evaluation: updates so far, training seconds so far (evaluation time not counted, as
    GRPO's equal-seconds budget is ES's training seconds) and episodes so far (G x tasks per ES step)."""
    import json

    import yaml

    from benchmarks.learning import curve

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"es": {"population": 8}, "tasks_per_step": 32}))
    records = [{"step": 0, "eval/success": 0.07}, {"step": 1, "time/step_s": 5.0}, {"step": 2, "time/step_s": 7.0},
               {"step": 2, "eval/success": 0.28}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert curve(tmp_path) == [
        {"step": 0, "seconds": 0.0, "episodes": 0, "success": 0.07},
        {"step": 2, "seconds": 12.0, "episodes": 512, "success": 0.28},
    ]


def test_evaluation_refuses_expected_reward_scoring():
    """An expected-reward rollout reports the likeliest reply's success, not a sampled episode's: a Mean@k
    measured that way would be greedy success under another name (benchmarks/learning.py once did this)."""
    from esopt.confutil import ConfigError
    from esopt.envs import make_env
    from esopt.rollout import RolloutConfig, SamplingConfig
    from esopt.train.evaluate import evaluate

    env = make_env("sudoku", {"empty_cells": 1, "grammar": "legal"})
    scored = RolloutConfig(expected_reward=True, sampling=SamplingConfig(temperature=0.7))
    with pytest.raises(ConfigError, match="real episodes"):
        evaluate(None, env, env.tasks("val", 2, 0), scored, samples=4)


def test_learning_benchmark_compares_es_with_grpo_task_by_task():
    """The head-to-head rows: ES minus GRPO of the same seed on the same tasks, and their mean over seeds
    (hand-computed: seed 0 +1/4, seed 1 -2/4, mean -1/8); a seed whose GRPO run is missing is left out."""
    from benchmarks.learning import head_to_head

    def model(successes):
        return {"greedy": {"per_task_success": successes}}

    results = {
        "base": model([0.0, 0.0, 0.0, 0.0]),
        "ES seed 0": model([1.0, 1.0, 0.0, 0.0]),
        "GRPO seed 0": model([1.0, 0.0, 0.0, 0.0]),
        "ES seed 1": model([0.0, 0.0, 0.0, 0.0]),
        "GRPO seed 1": model([1.0, 1.0, 0.0, 0.0]),
        "ES seed 2": model([1.0, 1.0, 1.0, 1.0]),
    }
    rows = [line for line in head_to_head(results, samples=False) if line.startswith("| ") and "seeds" not in line[:8]]
    assert [row.split(" | ")[0] for row in rows] == ["| seed 0", "| seed 1", "| mean of 2 (tasks resampled, seeds fixed)"]
    assert [row.split(" | ")[1].split()[0] for row in rows] == ["+0.250", "-0.500", "-0.125"]
    assert head_to_head({"base": model([0.0])}, samples=False) == []


def test_learning_benchmark_tables_success_by_right_answer():
    """One column per category with the base's task count; a model never right on one answer shows 0.00 there."""
    from benchmarks.learning import by_category

    def model(plus, minus):
        return {"greedy": {"by_category": {"answer a + b": {"success": plus, "ci95": (0, 1), "n": 43},
                                           "answer a - b": {"success": minus, "ci95": (0, 1), "n": 43}}}}

    lines = by_category({"base": model(0.1, 1.0), "ES seed 0": model(0.0, 0.8)})
    assert lines[2] == "| model | answer a + b (n = 43) | answer a - b (n = 43) |"
    assert lines[4:6] == ["| base | 0.10 | 1.00 |", "| ES seed 0 | 0.00 | 0.80 |"]
    both = {"greedy": {"by_category": {"answer a * b | a / b": {"success": 1.0, "ci95": (0, 1), "n": 9}}}}
    assert by_category({"base": both})[2] == "| model | answer a * b \\| a / b (n = 9) |"
    assert by_category({"base": {"greedy": {"success_mean@1": 0.5, "by_category": {}}}}) == []


def test_learning_benchmark_takes_grpo_from_an_earlier_benchmark_only_on_the_same_base_results():
    """--grpo-from: the earlier file's GRPO rows sit after each ES row of the same seed it has, a seed it lacks
    keeps the GRPO row trained in this run; a base model whose per-task results differ (another machine kind or
    other tasks) makes it refuse."""
    from benchmarks.learning import with_baseline_grpo

    def model(successes):
        return {"greedy": {"per_task_success": successes}}

    results = {"base": model([0.0, 1.0]), "ES seed 0": model([1.0, 1.0]), "ES seed 1": model([1.0, 0.0]),
               "ES seed 2": model([0.0, 0.0]), "GRPO seed 2": model([0.0, 1.0])}
    earlier = {
        "results": {"base": model([0.0, 1.0]), "ES seed 0": model([0.0, 0.0]), "GRPO seed 0": model([1.0, 0.0]), "GRPO seed 1": model([0.0, 0.0])},
        "curves": {"GRPO seed 0": [{"step": 11, "seconds": 1383.0, "episodes": 1408, "success": 0.7}], "GRPO seed 1": []},
    }
    merged, curves = with_baseline_grpo(results, {"ES seed 0": []}, earlier, [0, 1, 2], "old.json")
    assert list(merged) == ["base", "ES seed 0", "GRPO seed 0", "ES seed 1", "GRPO seed 1", "ES seed 2", "GRPO seed 2"]
    assert merged["ES seed 0"] == model([1.0, 1.0]) and merged["GRPO seed 0"] == model([1.0, 0.0])
    assert merged["GRPO seed 2"] == model([0.0, 1.0])
    assert curves["GRPO seed 0"][0]["seconds"] == 1383.0
    earlier["results"]["base"] = model([1.0, 1.0])
    with pytest.raises(SystemExit, match="not comparable"):
        with_baseline_grpo(results, {}, earlier, [0, 1], "old.json")
