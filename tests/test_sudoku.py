"""Tests for the Sudoku env: generator, splits, action parsing, episodes and rewards."""

from __future__ import annotations

import json
import random
import re

import pytest

from esopt.confutil import ConfigError
from esopt.envs import env_class, make_env
from esopt.envs.sudoku import (
    SudokuConfig,
    SudokuEnv,
    generate_puzzle,
    is_valid_solution,
    parse_action,
    puzzle_split,
    solve,
)
from esopt.envs.base import Task


def make(size=4, empty_cells=2, **kw) -> SudokuEnv:
    return SudokuEnv(SudokuConfig(size=size, empty_cells=empty_cells, **kw))


def empties(task: Task, size: int) -> list[tuple[int, int, int]]:
    """(row, col, right digit), 1-based, for every empty cell of the task."""
    p, s = task.data["puzzle"], task.data["solution"]
    return [(i // size + 1, i % size + 1, int(s[i])) for i, ch in enumerate(p) if ch == "."]


def givens(task: Task, size: int) -> list[tuple[int, int, int]]:
    p = task.data["puzzle"]
    return [(i // size + 1, i % size + 1, int(p[i])) for i, ch in enumerate(p) if ch != "."]


# -- solver and generator ------------------------------------------------------------------------


def test_solver_basics():
    grid = "1234341221434321"
    assert is_valid_solution(grid, 4)
    assert not is_valid_solution("1234341221434312", 4)
    assert not is_valid_solution("1234341221434.21", 4)
    assert solve("1234341221434.21") == [grid]
    assert solve("1234341221434021", 4) == [grid]  # "0" also means empty
    assert solve("1134341221434.21") == []  # givens conflict
    assert len(solve("." * 16, limit=2)) == 2
    assert len(solve("." * 16, limit=1000)) == 288  # all 4x4 Sudoku grids
    with pytest.raises(ValueError):
        solve("123")


@pytest.mark.parametrize(
    "size,h,seeds",
    [(4, 1, range(4)), (4, 2, range(4)), (4, 6, range(3)), (4, 10, range(3)), (4, 12, range(2)),
     (9, 5, range(2)), (9, 30, range(1)), (9, 45, range(1))],
)
def test_generated_puzzles_unique_with_exact_holes(size, h, seeds):
    env = make(size, h)
    for seed in seeds:
        for split in ("train", "eval"):
            for t in env.tasks(split, 3 if size == 9 else 8, seed):
                p, s = t.data["puzzle"], t.data["solution"]
                assert len(p) == len(s) == size * size
                assert p.count(".") == h
                assert is_valid_solution(s, size)
                assert all(a == "." or a == b for a, b in zip(p, s))
                assert solve(p, size, limit=2) == [s]
                assert puzzle_split(p) == split
                assert t.id.startswith(f"sudoku{size}-h{h}-") and len(t.id.split("-")[-1]) == 8


def test_generate_puzzle_direct():
    for k in range(20):
        made = generate_puzzle(9, 40, random.Random(k))
        assert made is not None
        p, s = made
        assert p.count(".") == 40 and solve(p, limit=2) == [s]


def test_tasks_are_prefix_stable():  # determinism per seed and the rest of the protocol: test_env_contract.py
    env = make(4, 3)
    assert env.tasks("train", 5, 7) == env.tasks("train", 20, 7)[:5]


def test_splits_disjoint_and_no_duplicates_at_scale():
    env = make(4, 4)
    train = env.tasks("train", 300, 0)
    ev = env.tasks("eval", 150, 0)
    train_ids, eval_ids = {t.id for t in train}, {t.id for t in ev}
    assert len(train_ids) == 300 and len(eval_ids) == 150  # no duplicates within a call
    assert not train_ids & eval_ids
    # other seeds also stay on their side
    assert not {t.id for t in env.tasks("train", 100, 1)} & eval_ids
    assert not {t.id for t in env.tasks("eval", 50, 1)} & train_ids


def test_no_duplicates_in_small_pool():
    # 4x4 with one hole: 288 grids * 16 cells = 4608 puzzles, about 1/5 eval.
    env = make(4, 1)
    ts = env.tasks("eval", 60, 3)
    assert len({t.id for t in ts}) == 60


# -- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"size": 5}, "size"),
        ({"size": True}, "size"),
        ({"empty_cells": 0}, "empty_cells"),
        ({"empty_cells": 13}, "empty_cells"),
        ({"size": 9, "empty_cells": 70}, "empty_cells"),
        ({"empty_cells": 2.5}, "empty_cells"),
        ({"empty_cells": 4, "max_turns": 3}, "max_turns 3 < empty_cells 4 never solves"),
        ({"empty_cells": 4, "max_turns": 0, "partial_credit": True}, "max_turns"),
        ({"max_turns": "10"}, "max_turns"),
        ({"partial_credit": "yes"}, "partial_credit"),
        ({"fill_order": "random"}, "fill_order"),
    ],
)
def test_config_validation(kw, field):
    with pytest.raises(ConfigError, match=field):
        SudokuConfig(**kw).validate()


def test_config_defaults_and_registry():
    env = make_env("sudoku", {"size": 4, "empty_cells": 3})
    assert isinstance(env, SudokuEnv) and env_class("sudoku") is SudokuEnv
    assert env.max_turns == 9
    assert make(4, 3, max_turns=4).max_turns == 4
    assert SudokuEnv().config == SudokuConfig()
    assert env.describe()["empty_cells"] == 3
    with pytest.raises(ConfigError):
        make_env("sudoku", {"bogus": 1})
    assert make(9, 10).system_prompt.count("9x9") == 1
    assert "set <row> <col> <value>" in env.system_prompt


# -- actions -------------------------------------------------------------------------------------


def test_action_regex():
    rx4, rx9 = make(4).action_regex, make(9, 5).action_regex
    for a in ["set 1 1 1", "set 4 3 2", "set 2 4 4"]:
        assert re.fullmatch(rx4, a)
    for a in ["set 9 9 9", "set 1 5 7"]:
        assert re.fullmatch(rx9, a)
    for a in ["", "set 5 1 1", "set 0 1 1", "set 1 1", "set 1 1 1 1", "r1c1=1", "hello", "SET 1 1 1x"]:
        assert not re.fullmatch(rx4, a)
    assert not re.fullmatch(rx9, "set 10 1 1")


@pytest.mark.parametrize(
    "text,expected",
    [
        ("set 1 2 3", (1, 2, 3)),
        ("  SET   1  2   3  ", (1, 2, 3)),
        ("Set 1,2,3", (1, 2, 3)),
        ("set(1, 2, 3)", (1, 2, 3)),
        ("set row 1 col 2 value 3", (1, 2, 3)),
        ("I think\nset 4\t3 1\nbecause...", (4, 3, 1)),
        ("set 1 2 3 then set 2 2 2", (1, 2, 3)),
        ("r3c4=2", (3, 4, 2)),
        ("R3 C4 = 2", (3, 4, 2)),
        ('{"row": 2, "col": 1, "value": 4}', (2, 1, 4)),
        ('answer: {"Row": "2", "column": 1.0, "val": 4}', (2, 1, 4)),
        ('r1c1=3 {"row": 2, "col": 1, "value": 4}', (1, 1, 3)),
        ('{"row": 2, "col": 1, "value": 4} set 1 1 1', (2, 1, 4)),
        ("set 0 1 1", (0, 1, 1)),
        ("set -1 1 1", (-1, 1, 1)),
        ("", None),
        ("set 1 2", None),
        ("hello world", None),
        ('{"row": 1, "col": 2}', None),
        ('{"row": true, "col": 2, "value": 3}', None),
        ("{not json", None),
        ("reset 1 2 3", None),
    ],
)
def test_parse_action(text, expected):
    assert parse_action(text) == expected


def test_parse_action_never_raises_and_is_fast():
    weird = [
        "x" * 200_000,
        " " * 200_000 + "set 1",
        "set 1" + " " * 100_000 + "2",
        "set " + "9" * 50_000 + " 1 1",
        "{" * 50_000,
        "{" + '"row":' * 10_000 + "}",
        '{"row": ' + "9" * 6000 + ', "col": 1, "value": 1}',
        '{"row": NaN, "col": Infinity, "value": 1e999}',
        "r" * 10_000 + "c" * 10_000 + "=",
        "\x00\ufffd🙂 set ١ ٢ ٣",
        "set 𝟏 𝟐 𝟑",
        "[[[[" * 1000 + "]]]]" * 1000,
        "{" + "[" * 5000 + "]" * 5000 + "}",
    ]
    for w in weird:
        r = parse_action(w)
        assert r is None or all(isinstance(x, int) for x in r)
    assert parse_action(None) is None  # type: ignore[arg-type]


# -- episodes ------------------------------------------------------------------------------------


FORMATS = [
    lambda r, c, v: f"set {r} {c} {v}",
    lambda r, c, v: f"r{r}c{c}={v}",
    lambda r, c, v: json.dumps({"row": r, "col": c, "value": v}),
    lambda r, c, v: f"Let me think. The cell needs {v}.\nSET {r}, {c}, {v}",
]


@pytest.mark.parametrize("fmt", range(len(FORMATS)))
@pytest.mark.parametrize("size,h", [(4, 2), (4, 5), (9, 6)])
def test_solving_gives_reward_one_after_exactly_h_turns(fmt, size, h):
    env = make(size, h)
    task = env.tasks("train", 1, fmt)[0]
    ep = env.start(task)
    obs = ep.observation
    assert "Empty (row,col):" in obs and "set <row> <col> <value>" in obs
    cells = empties(task, size)
    assert len(cells) == h
    for k, (r, c, v) in enumerate(cells):
        assert f"({r},{c})" in ep.observation
        res = ep.step(FORMATS[fmt](r, c, v))
        assert res.info["invalid"] is False
        if k < h - 1:
            assert (res.reward, res.done) == (0.0, False)
            assert "success" not in res.info
        else:
            assert (res.reward, res.done) == (1.0, True)
            assert res.info["success"] is True and res.info["filled_correct"] == h
            assert "solved" in res.observation


def test_observation_format_4x4():
    env = make(4, 2)
    task = Task("t", {"puzzle": "1.23.24141322314", "solution": "1423324141322314"})
    ep = env.start(task)
    lines = ep.observation.splitlines()
    assert lines[0] == "  | 1 2 | 3 4"
    assert "1 | 1 . | 2 3" in lines and "4 | 2 3 | 1 4" in lines
    assert "Empty (row,col): (1,2) (2,1)" in lines
    assert "Turns left: 6" in ep.observation
    assert len(ep.observation) < 300  # compact for short-context models
    res = ep.step("set 1 2 4")
    assert "1 | 1 4 | 2 3" in res.observation.splitlines()
    assert "Empty (row,col): (2,1)" in res.observation.splitlines()
    assert "OK: put 4 at (1,2)." in res.observation
    assert "Turns left: 5" in res.observation


def test_wrong_digit_gives_zero_and_partial_credit():
    for partial in (False, True):
        env = make(4, 4, partial_credit=partial)
        task = env.tasks("eval", 1, 11)[0]
        cells = empties(task, 4)
        ep = env.start(task)
        r, c, v = cells[0]
        res = ep.step(f"set {r} {c} {v % 4 + 1}")  # a wrong digit is accepted silently
        assert res.info["invalid"] is False and not res.done
        for r, c, v in cells[1:]:
            res = ep.step(f"set {r} {c} {v}")
        assert res.done and res.info["success"] is False
        assert res.info["filled_correct"] == 3
        assert res.reward == (0.75 if partial else 0.0)
        assert ep.turn == 4


def test_invalid_actions_use_turns_and_give_feedback():
    env = make(4, 2)  # max_turns = 6
    task = env.tasks("train", 1, 5)[0]
    (r1, c1, v1), (r2, c2, v2) = empties(task, 4)
    gr, gc, gv = givens(task, 4)[0]
    ep = env.start(task)
    bad = [
        ("garbage", "no action"),
        (f"set {gr} {gc} {gv}", "given"),
        (f"set 0 {c1} {v1}", "row 0"),
        (f"set {r1} 5 {v1}", "column 5"),
        (f"set {r1} {c1} 9", "value 9"),
    ]
    for k, (action, msg) in enumerate(bad, start=1):
        res = ep.step(action)
        assert res.info["invalid"] is True and res.reward == 0.0 and not res.done, action
        assert msg in res.observation and msg in res.info["error"]
        assert f"Turns left: {6 - k}" in res.observation
    # the board did not change
    assert "." in ep.observation and f"({r1},{c1})" in ep.observation
    res = ep.step(f"set {r1} {c1} {v1}")  # sixth and last turn: valid but board not full
    assert res.done and res.reward == 0.0 and res.info["success"] is False
    assert res.info["filled_correct"] == 1 and res.info["invalid"] is False
    assert "Out of turns" in res.observation
    # stepping after the end never raises
    after = ep.step(f"set {r2} {c2} {v2}")
    assert after.done and after.reward == 0.0


def test_filled_cell_is_invalid():
    env = make(4, 3)
    task = env.tasks("train", 1, 2)[0]
    (r, c, v), *_ = empties(task, 4)
    ep = env.start(task)
    assert not ep.step(f"set {r} {c} {v}").info["invalid"]
    res = ep.step(f"set {r} {c} {v % 4 + 1}")
    assert res.info["invalid"] is True and "already filled" in res.observation


def test_running_out_of_turns():
    env = make(4, 3, max_turns=4)
    task = env.tasks("train", 1, 0)[0]
    ep = env.start(task)
    for k in range(4):
        res = ep.step("no idea")
        assert res.done == (k == 3)
    assert res.reward == 0.0 and res.info["success"] is False and res.info["filled_correct"] == 0
    # with partial credit and nothing filled the reward is still 0
    env = make(4, 3, max_turns=3, partial_credit=True)
    ep = env.start(task)
    (r, c, v), *_ = empties(task, 4)
    ep.step(f"set {r} {c} {v}")
    ep.step("?")
    res = ep.step("?")
    assert res.done and res.reward == pytest.approx(1 / 3)


def test_step_never_raises_on_weird_actions():
    env = make(4, 12, max_turns=100)
    task = env.tasks("train", 1, 0)[0]
    ep = env.start(task)
    for a in ["", " ", "x" * 100_000, "set " + "9" * 10_000 + " 1 1", '{"row": [], "col": {}, "value": null}',
              "🙂🙂", "\x00", '{"row": 1e400, "col": 1, "value": 1}', "set -5 -5 -5", "r0c0=0", None, 42]:
        res = ep.step(a)  # type: ignore[arg-type]
        assert res.info["invalid"] is True and isinstance(res.observation, str)


def test_the_first_turn_of_a_puzzle_as_a_one_reply_task():
    """max_turns < empty_cells with partial credit: the episode ends after its turns, scored by the cells
    right, on the same puzzles as the whole-puzzle env (which evaluation then plays)."""
    one_turn, whole = make(4, 3, max_turns=1, partial_credit=True), make(4, 3, max_turns=3, partial_credit=True)
    task = one_turn.tasks("val", 1, 4)[0]
    assert task == whole.tasks("val", 1, 4)[0]
    (r, c, v), *_ = empties(task, 4)
    res = one_turn.start(task).step(f"set {r} {c} {v}")
    assert res.done and res.reward == pytest.approx(1 / 3) and res.info["success"] is False
    assert "Out of turns" in res.observation
    res = one_turn.start(task).step(f"set {r} {c} {v % 4 + 1}")
    assert res.done and res.reward == 0.0
    assert not whole.start(task).step(f"set {r} {c} {v}").done


def test_reading_fill_order_names_one_cell_per_turn():
    """fill_order 'reading': each turn admits, shows and accepts only the first empty cell in reading order."""
    env = make(4, 3, grammar="legal", observation="marks", fill_order="reading")
    task = env.tasks("val", 1, 4)[0]
    cells = empties(task, 4)
    assert make(4, 3, grammar="legal", observation="marks").start(task).observation.count("Cell (") == 3
    ep, board_view = env.start(task), make(4, 3, observation="board", fill_order="reading").start(task)
    for k, (r, c, v) in enumerate(cells):
        assert ep.action_regex == f"set ({r} {c}) [1-4]"
        assert [line.split(")")[0] for line in ep.observation.splitlines() if line.startswith("Cell")] == [f"Cell ({r},{c}"]
        assert f"Fill cell ({r},{c}) now." in board_view.observation  # the board view names it in words
        if k + 1 < len(cells):  # a later cell, though empty, is refused and costs the turn
            r2, c2, v2 = cells[k + 1]
            res = ep.step(f"set {r2} {c2} {v2}")
            assert res.info["invalid"] and f"fill cell ({r},{c}) first" in res.info["error"]
        res = ep.step(f"set {r} {c} {v}")
        board_view.step(f"set {r} {c} {v}")
        assert not res.info["invalid"]
    assert res.done and res.reward == 1.0 and ep.turn == 5


def test_one_turn_tasks_are_states_along_the_solution_path():
    """one_turn: the episode opens on exactly what a whole episode shows after k right fills, takes one
    reply, and a right reply earns 1/3 more than a wrong one whatever k is."""
    kw = dict(grammar="legal", observation="marks", fill_order="reading", partial_credit=True)
    one, whole = make(4, 3, one_turn=True, **kw), make(4, 3, **kw)
    tasks = one.tasks("val", 24, 0)
    assert tasks == whole.tasks("val", 24, 0)
    starts = set()
    for task in tasks:
        cells = empties(task, 4)
        ep, full = one.start(task), whole.start(task)
        k = ep.first_turn
        starts.add(k)
        for r, c, v in cells[:k]:
            full.step(f"set {r} {c} {v}")
        assert ep.observation == full.observation and ep.action_regex == full.action_regex
        r, c, v = cells[k]
        right, wrong = one.start(task).step(f"set {r} {c} {v}"), one.start(task).step(f"set {r} {c} {v % 4 + 1}")
        assert right.done and wrong.done
        assert right.reward == pytest.approx((k + 1) / 3) and wrong.reward == pytest.approx(k / 3)
        assert right.info["success"] is (k == 2)
    assert starts == {0, 1, 2}
    with pytest.raises(ConfigError, match="partial_credit"):
        SudokuConfig(empty_cells=3, one_turn=True).validate()
    with pytest.raises(ConfigError, match="max_turns 2 must be >= empty_cells 3"):
        SudokuConfig(empty_cells=3, one_turn=True, partial_credit=True, max_turns=2).validate()
