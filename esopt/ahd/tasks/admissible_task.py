"""The admissible-set AHD task (FunSearch): the LLM writes `priority(el, n, w) -> float`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from esopt.ahd.tasks import admissible as adm
from esopt.ahd.tasks.base import AHDTask, CandidateError
from esopt.ahd.tasks.driver import decode_array
from esopt.sandbox import Limits

BEST_KNOWN = {(15, 10): 3003, (21, 15): 43596, (12, 7): 792}


class AdmissibleSet(AHDTask):
    sense = "max"
    entry = "esopt.ahd.tasks.driver:admissible_priorities"
    function_name = "priority"
    signature = "def priority(el: tuple[int, ...], n: int, w: int) -> float:"
    greedy_name = "constant priority (lexicographic order)"
    optimum_source = "best-known (FunSearch)"
    greedy_code = '''\
def priority(el, n, w):
    """Trivial priority: every vector equal, so the greedy visits them in lexicographic order."""
    return 0.0
'''
    template = greedy_code
    default_instances = 1

    def __init__(self, n: int, w: int, limits: Limits | None = None):
        super().__init__()
        self.n, self.w = int(n), int(w)
        self.name = f"admissible_{self.n}_{self.w}"
        self.feasible = adm.n_candidates(self.n, self.w) <= adm.MAX_CANDIDATES
        self.default_limits = limits or Limits(timeout_s=300.0, memory_mb=2048)
        self.description = (
            f"Admissible sets A({n}, {w}) (FunSearch). An admissible set is a set of vectors in "
            f"{{0,1,2}}^{n}, each with exactly {w} nonzero entries and each with a different support (set of "
            f"nonzero positions), such that for any three distinct vectors there is a coordinate where their "
            f"three values are {{0,1,2}}, {{0,0,1}} or {{0,0,2}} (as multisets). Write `priority(el, n, w)`: "
            f"the evaluator scores all {adm.n_candidates(n, w)} candidate vectors `el` (tuples of ints), "
            f"visits them by decreasing priority (ties in lexicographic order) and adds each vector that keeps "
            f"the set admissible. Score: the size of the resulting set (higher is better; at most "
            f"C({n},{w}) = {math.comb(n, w)}). The function is called once per candidate, so keep it fast. "
            f"Only numpy and the standard library are available.")

    def instances(self, seed: int, n: int) -> list[dict]:
        """The problem is deterministic: one instance whatever the seed."""
        return [{"n": self.n, "w": self.w}]

    def evaluate(self, code, seed=0, n_instances=None, limits=None):
        if not self.feasible:
            raise ValueError(adm.ADMISSIBLE_21_15_NOTE)
        return super().evaluate(code, seed, 1, limits)

    def _payload(self, insts):
        return {"function": self.function_name, "n": self.n, "w": self.w}

    def _score(self, insts, value: Any, seed: int) -> list[float]:
        pr = decode_array(value["priorities"])
        if pr.shape != (adm.n_candidates(self.n, self.w),) or np.isnan(pr).any():
            raise CandidateError("wrong number of priorities")
        return [float(len(adm.greedy_admissible(self.n, self.w, pr)))]

    def optimum(self, seed, n):
        return float(BEST_KNOWN[(self.n, self.w)]) if (self.n, self.w) in BEST_KNOWN else None

    def reference(self, seed=0, n_instances=None):
        if not self.feasible:
            return {"greedy": None, "greedy_name": self.greedy_name, "optimum": self.optimum(0, 1),
                    "sense": self.sense, "note": adm.ADMISSIBLE_21_15_NOTE}
        return super().reference(0, 1)
