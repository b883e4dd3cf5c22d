"""Paper-grade AHD references: LKH-3 tours (elkai) are optimal where exhaustive search can check them, and are
computed once per instance set."""

import json

import numpy as np
import pytest

pytest.importorskip("elkai")

from esopt.ahd.tasks import get_task  # noqa: E402
from esopt.ahd.tasks.constructive import lkh_lengths, lkh_tour, tour_length, two_opt  # noqa: E402


def held_karp(dist: np.ndarray) -> float:
    """Exact optimum by dynamic programming over subsets (the test's independent oracle)."""
    n = len(dist)
    best = {(1 << k, k): dist[0, k] for k in range(1, n)}
    for size in range(2, n):
        layer = {}
        for (subset, last), length in best.items():
            for k in range(1, n):
                if not subset >> k & 1:
                    key = (subset | 1 << k, k)
                    value = length + dist[last, k]
                    if value < layer.get(key, np.inf):
                        layer[key] = value
        best = {key: value for key, value in layer.items() if bin(key[0]).count("1") == size}
    return min(length + dist[last, 0] for (_, last), length in best.items())


def test_lkh_finds_the_exact_optimum_of_small_instances():
    rng = np.random.default_rng(7)
    for _ in range(6):
        xy = rng.random((10, 2))
        dist = np.sqrt(((xy[:, None] - xy[None]) ** 2).sum(-1))
        tour = lkh_tour(dist)
        assert tour[0] == 0 and sorted(tour) == list(range(10))
        assert tour_length(dist, tour) == pytest.approx(held_karp(dist), abs=1e-5)


def test_tsp20_reference_is_lkh_and_beats_two_opt_on_every_instance():
    task = get_task("tsp20")
    instances = task.instances(0, 16)
    lengths = lkh_lengths(task.name, instances)
    ref = task.reference(0, 16)
    assert ref["optimum"] == pytest.approx(np.mean(lengths)) and ref["optimum_source"].startswith("near-optimal: LKH-3")
    assert "two_opt" not in ref
    for inst, length in zip(instances, lengths):
        d = inst["distance_matrix"]
        assert length <= tour_length(d, two_opt(d, list(range(20)))) + 1e-9
    # Expected optimal TSP20 tour on uniform points is about 3.83 (the paper's Table 5: 3.8199 on its own set).
    assert 3.6 < ref["optimum"] < 4.0


def test_lkh_lengths_are_cached_per_instance_set(tmp_path, monkeypatch):
    monkeypatch.setenv("ESOPT_CACHE", str(tmp_path))
    instances = get_task("tsp20").instances(3, 2)
    first = lkh_lengths("tsp20", instances)
    (cached,) = list((tmp_path / "ahd" / "lkh").glob("tsp20-2-*.json"))
    cached.write_text(json.dumps([1.0, 2.0]))  # a cache hit returns the stored values without solving again
    assert lkh_lengths("tsp20", instances) == [1.0, 2.0]
    assert lkh_lengths("tsp20", get_task("tsp20").instances(4, 2)) != [1.0, 2.0]  # another set, another entry
    assert len(list((tmp_path / "ahd" / "lkh").glob("*.json"))) == 2 and first != [1.0, 2.0]


def test_knapsack_reference_stays_the_exact_dp_optimum():
    ref = get_task("knapsack50").reference(0, 2)
    assert ref["optimum_source"] == "optimum: exact DP" and ref["optimum"] >= ref["greedy"]
