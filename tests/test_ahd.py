"""AHD tasks: reference values, reproducibility, and invalid candidates (small sizes)."""

from __future__ import annotations

import numpy as np
import pytest

from esopt.ahd.tasks import AHD_TASKS, get_task, task_names
from esopt.ahd.tasks.aco import AcoBinPacking, AcoCVRP, AcoTSP
from esopt.ahd.tasks.admissible import greedy_admissible, is_admissible, lexicographic_vectors
from esopt.ahd.tasks.admissible_task import AdmissibleSet
from esopt.ahd.tasks.constructive import Knapsack, TSPConstructive, knapsack_exact, tour_length
from esopt.sandbox import Limits

NN = """
import numpy as np
def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    return int(unvisited_nodes[np.argmin(distance_matrix[current_node][unvisited_nodes])])
"""

RATIO = """
def select_next_item(remaining_capacity, weights, values):
    best, idx = -1.0, -1
    for i in range(len(weights)):
        if weights[i] <= remaining_capacity and values[i] / weights[i] > best:
            best, idx = values[i] / weights[i], i
    return idx
"""


@pytest.fixture(scope="module")
def tsp():
    return TSPConstructive(10, default_instances=3)


@pytest.fixture(scope="module")
def knap():
    return Knapsack(20, 5.0, default_instances=3)


def test_registry_names():
    expected = {"tsp20", "tsp50", "knapsack50", "knapsack100", "admissible_15_10", "admissible_21_15",
                "aco_tsp50", "aco_tsp100", "aco_cvrp50", "aco_cvrp100", "aco_binpacking500", "aco_binpacking1000"}
    assert expected <= set(task_names())
    t = get_task("tsp20")
    assert t is AHD_TASKS["tsp20"] and t.name == "tsp20" and t.function_name == "select_next_node"
    assert "select_next_node" in t.prompt()
    with pytest.raises(KeyError):
        get_task("nope")


def test_instances_deterministic(tsp, knap):
    a, b = tsp.instances(3, 3), tsp.instances(3, 3)
    for x, y in zip(a, b):
        assert np.array_equal(x["distance_matrix"], y["distance_matrix"])
    assert np.array_equal(tsp.instances(3, 1)[0]["coordinates"], a[0]["coordinates"])  # prefix-stable
    assert not np.array_equal(tsp.instances(4, 1)[0]["coordinates"], a[0]["coordinates"])
    k1, k2 = knap.instances(0, 2), knap.instances(0, 2)
    assert np.array_equal(k1[1]["weights"], k2[1]["weights"])
    assert np.all(k1[0]["weights"] > 0) and np.all(k1[0]["weights"] < 1)


def test_tsp_nearest_neighbour_matches_reference(tsp):
    ref = tsp.reference(seed=0)
    ev = tsp.evaluate(NN, seed=0)
    assert ev.valid, ev.reason
    assert ev.objective == ref["greedy"]
    # the evaluator's number is the real nearest-neighbour tour length
    expect = []
    for inst in tsp.instances(0, 3):
        d = inst["distance_matrix"]
        tour, left = [0], list(range(1, 10))
        while left:
            nxt = min(left, key=lambda j: (d[tour[-1], j], j))
            tour.append(nxt)
            left.remove(nxt)
        expect.append(tour_length(d, tour))
    assert ev.per_instance == pytest.approx(expect, abs=1e-12)
    assert ref["optimum"] <= ref["greedy"] + 1e-12 and ref["optimum_source"].startswith("near-optimal: LKH-3")
    assert tsp.normalised_score(ev.objective) == 0.0
    assert tsp.evaluate(NN, seed=0).objective == ev.objective  # reproducible


@pytest.mark.parametrize("code, fragment", [
    ("def select_next_node(c, d, u, m):\n    return 0", "illegal move"),
    ("def select_next_node(c, d, u, m):\n    return 'a'", "expected an int"),
    ("def select_next_node(c, d, u, m):\n    return float(u[0])", "expected an int"),
    ("def select_next_node(c, d, u, m):\n    raise RuntimeError('boom')", "RuntimeError: boom"),
    ("def select_next_node(c, d, u, m):\n    while True:\n        pass", "timeout"),
    ("def other(c, d, u, m):\n    return 1", "does not define"),
    ("def select_next_node(c, d, u, m)\n    return 1", "SyntaxError"),
    ("import os\ndef select_next_node(c, d, u, m):\n    os.system('ls')\n    return int(u[0])", "blocked"),
])
def test_tsp_invalid_candidates(tsp, code, fragment):
    ev = tsp.evaluate(code, seed=0, n_instances=1, limits=Limits(timeout_s=2.0))
    assert not ev.valid
    assert ev.objective is None
    assert fragment in ev.reason
    assert tsp.normalised_score(ev.objective) is None


def test_knapsack_ratio_greedy_matches_reference_and_exact_optimum(knap):
    ref = knap.reference(seed=1)
    ev = knap.evaluate(RATIO, seed=1)
    assert ev.valid, ev.reason
    assert ev.objective == pytest.approx(ref["greedy"], abs=1e-12)
    assert ref["optimum"] >= ref["greedy"] - 1e-12
    # the Pareto DP is exact: compare with brute force on a tiny instance
    rng = np.random.default_rng(5)
    w, v = rng.random(12), rng.random(12)
    best = 0.0
    for mask in range(1 << 12):
        sel = [(mask >> i) & 1 for i in range(12)]
        sel = np.array(sel, dtype=bool)
        if w[sel].sum() <= 3.0:
            best = max(best, v[sel].sum())
    assert knapsack_exact(w, v, 3.0) == pytest.approx(best, abs=1e-12)


def test_knapsack_illegal_moves(knap):
    too_big = "def select_next_item(c, w, v):\n    return len(w)"
    ev = knap.evaluate(too_big, n_instances=1)
    assert not ev.valid and "illegal move" in ev.reason
    heavy = ("import numpy as np\ndef select_next_item(c, w, v):\n"
             "    i = int(np.argmax(w))\n    return i if w[i] > c else int(np.argmin(w))")
    # always returns the heaviest item once it no longer fits
    ev = knap.evaluate(heavy, n_instances=1)
    assert not ev.valid and "illegal move" in ev.reason and "remaining capacity" in ev.reason
    stop = "def select_next_item(c, w, v):\n    return -1"
    ev = knap.evaluate(stop, n_instances=2)
    assert ev.valid and ev.objective == 0.0


def test_admissible_small_greedy_is_admissible_and_reference():
    task = AdmissibleSet(6, 3)
    ref = task.reference()
    ev = task.evaluate("def priority(el, n, w):\n    return 0")
    assert ev.valid, ev.reason
    assert ev.objective == ref["greedy"]
    pr = np.array([sum(v) for v in lexicographic_vectors(6, 3).tolist()], dtype=float)
    S = greedy_admissible(6, 3, pr)
    assert is_admissible(S, 3)
    ev2 = task.evaluate("def priority(el, n, w):\n    return sum(el)")
    assert ev2.valid and ev2.objective == len(S)
    bad = task.evaluate("def priority(el, n, w):\n    return 'x'")
    assert not bad.valid and "expected a number" in bad.reason
    assert get_task("admissible_15_10").optimum(0, 1) == 3003
    with pytest.raises(ValueError, match="symmetric"):  # the plain formulation is infeasible; the task uses 7-tuples
        AdmissibleSet(21, 15).evaluate("def priority(el, n, w):\n    return 0")


UNIFORM_TSP = "import numpy as np\ndef heuristics(distance_matrix):\n    return np.ones_like(distance_matrix)"


def test_aco_tsp_reference_and_reproducible():
    task = AcoTSP(12, n_ants=4, n_iterations=3, default_instances=2)
    ref = task.reference(seed=2)
    inv = "import numpy as np\ndef heuristics(distance_matrix):\n    n = len(distance_matrix)\n" \
          "    return 1.0 / (distance_matrix + np.eye(n))"
    ev = task.evaluate(inv, seed=2)
    assert ev.valid and ev.objective == ref["greedy"]  # the reference's greedy run is this heuristic's
    u1, u2 = task.evaluate(UNIFORM_TSP, seed=2), task.evaluate(UNIFORM_TSP, seed=2)
    assert u1.valid and u1.objective == u2.objective
    # The solver follows the heuristic: favouring short edges beats favouring long ones.
    far = task.evaluate("def heuristics(d):\n    return d + 1e-9", seed=2)
    assert far.valid and ev.objective < u1.objective < far.objective
    # 1/d on the diagonal is inf: ignored, still valid
    assert task.evaluate("def heuristics(d):\n    return 1.0 / d", seed=2).objective == ref["greedy"]


@pytest.mark.parametrize("body, fragment", [
    ("return np.ones((3, 3))", "shape"),
    ("m = np.ones_like(d)\n    m[0, 1] = np.nan\n    return m", "NaN"),
    ("return -np.ones_like(d)", "negative"),
    ("m = np.ones_like(d)\n    m[0, 1] = np.inf\n    return m", "infinite"),
    ("return 'matrix'", "not an array"),
    ("return [[1, 2], [3]]", "not an array"),
])
def test_aco_invalid_matrices(body, fragment):
    task = AcoTSP(8, n_ants=2, n_iterations=1, default_instances=1)
    ev = task.evaluate(f"import numpy as np\ndef heuristics(d):\n    {body}")
    assert not ev.valid
    assert fragment in ev.reason


def test_aco_cvrp_and_binpacking_uniform():
    cv = AcoCVRP(10, n_ants=4, n_iterations=2, default_instances=1)
    ref = cv.reference(seed=0)
    ev = cv.evaluate("import numpy as np\ndef heuristics(distance_matrix, coordinates, demands, capacity):\n"
                     "    return 1.0 / (distance_matrix + np.eye(len(demands)))", seed=0)
    assert ev.valid and ev.objective == ref["greedy"]
    inst = cv.instances(0, 1)[0]
    assert inst["demands"][0] == 0 and inst["distance_matrix"].shape == (11, 11)
    uni = cv.evaluate("import numpy as np\ndef heuristics(distance_matrix, coordinates, demands, capacity):\n"
                      "    return np.ones((11, 11))", seed=0)
    assert uni.valid and ev.objective < uni.objective  # short edges first beats a blind search

    bp = AcoBinPacking(30, n_ants=3, n_iterations=2, default_instances=1)
    ref = bp.reference(seed=0)
    ev = bp.evaluate("import numpy as np\ndef heuristics(demand, capacity):\n"
                     "    return np.ones((demand.size, demand.size))", seed=0)
    assert ev.valid and ev.objective == ref["greedy"]
    assert ref["lower_bound"] <= ev.objective <= 30
    assert bp.normalised_score(ev.objective) == 0.0
