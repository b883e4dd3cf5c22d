"""ACO tasks (ReEvo/EoH style): the LLM writes `heuristics(...) -> np.ndarray`, a matrix of
prior desirabilities that a compact ant colony (numpy, run in the trusted parent) combines with
pheromone: p(i -> j) ~ tau[i, j]^alpha * eta[i, j]^beta over the feasible j.

Matrix rules (else the candidate is invalid): exactly the stated shape, finite, non-negative.
The diagonal is never used, so it is ignored (inf / nan there are fine, e.g. 1/distance).
The matrix is divided by its largest entry (this changes no probability) to avoid overflow;
if every feasible choice has weight 0 the ant picks uniformly among them.

Colony (Ant System): pheromone starts at 1, evaporates by `rho` each iteration, and every ant
deposits `1/cost` on the edges (pairs, for bin packing) of its solution. Ants, iterations and the
sampling stream are fixed per task and seeded from (seed, instance), so an evaluation is
reproducible. The objective is the best cost found, averaged over instances.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from esopt.ahd.tasks.base import AHDTask, CandidateError, task_rng
from esopt.ahd.tasks.constructive import lkh_available, lkh_lengths
from esopt.ahd.tasks.driver import decode_array
from esopt.sandbox import Limits


def _sample(weights: np.ndarray, feasible: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw per row from weights*feasible (uniform over feasible where the weights vanish)."""
    w = np.where(feasible, weights, 0.0)
    s = w.sum(axis=1)
    zero = ~(s > 0)
    if np.any(zero):
        w[zero] = feasible[zero].astype(np.float64)
    cum = np.cumsum(w, axis=1)
    u = rng.random(w.shape[0]) * cum[:, -1]
    idx = np.argmax(cum > u[:, None], axis=1)
    return idx


def check_matrix(mat: np.ndarray, shape: tuple[int, int], k: int) -> np.ndarray:
    if mat.shape != shape:
        raise CandidateError(f"heuristics returned shape {tuple(mat.shape)}, expected {shape} (instance {k})")
    m = mat.copy()
    np.fill_diagonal(m, 0.0)
    if np.isnan(m).any():
        raise CandidateError(f"heuristics returned NaN values (instance {k})")
    if not np.isfinite(m).all():
        raise CandidateError(f"heuristics returned infinite values off the diagonal (instance {k})")
    if (m < 0).any():
        raise CandidateError(f"heuristics returned negative values (instance {k})")
    mx = m.max()
    return m / mx if mx > 0 else m


def aco_tsp(dist, eta, n_ants, n_iter, rng, alpha=1.0, beta=1.0, rho=0.1) -> float:
    n = dist.shape[0]
    tau = np.ones((n, n))
    best = np.inf
    ants = np.arange(n_ants)
    for _ in range(n_iter):
        wmat = tau ** alpha * eta ** beta
        pos = rng.integers(n, size=n_ants)
        visited = np.zeros((n_ants, n), dtype=bool)
        visited[ants, pos] = True
        tours = [pos]
        for _step in range(n - 1):
            pos = _sample(wmat[pos], ~visited, rng)
            visited[ants, pos] = True
            tours.append(pos)
        T = np.stack(tours, axis=1)  # (ants, n)
        nxt = np.roll(T, -1, axis=1)
        L = dist[T, nxt].sum(axis=1)
        best = min(best, float(L.min()))
        tau *= 1.0 - rho
        dep = np.repeat(1.0 / L, n)
        np.add.at(tau, (T.ravel(), nxt.ravel()), dep)
        np.add.at(tau, (nxt.ravel(), T.ravel()), dep)
    return best


def aco_cvrp(dist, demand, capacity, eta, n_ants, n_iter, rng, alpha=1.0, beta=1.0, rho=0.1) -> float:
    n = dist.shape[0]  # depot 0 + customers
    tau = np.ones((n, n))
    best = np.inf
    ants = np.arange(n_ants)
    for _ in range(n_iter):
        wmat = tau ** alpha * eta ** beta
        pos = np.zeros(n_ants, dtype=np.int64)
        load = np.full(n_ants, float(capacity))
        visited = np.zeros((n_ants, n), dtype=bool)
        visited[:, 0] = True
        cost = np.zeros(n_ants)
        edges_from, edges_to, edges_ant = [], [], []
        for _step in range(4 * n + 2):
            remaining = ~visited.all(axis=1)
            active = remaining | (pos != 0)
            if not active.any():
                break
            feas = ~visited & (demand[None, :] <= load[:, None] + 1e-9)
            feas[:, 0] = pos != 0
            feas[~remaining, 1:] = False  # done: go home
            nxt = _sample(wmat[pos], feas, rng)
            nxt = np.where(active, nxt, pos)
            moved = nxt != pos
            cost += dist[pos, nxt] * moved
            edges_from.append(pos[moved]); edges_to.append(nxt[moved]); edges_ant.append(ants[moved])
            visited[ants, nxt] = True
            visited[:, 0] = True
            load = np.where(nxt == 0, float(capacity), load - demand[nxt])
            pos = nxt
        if visited.all(axis=1).sum() != n_ants or np.any(pos != 0):
            raise RuntimeError("ACO CVRP construction did not finish")  # trusted code: a bug, not the LLM's
        best = min(best, float(cost.min()))
        tau *= 1.0 - rho
        f, t, a = np.concatenate(edges_from), np.concatenate(edges_to), np.concatenate(edges_ant)
        np.add.at(tau, (f, t), 1.0 / cost[a])
        np.add.at(tau, (t, f), 1.0 / cost[a])
    return best


def aco_binpacking(demand, capacity, eta, n_ants, n_iter, rng, alpha=1.0, beta=1.0, rho=0.1) -> float:
    """Bins are filled one at a time; the next item j for the current bin is drawn with weight
    (mean tau[i, j] over items i in the bin)^alpha * (mean eta[i, j])^beta among the unpacked items
    that fit; the first item of a bin is drawn uniformly. Cost = number of bins."""
    n = demand.shape[0]
    tau = np.ones((n, n))
    best = np.inf
    ants = np.arange(n_ants)
    for _ in range(n_iter):
        packed = np.zeros((n_ants, n), dtype=bool)
        room = np.full(n_ants, float(capacity))
        bins = np.zeros(n_ants, dtype=np.int64)
        count = np.zeros(n_ants)
        sum_tau = np.zeros((n_ants, n))
        sum_eta = np.zeros((n_ants, n))
        assign = np.zeros((n_ants, n), dtype=np.int64)
        for _step in range(n):
            feas = ~packed & (demand[None, :] <= room[:, None] + 1e-9)
            new = ~feas.any(axis=1)
            if new.any():
                room[new] = float(capacity)
                bins[new] += 1
                count[new] = 0
                sum_tau[new] = 0
                sum_eta[new] = 0
                feas[new] = ~packed[new]
            c = np.maximum(count, 1)[:, None]
            w = (sum_tau / c) ** alpha * (sum_eta / c) ** beta
            w[count == 0] = 1.0
            j = _sample(w, feas, rng)
            packed[ants, j] = True
            assign[ants, j] = bins
            room -= demand[j]
            count += 1
            sum_tau += tau[j]
            sum_eta += eta[j]
        n_bins = bins + 1
        best = min(best, float(n_bins.min()))
        tau *= 1.0 - rho
        for a in range(n_ants):
            same = assign[a][:, None] == assign[a][None, :]
            tau += same / n_bins[a]
    return best


class AcoTask(AHDTask):
    entry = "esopt.ahd.tasks.driver:heuristic_matrices"
    function_name = "heuristics"
    sense = "min"
    family: str
    args: tuple[str, ...]

    def __init__(self, size: int, n_ants: int, n_iterations: int, default_instances: int,
                 limits: Limits | None = None):
        super().__init__()
        self.size = int(size)
        self.n_ants = int(n_ants)
        self.n_iterations = int(n_iterations)
        self.default_instances = default_instances
        self.default_limits = limits or Limits(timeout_s=60.0, memory_mb=2048)
        self.name = f"aco_{self.family}{self.size}"

    def _payload(self, insts):
        return {"function": self.function_name, "args": list(self.args),
                "instances": [{a: (x[a].tolist() if isinstance(x[a], np.ndarray) else x[a]) for a in self.args}
                              for x in insts]}

    def _score(self, insts, value: Any, seed: int) -> list[float]:
        mats = value["matrices"]
        if len(mats) != len(insts):
            raise CandidateError("wrong number of heuristic matrices")
        out = []
        for k, (inst, m) in enumerate(zip(insts, mats)):
            eta = check_matrix(decode_array(m), self._shape(inst), k)
            rng = task_rng(f"aco_{self.family}_colony", self.size, seed, k)
            out.append(self._colony(inst, eta, rng))
        return out


class AcoTSP(AcoTask):
    family = "tsp"
    args = ("distance_matrix",)
    signature = "def heuristics(distance_matrix: np.ndarray) -> np.ndarray:"
    greedy_name = "inverse distance (1/d)"
    optimum_source = "near-optimal: LKH-3 (elkai)"
    greedy_code = '''\
import numpy as np

def heuristics(distance_matrix):
    """Inverse distance: short edges are more promising."""
    return 1.0 / (distance_matrix + np.eye(len(distance_matrix)))
'''
    template = greedy_code

    def __init__(self, size, n_ants=20, n_iterations=20, default_instances=4, limits=None):
        super().__init__(size, n_ants, n_iterations, default_instances, limits)
        self.description = (
            f"Travelling salesman solved by ant colony optimisation. Write `heuristics(distance_matrix)` "
            f"returning a numpy array of shape ({size}, {size}) whose entry [i, j] is the prior "
            f"desirability (>= 0, finite) of travelling from node i to node j; the colony samples the next "
            f"node with probability proportional to pheromone[i, j] * heuristics[i, j]. Nodes are {size} "
            f"uniform random points in the unit square (Euclidean distances). Score: best tour length found "
            f"by {self.n_ants} ants in {self.n_iterations} iterations, averaged over instances (lower is "
            f"better). The diagonal is ignored. Only numpy and the standard library are available.")

    def instances(self, seed, n):
        out = []
        for i in range(n):
            xy = task_rng("aco_tsp", self.size, seed, i).random((self.size, 2))
            out.append({"coordinates": xy,
                        "distance_matrix": np.sqrt(((xy[:, None] - xy[None]) ** 2).sum(-1))})
        return out

    def _shape(self, inst):
        return (self.size, self.size)

    def optimum(self, seed, n):
        """Mean LKH-3 tour length (near-optimal; None without elkai)."""
        return float(np.mean(lkh_lengths(self.name, self.instances(seed, n)))) if lkh_available() else None

    def _colony(self, inst, eta, rng):
        return aco_tsp(inst["distance_matrix"], eta, self.n_ants, self.n_iterations, rng)


class AcoCVRP(AcoTask):
    family = "cvrp"
    args = ("distance_matrix", "coordinates", "demands", "capacity")
    signature = ("def heuristics(distance_matrix: np.ndarray, coordinates: np.ndarray, "
                 "demands: np.ndarray, capacity: float) -> np.ndarray:")
    greedy_name = "inverse distance (1/d)"
    greedy_code = '''\
import numpy as np

def heuristics(distance_matrix, coordinates, demands, capacity):
    """Inverse distance: short edges are more promising."""
    return 1.0 / (distance_matrix + np.eye(len(distance_matrix)))
'''
    template = greedy_code

    def __init__(self, size, capacity=50, n_ants=20, n_iterations=20, default_instances=4, limits=None):
        self.capacity = capacity
        super().__init__(size, n_ants, n_iterations, default_instances, limits)
        self.description = (
            f"Capacitated vehicle routing solved by ant colony optimisation. Node 0 is the depot, nodes "
            f"1..{size} are customers; all are uniform random points in the unit square. Customer demands "
            f"are integers in 1..9 (demands[0] = 0), vehicle capacity {capacity}; every route starts and "
            f"ends at the depot and carries at most the capacity. Write `heuristics(distance_matrix, "
            f"coordinates, demands, capacity)` returning a numpy array of shape ({size + 1}, {size + 1}) whose "
            f"entry [i, j] is the prior desirability (>= 0, finite) of going from node i to node j (column 0 "
            f"= returning to the depot); ants choose among the feasible nodes with probability proportional "
            f"to pheromone[i, j] * heuristics[i, j]. Score: best total distance found by {self.n_ants} ants "
            f"in {self.n_iterations} iterations, averaged over instances (lower is better). The diagonal is "
            f"ignored. Only numpy and the standard library are available.")

    def instances(self, seed, n):
        out = []
        for i in range(n):
            rng = task_rng("aco_cvrp", self.size, seed, i)
            xy = rng.random((self.size + 1, 2))
            dem = np.concatenate([[0], rng.integers(1, 10, size=self.size)]).astype(np.float64)
            out.append({"coordinates": xy, "demands": dem, "capacity": self.capacity,
                        "distance_matrix": np.sqrt(((xy[:, None] - xy[None]) ** 2).sum(-1))})
        return out

    def _shape(self, inst):
        return (self.size + 1, self.size + 1)

    def _colony(self, inst, eta, rng):
        return aco_cvrp(inst["distance_matrix"], inst["demands"], self.capacity, eta,
                        self.n_ants, self.n_iterations, rng)


class AcoBinPacking(AcoTask):
    family = "binpacking"
    args = ("demand", "capacity")
    signature = "def heuristics(demand: np.ndarray, capacity: float) -> np.ndarray:"
    greedy_name = "uniform heuristic (all ones)"
    greedy_code = '''\
import numpy as np

def heuristics(demand, capacity):
    """No prior preference: every pair of items is equally desirable."""
    return np.ones((len(demand), len(demand)))
'''
    template = greedy_code

    def __init__(self, size, capacity=150, n_ants=10, n_iterations=5, default_instances=2, limits=None):
        self.capacity = capacity
        super().__init__(size, n_ants, n_iterations, default_instances, limits)
        self.description = (
            f"One-dimensional bin packing solved by ant colony optimisation. {size} items with integer sizes "
            f"uniform in 20..100 must be packed into bins of capacity {capacity}; use as few bins as "
            f"possible. Write `heuristics(demand, capacity)` returning a numpy array of shape ({size}, {size}) "
            f"whose entry [i, j] is the prior desirability (>= 0, finite) of putting items i and j in the "
            f"same bin. Ants fill one bin at a time, choosing the next item j among those that fit with "
            f"probability proportional to mean_i(pheromone[i, j]) * mean_i(heuristics[i, j]) over the items "
            f"i already in the bin. Score: fewest bins found by {self.n_ants} ants in {self.n_iterations} "
            f"iterations, averaged over instances (lower is better). Only numpy and the standard library "
            f"are available.")

    def instances(self, seed, n):
        out = []
        for i in range(n):
            rng = task_rng("aco_binpacking", self.size, seed, i)
            out.append({"demand": rng.integers(20, 101, size=self.size).astype(np.float64),
                        "capacity": self.capacity})
        return out

    def _shape(self, inst):
        return (self.size, self.size)

    def _colony(self, inst, eta, rng):
        return aco_binpacking(inst["demand"], self.capacity, eta, self.n_ants, self.n_iterations, rng)

    def extra_reference(self, seed, n):
        lb = [float(np.ceil(x["demand"].sum() / self.capacity)) for x in self.instances(seed, n)]
        return {"lower_bound": float(np.mean(lb)), "lower_bound_per_instance": lb}
