"""Constructive AHD tasks: TSP (select_next_node) and 0/1 knapsack (select_next_item)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from typing import Any

import numpy as np

from esopt.confutil import cache_root
from esopt.ahd.tasks.base import AHDTask, CandidateError, task_rng
from esopt.sandbox import Limits


def tour_length(dist: np.ndarray, tour) -> float:
    t = np.asarray(tour, dtype=np.int64)
    return float(dist[t, np.roll(t, -1)].sum())


LKH_SCALE = 1_000_000
"""LKH works on integer distances: unit-square distances are scaled by this and rounded (1e-6 resolution);
the tour it returns is measured on the original float distances."""
LKH_RUNS = 10


def lkh_available() -> bool:
    return importlib.util.find_spec("elkai") is not None


def lkh_tour(dist: np.ndarray, runs: int = LKH_RUNS) -> list[int]:
    """A near-optimal tour by LKH-3 (the `elkai` package), starting at node 0."""
    import elkai

    matrix = np.rint(np.asarray(dist, dtype=np.float64) * LKH_SCALE).astype(np.int64).tolist()
    tour = elkai.DistanceMatrix(matrix).solve_tsp(runs=runs)[:-1]  # it returns the start again at the end
    start = tour.index(0)
    return tour[start:] + tour[:start]


def lkh_lengths(name: str, instances: list[dict]) -> list[float]:
    """LKH-3 tour length of every instance, computed once per instance set and cached by the instances'
    content (ESOPT_CACHE/ahd/lkh/), so every run and report on the same instances shares one reference."""
    digest = hashlib.sha256()
    for inst in instances:
        digest.update(np.ascontiguousarray(inst["distance_matrix"], dtype=np.float64).tobytes())
    path = cache_root() / "ahd" / "lkh" / f"{name}-{len(instances)}-{digest.hexdigest()[:16]}-runs{LKH_RUNS}.json"
    try:
        lengths = json.loads(path.read_text())
        if len(lengths) == len(instances):
            return [float(x) for x in lengths]
    except (OSError, ValueError):
        pass
    lengths = [tour_length(inst["distance_matrix"], lkh_tour(inst["distance_matrix"])) for inst in instances]
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text(json.dumps(lengths))
    staging.replace(path)
    return lengths


def two_opt(dist: np.ndarray, tour, max_rounds: int = 1000) -> list[int]:
    """First-improvement 2-opt (vectorised over the second edge) until no move improves."""
    t = np.asarray(tour, dtype=np.int64).copy()
    n = len(t)
    for _ in range(max_rounds):
        improved = False
        for i in range(n - 2):
            a, b = t[i], t[i + 1]
            j = np.arange(i + 2, n if i > 0 else n - 1)
            if j.size == 0:
                continue
            c, d = t[j], t[(j + 1) % n]
            delta = dist[a, c] + dist[b, d] - dist[a, b] - dist[c, d]
            k = int(np.argmin(delta))
            if delta[k] < -1e-12:
                jj = int(j[k])
                t[i + 1:jj + 1] = t[i + 1:jj + 1][::-1].copy()
                improved = True
        if not improved:
            break
    return t.tolist()


TSP_DESCRIPTION = """\
Travelling salesman, constructive heuristic. A tour starts at node 0, visits every node exactly
once and returns to node 0; the goal is a short tour. Nodes are {n} uniform random points in the
unit square, distances Euclidean. The tour is built one node at a time: at each step your function
gets the current node, the destination node (0, where the tour ends), a numpy int array of the
still-unvisited nodes, and the full distance matrix (numpy float array, shape ({n}, {n})), and must
return the next node: one element of `unvisited_nodes`, as an int. Returning anything else makes
the heuristic invalid. Score: mean tour length over random instances (lower is better).
Only numpy and the standard library are available; no files, network or subprocesses."""

TSP_SIGNATURE = ("def select_next_node(current_node: int, destination_node: int, "
                 "unvisited_nodes: np.ndarray, distance_matrix: np.ndarray) -> int:")

TSP_GREEDY = '''\
import numpy as np

def select_next_node(current_node, destination_node, unvisited_nodes, distance_matrix):
    """Nearest neighbour: the closest unvisited node."""
    d = distance_matrix[current_node, unvisited_nodes]
    return int(unvisited_nodes[int(np.argmin(d))])
'''


class TSPConstructive(AHDTask):
    sense = "min"
    entry = "esopt.ahd.tasks.driver:tsp_construct"
    function_name = "select_next_node"
    signature = TSP_SIGNATURE
    greedy_code = TSP_GREEDY
    template = TSP_GREEDY
    greedy_name = "nearest neighbour"
    optimum_source = "near-optimal: LKH-3 (elkai)"

    def __init__(self, n_nodes: int, default_instances: int = 16, limits: Limits | None = None):
        super().__init__()
        self.n_nodes = int(n_nodes)
        self.name = f"tsp{self.n_nodes}"
        self.description = TSP_DESCRIPTION.format(n=self.n_nodes)
        self.default_instances = default_instances
        self.default_limits = limits or Limits(timeout_s=60.0, memory_mb=1024)

    def instances(self, seed: int, n: int) -> list[dict]:
        out = []
        for i in range(n):
            xy = task_rng("tsp", self.n_nodes, seed, i).random((self.n_nodes, 2))
            dist = np.sqrt(((xy[:, None, :] - xy[None, :, :]) ** 2).sum(-1))
            out.append({"coordinates": xy, "distance_matrix": dist})
        return out

    def _payload(self, insts):
        return {"function": self.function_name,
                "instances": [{"distance_matrix": x["distance_matrix"].tolist()} for x in insts]}

    def _score(self, insts, value: Any, seed: int) -> list[float]:
        tours = value["tours"]
        if len(tours) != len(insts):
            raise CandidateError("wrong number of tours")
        out = []
        for k, (inst, tour) in enumerate(zip(insts, tours)):
            if sorted(tour) != list(range(self.n_nodes)) or tour[0] != 0:
                raise CandidateError(f"instance {k}: the tour is not a permutation starting at node 0")
            out.append(tour_length(inst["distance_matrix"], tour))
        return out

    def optimum(self, seed: int, n: int) -> float | None:
        """Mean LKH-3 tour length (near-optimal; None without elkai: the reference falls back to 2-opt)."""
        return float(np.mean(lkh_lengths(self.name, self.instances(seed, n)))) if lkh_available() else None

    def extra_reference(self, seed: int, n: int) -> dict:
        """Without elkai, "two_opt": mean length of nearest-neighbour tours improved by 2-opt (a weaker
        best-known value, not a proven optimum)."""
        if lkh_available():
            return {}
        vals = []
        for inst in self.instances(seed, n):
            d = inst["distance_matrix"]
            t = [0]
            left = set(range(1, self.n_nodes))
            while left:
                cand = np.array(sorted(left))
                nxt = int(cand[np.argmin(d[t[-1], cand])])
                t.append(nxt)
                left.remove(nxt)
            vals.append(tour_length(d, two_opt(d, t)))
        return {"two_opt": float(np.mean(vals)), "two_opt_per_instance": vals}


KNAPSACK_DESCRIPTION = """\
0/1 knapsack, constructive heuristic. There are {n} items with weights and values drawn uniformly
from (0, 1) and a knapsack of capacity {cap}; maximise the total value of the packed items without
exceeding the capacity. Items are packed one at a time: at each step your function gets the
remaining capacity (float) and two numpy float arrays `weights` and `values` describing ONLY the
items still available (not yet packed; items already packed are removed from the arrays, so the
arrays shrink by one after each pick). Return the index (int, into these arrays) of the next item
to pack; it must fit (weight <= remaining capacity). Return -1 to stop early. The construction
also stops by itself when no available item fits. Returning an out-of-range index or an item that
does not fit makes the heuristic invalid. Score: mean total value over random instances (higher is
better). Only numpy and the standard library are available."""

KNAPSACK_SIGNATURE = ("def select_next_item(remaining_capacity: float, weights: np.ndarray, "
                      "values: np.ndarray) -> int:")

KNAPSACK_GREEDY = '''\
import numpy as np

def select_next_item(remaining_capacity, weights, values):
    """Greedy by value/weight ratio among the items that still fit."""
    ratio = np.where(weights <= remaining_capacity, values / weights, -np.inf)
    best = int(np.argmax(ratio))
    return best if np.isfinite(ratio[best]) else -1
'''


def knapsack_exact(weights: np.ndarray, values: np.ndarray, capacity: float) -> float:
    """Exact optimum by a Pareto-frontier dynamic programme over (weight, value) states.

    Exact up to float64 rounding of the sums (no discretisation): every non-dominated subset
    of items is kept, dominated ones (heavier and not more valuable) are pruned."""
    W = np.zeros(1)
    V = np.zeros(1)
    for w, v in zip(np.asarray(weights, float), np.asarray(values, float)):
        nw, nv = W + w, V + v
        fit = nw <= capacity + 1e-12
        W2 = np.concatenate([W, nw[fit]])
        V2 = np.concatenate([V, nv[fit]])
        order = np.lexsort((-V2, W2))  # by weight, then value descending
        W2, V2 = W2[order], V2[order]
        keep = V2 > np.maximum.accumulate(np.concatenate([[-np.inf], V2[:-1]]))
        W, V = W2[keep], V2[keep]
    return float(V.max())


class Knapsack(AHDTask):
    sense = "max"
    entry = "esopt.ahd.tasks.driver:knapsack_construct"
    function_name = "select_next_item"
    signature = KNAPSACK_SIGNATURE
    greedy_code = KNAPSACK_GREEDY
    template = KNAPSACK_GREEDY
    greedy_name = "value/weight ratio"
    optimum_source = "optimum: exact DP"

    def __init__(self, n_items: int, capacity: float, default_instances: int = 16, limits: Limits | None = None):
        super().__init__()
        self.n_items = int(n_items)
        self.capacity = float(capacity)
        self.name = f"knapsack{self.n_items}"
        self.description = KNAPSACK_DESCRIPTION.format(n=self.n_items, cap=self.capacity)
        self.default_instances = default_instances
        self.default_limits = limits or Limits(timeout_s=60.0, memory_mb=1024)

    def instances(self, seed: int, n: int) -> list[dict]:
        out = []
        for i in range(n):
            rng = task_rng("knapsack", self.n_items, seed, i)
            # uniform on the open interval (0, 1): no zero weights
            w = 1.0 - rng.random(self.n_items)
            v = 1.0 - rng.random(self.n_items)
            out.append({"weights": w, "values": v, "capacity": self.capacity})
        return out

    def _payload(self, insts):
        return {"function": self.function_name,
                "instances": [{"weights": x["weights"].tolist(), "values": x["values"].tolist(),
                               "capacity": x["capacity"]} for x in insts]}

    def _score(self, insts, value: Any, seed: int) -> list[float]:
        sels = value["selections"]
        if len(sels) != len(insts):
            raise CandidateError("wrong number of selections")
        out = []
        for k, (inst, sel) in enumerate(zip(insts, sels)):
            sel = [int(i) for i in sel]
            if len(set(sel)) != len(sel) or any(not 0 <= i < self.n_items for i in sel):
                raise CandidateError(f"instance {k}: invalid item selection")
            if inst["weights"][sel].sum() > self.capacity + 1e-9:
                raise CandidateError(f"instance {k}: capacity exceeded")
            out.append(float(inst["values"][sel].sum()))
        return out

    def optimum(self, seed: int, n: int) -> float | None:
        return float(np.mean([knapsack_exact(x["weights"], x["values"], self.capacity)
                              for x in self.instances(seed, n)]))
