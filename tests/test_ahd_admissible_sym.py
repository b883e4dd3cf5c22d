"""Symmetric (pre-admissible) admissible sets: reduced-space condition, greedy, and the A(21,15) task."""

from __future__ import annotations

import numpy as np
import pytest

from esopt.ahd.tasks import get_task
from esopt.ahd.tasks import admissible_sym as S
from esopt.ahd.tasks.admissible import is_admissible, lexicographic_vectors
from esopt.ahd.tasks.admissible_task import AdmissibleSet


def _slow_greedy(groups, w, pr):
    """Reference greedy in reduced space, straight from the stated condition (pure Python loops)."""
    C = S.sym_candidates(groups, w).astype(np.int64)
    T: list[np.ndarray] = []
    for i in np.argsort(-pr, kind="stable"):
        c = C[i]
        if any((S.SYMBOL_WEIGHTS[c] == S.SYMBOL_WEIGHTS[a]).all() for a in T):
            continue
        if any(S.BAD3[T[x], T[y], c].all() for x in range(len(T)) for y in range(x + 1, len(T))):
            continue
        T.append(c)
    return np.array(T, dtype=np.int64).reshape(-1, groups)


def _priorities(C, rng):
    nrot = ((C >= 1) & (C <= 4)).sum(1).astype(float)
    return {"const": np.zeros(len(C)), "nrot": nrot, "-nrot": -nrot,
            "heavy": ((C == 0) | (C >= 5)).sum(1).astype(float),  # hostile: tuples with many BAD3 partners
            "ties": rng.integers(0, 3, len(C)).astype(float), "random": rng.random(len(C))}


def test_tables_and_counts():
    assert S.BAD3.sum() == 103
    for p in [(1, 0, 2), (0, 2, 1), (2, 1, 0)]:
        assert np.array_equal(S.BAD3, S.BAD3.transpose(p))
    assert [S.BAD3[0, 3, z] for z in range(7)] == [z == 3 for z in range(7)]
    assert S.BAD3[5, 5].all() and S.BAD3[6, 6].all()
    assert S.n_sym_candidates(7, 15) == 68768 == len(S.sym_candidates(7, 15))
    C = S.sym_candidates(4, 7)
    assert np.all(S.SYMBOL_WEIGHTS[C].sum(1) == 7) and len(C) == S.n_sym_candidates(4, 7)
    key = (C.astype(np.int64) * 7 ** np.arange(3, -1, -1)).sum(1)
    assert np.all(np.diff(key) > 0)  # lexicographic order
    E = S.expand(np.array([[1, 3, 5, 0]]))
    assert E.shape == (9, 12) and len({tuple(r) for r in E.tolist()}) == 9
    assert S.expansion_size(np.array([[1, 3, 5, 0], [6, 6, 1, 0]])) == 12


def test_reduced_condition_matches_expansion():
    """Random 3-tuple sets over 2 groups: pre-admissible iff the expansion is admissible."""
    rng = np.random.default_rng(0)
    allt = np.array(np.unravel_index(np.arange(49), (7, 7))).T
    n_bad = 0
    for _ in range(300):
        T = allt[rng.choice(49, 3, replace=False)]
        w = S.SYMBOL_WEIGHTS[T].sum(1)
        T = T[w == w[0]] if rng.random() < 0.5 else T
        if len(T) < 3 or len(set(S.SYMBOL_WEIGHTS[T].sum(1).tolist())) != 1:
            continue
        E = S.expand(T)
        full = S.check_admissible(E, int(S.SYMBOL_WEIGHTS[T[0]].sum()))
        assert S.is_preadmissible(T) == full
        n_bad += not full
    assert n_bad > 5


def test_fast_checker_agrees_with_bruteforce():
    rng = np.random.default_rng(1)
    allv = lexicographic_vectors(6, 3)
    # distinct supports but a bad triple: every coordinate is all-zero, all-nonzero, or one zero
    # and two equal nonzeros
    bad = np.array([[1, 1, 1, 0, 0, 0], [1, 1, 0, 1, 0, 0], [1, 0, 1, 1, 0, 0]])
    fixed = bad.copy()
    fixed[2, 2] = 2  # coordinate 2 becomes (1, 0, 2)
    assert is_admissible(fixed, 3) and S.check_admissible(fixed, 3)
    assert not is_admissible(bad, 3) and not S.check_admissible(bad, 3)
    seen = set()
    for _ in range(60):
        X = allv[rng.choice(len(allv), rng.integers(3, 9), replace=False)]
        a, b = S.check_admissible(X, 3), is_admissible(X, 3)
        assert a == b
        seen.add(b)
    assert seen == {True, False}


@pytest.mark.parametrize("groups,w", [(3, 5), (3, 6), (4, 7)])
def test_greedy_expansion_is_admissible(groups, w):
    rng = np.random.default_rng(groups * 10 + w)
    C = S.sym_candidates(groups, w).astype(np.int64)
    for name, pr in _priorities(C, rng).items():
        T = S.greedy_preadmissible(groups, w, pr).astype(np.int64)
        if groups <= 3:
            assert np.array_equal(T, _slow_greedy(groups, w, pr)), name
        assert S.is_preadmissible(T)
        E = S.expand(T)
        assert len(E) == S.expansion_size(T)
        assert S.check_admissible(E, w), name
        if len(E) <= 200:
            assert is_admissible(E, w), name
        # maximal: any other candidate breaks the expanded set (a few of them)
        chosen = {tuple(t) for t in T.tolist()}
        others = [c for c in C.tolist() if tuple(c) not in chosen]
        for i in rng.choice(len(others), min(4, len(others)), replace=False):
            assert not S.check_admissible(S.expand(np.vstack([T, [others[i]]])), w)


def test_greedy_21_15_fast_and_sized():
    C = S.sym_candidates(7, 15)
    nrot = ((C >= 1) & (C <= 4)).sum(1).astype(float)
    T = S.greedy_preadmissible(7, 15, nrot)
    assert S.expansion_size(T) == 30787 and S.is_preadmissible(T)
    assert S.expansion_size(S.greedy_preadmissible(7, 15, np.zeros(len(C)))) == 9647
    with pytest.raises(ValueError):
        S.greedy_preadmissible(7, 15, np.zeros(len(C) - 1))


@pytest.fixture(scope="module")
def task():
    return get_task("admissible_21_15")


def test_task_21_15_reference_and_reproducible(task):
    assert isinstance(task, S.AdmissibleSetSymmetric) and task.sense == "max"
    ref = task.reference()
    assert ref["greedy"] == 30787.0 and ref["optimum"] == 43596.0 and ref["n_candidates"] == 68768
    ev = task.evaluate(task.greedy_code)
    assert ev.valid and ev.objective == ref["greedy"]
    code = "def priority(el, n, w):\n    return float(el[0] * 7 + el[-1]) - n + w"
    e1, e2 = task.evaluate(code), task.evaluate(code, seed=3)
    assert e1.valid and e2.valid and e1.objective == e2.objective
    p = task.prompt()
    assert "7 groups of 3" in p and "(0,1,2)" in p and "def priority(el" in p


@pytest.mark.parametrize("code,msg", [
    ("def priority(el, n, w):\n    return float('nan')", "NaN"),
    ("def priority(el, n, w):\n    return 'x'", "expected a number"),
    ("def priority(el, n, w):\n    return [1.0]", "expected a number"),
    ("def priority(el, n, w):\n    return 1 / (el[0] - el[0])", "ZeroDivisionError"),
    ("def prio(el, n, w):\n    return 0.0", "priority"),
])
def test_task_21_15_invalid(task, code, msg):
    ev = task.evaluate(code)
    assert not ev.valid and ev.objective is None and msg in ev.reason


def test_plain_oversize_still_refused():
    with pytest.raises(ValueError, match="symmetric"):
        AdmissibleSet(21, 15).evaluate("def priority(el, n, w):\n    return 0")
    with pytest.raises(ValueError, match="more than"):
        lexicographic_vectors(22, 15)
