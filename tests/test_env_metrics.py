"""Hand-checked values for the answer metrics and the k-sample metrics."""

import math

import pytest

from esopt.envs.metrics import (
    _comb_pass_at_k,
    anls,
    exact_match,
    levenshtein,
    max_at_k,
    mean_at_k,
    pass_at_k,
    pass_at_k_single,
)


def test_levenshtein():
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3
    assert levenshtein("abc", "abc") == 0
    assert levenshtein("flaw", "lawn") == 2


def test_anls_hand_values():
    assert anls("March 4, 2024", ["March 4, 2024"]) == 1.0
    # normalisation: case and whitespace
    assert anls("  march   4, 2024 ", "March 4, 2024") == 1.0
    # one substitution in 10 characters: 1 - 1/10
    assert anls("INV-123457", ["INV-123456"]) == pytest.approx(0.9)
    # "kitten" vs "sitting": NL = 3/7 < 0.5 -> 4/7
    assert anls("kitten", "sitting") == pytest.approx(4 / 7)
    # NL = 0.5 exactly -> 0 (kept only when NL < threshold)
    assert anls("ab", "ac") == 0.0
    # far off -> 0
    assert anls("Alice", ["Bob"]) == 0.0
    # best gold counts
    assert anls("1,234.50", ["$1,234.50", "1,234.50"]) == 1.0
    assert anls("$1,234.50", ["1,234.50"]) == pytest.approx(1 - 1 / 9)
    assert anls(None, ["x"]) == 0.0
    assert anls("", ["x"]) == 0.0
    assert anls("", [""]) == 1.0
    # a lower threshold is stricter
    assert anls("kitten", "sitting", threshold=0.4) == 0.0


def test_exact_match():
    assert exact_match("Noah Petrov", ["noah petrov"]) == 1.0
    assert exact_match(" 'Noah  Petrov'. ", "Noah Petrov") == 1.0
    assert exact_match("Noah Petrova", "Noah Petrov") == 0.0
    assert exact_match(None, "x") == 0.0
    with pytest.raises(ValueError):
        exact_match("x", [])


def test_mean_and_max_at_k():
    scores = [[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.5, 1.0, 0.5, 0.0]]
    assert mean_at_k(scores) == pytest.approx((0.5 + 0.0 + 0.5) / 3)
    assert max_at_k(scores) == pytest.approx((1.0 + 0.0 + 1.0) / 3)
    assert max_at_k(scores, k=1) == pytest.approx((1.0 + 0.0 + 0.5) / 3)
    with pytest.raises(ValueError):
        mean_at_k([])
    with pytest.raises(ValueError):
        max_at_k(scores, k=5)


def test_pass_at_k_hand_values():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k_single(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k_single(5, 2, 2) == pytest.approx(0.7)
    # k=1 is the success rate
    assert pass_at_k_single(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k_single(4, 0, 4) == 0.0
    assert pass_at_k_single(4, 2, 3) == 1.0  # n - c < k
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k_single(n, c, k) == pytest.approx(_comb_pass_at_k(n, c, k))


def test_pass_at_k_tasks():
    runs = [[True, False, False, False], [False] * 4, [True, True, False, False]]
    # per task: 0.5, 0, 1 - C(2,2)/C(4,2) = 5/6
    assert pass_at_k(runs, 2) == pytest.approx((0.5 + 0 + 5 / 6) / 3)
    # n == k: "any of k"
    assert pass_at_k(runs, 4) == pytest.approx(2 / 3)
    # scores with a threshold
    assert pass_at_k([[0.2, 1.0], [0.9, 0.4]], 1, threshold=1.0) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        pass_at_k(runs, 5)
    with pytest.raises(ValueError):
        pass_at_k(runs, 0)
    assert math.isclose(pass_at_k([[1, 0, 1]], 3), 1.0)
