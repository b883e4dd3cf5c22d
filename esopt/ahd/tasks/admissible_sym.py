"""Symmetric ("pre-admissible") admissible sets, as FunSearch used for A(21, 15).

The n = 3*G coordinates are split into G groups of 3 consecutive coordinates. A
*pre-admissible element* is a G-tuple of symbols 0..6; symbol s stands for the
triple of values SYMBOL_TRIPLES[s] in its group:

    symbol  0        1        2        3        4        5        6
    triple  (0,0,0)  (0,0,1)  (0,0,2)  (0,1,2)  (0,2,1)  (1,1,1)  (2,2,2)
    weight  0        1        1        2        2        3        3

The tuple's weight (sum of the symbols' weights) must be w. Its *expansion* is
every full vector of {0,1,2}^n obtained by replacing each group's symbol by one
of the cyclic rotations of its triple, independently per group (3 rotations for
symbols 1-4, 1 for symbols 0, 5, 6): a tuple expands to 3^k vectors, k = number
of its groups with a symbol in 1..4. The objective is the total size of the
expansion of a pre-admissible set (a set of tuples whose expansion is an
admissible set with distinct supports).

Pre-admissibility condition (derived group by group, checked exhaustively for
G = 2 against the expanded vectors and by the tests on expanded greedy sets):

* one tuple: its expansion is always admissible with distinct supports (two
  different rotations of one triple, together with any third triple, always
  give a good coordinate: {0,0,x} or {0,1,2});
* two tuples a != b: a triple with two vectors of one tuple and one of the
  other is never bad (same reason), so the only constraint is *distinct
  supports*: the supports of the expansions of a and b meet iff a and b have
  the same per-group weight vector (symbols with the same weight have the same
  rotated supports; different weights never do). So: all members must have
  different weight vectors (weight(a_g))_g;
* three distinct tuples a, b, c: since the rotations are chosen independently
  per group and the three coordinates of a group only see that group's
  triples, the expansion contains a bad triple iff *every* group g is "bad":
  BAD3[a_g, b_g, c_g], where BAD3[x, y, z] says that some rotations of the
  three triples make all three coordinates of the group bad (no {0,1,2},
  {0,0,1}, {0,0,2} among them). BAD3 (symmetric, 103 of 343 entries true) is
  computed below from the definition. For instance BAD3[0, y, z] iff y == z;
  BAD3[5, 5, z] and BAD3[6, 6, z] for every z; BAD3[3, 4, z] iff z in {3,4,5,6}.

So a set S of weight-w tuples is pre-admissible iff its members have pairwise
different weight vectors and no three members a, b, c have BAD3[a_g, b_g, c_g]
for all g.

The greedy visits all weight-w tuples by decreasing priority (ties: the
lexicographic order of the tuples) and adds each tuple that is not blocked.
Adding e blocks, among the tuples not visited yet, (1) every tuple with e's
weight vector and (2) for every member a, every c with BAD3[a_g, e_g, c_g] for
all g. Both are "product sets" (c_g in a set of symbols, per group); each is
computed with per-group bitsets over the remaining candidates (one 64-bit word
per 64 candidates, one bitset per group and symbol subset), and the remaining
candidates are compacted whenever most of them have been blocked.

For G = 7, w = 15 there are 68,768 candidate tuples: one evaluation of A(21,15)
is 68,768 priority calls plus a greedy of well under a second.
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from typing import Any

import numpy as np

from esopt.ahd.tasks.base import AHDTask, CandidateError
from esopt.ahd.tasks.driver import _function, decode_array, encode_array, score_priorities
from esopt.sandbox import Limits

SYMBOL_TRIPLES = ((0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 2), (0, 2, 1), (1, 1, 1), (2, 2, 2))
SYMBOL_WEIGHTS = np.array([sum(v != 0 for v in t) for t in SYMBOL_TRIPLES], dtype=np.int64)
N_SYMBOLS = len(SYMBOL_TRIPLES)
BEST_KNOWN = {(21, 15): 43596}
MAX_SYM_CANDIDATES = 2_000_000


def rotations(triple: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """The distinct cyclic rotations of a triple, rotation r first = triple[r:] + triple[:r]."""
    out: list[tuple[int, int, int]] = []
    for r in range(3):
        t = tuple(triple[r:]) + tuple(triple[:r])
        if t not in out:
            out.append(t)
    return out


SYMBOL_ROTATIONS = tuple(rotations(t) for t in SYMBOL_TRIPLES)
N_ROTATIONS = np.array([len(r) for r in SYMBOL_ROTATIONS], dtype=np.int64)


def _good(a: int, b: int, c: int) -> bool:
    """A coordinate separates three vectors when its values are {0,1,2}, {0,0,1} or {0,0,2}."""
    s = sorted((a, b, c))
    return s == [0, 1, 2] or (s[0] == 0 and s[1] == 0 and s[2] != 0)


def _bad3_table() -> np.ndarray:
    bad = np.zeros((N_SYMBOLS,) * 3, dtype=bool)
    for x, y, z in itertools.product(range(N_SYMBOLS), repeat=3):
        bad[x, y, z] = any(not any(_good(u[i], v[i], t[i]) for i in range(3))
                           for u in SYMBOL_ROTATIONS[x] for v in SYMBOL_ROTATIONS[y]
                           for t in SYMBOL_ROTATIONS[z])
    return bad


BAD3 = _bad3_table()
"""BAD3[x, y, z]: some rotations of the triples of symbols x, y, z leave all 3 coordinates of the group bad."""
BAD3_MASK = (BAD3.astype(np.int64) << np.arange(N_SYMBOLS, dtype=np.int64)).sum(axis=2)
"""BAD3_MASK[x, y]: bit z set iff BAD3[x, y, z] (7-bit symbol subsets)."""
SAME_WEIGHT_MASK = np.array([sum(1 << s for s in range(N_SYMBOLS) if SYMBOL_WEIGHTS[s] == SYMBOL_WEIGHTS[x])
                             for x in range(N_SYMBOLS)], dtype=np.int64)
"""SAME_WEIGHT_MASK[x]: the symbols with the weight of x (same rotated supports)."""


def n_sym_candidates(groups: int, w: int) -> int:
    """Number of G-tuples of symbols of total weight w (coefficient of x^w in (1+2x+2x^2+2x^3)^G)."""
    poly = np.zeros(1, dtype=object)
    poly[0] = 1
    for _ in range(groups):
        nxt = np.zeros(poly.size + 3, dtype=object)
        for s in range(N_SYMBOLS):
            nxt[SYMBOL_WEIGHTS[s]:SYMBOL_WEIGHTS[s] + poly.size] += poly
        poly = nxt
    return int(poly[w]) if 0 <= w < poly.size else 0


def sym_candidates(groups: int, w: int) -> np.ndarray:
    """All G-tuples of symbols of weight w in lexicographic order, shape (M, G), int8."""
    if not 1 <= groups <= 8:
        raise ValueError(f"symmetric admissible sets need 1..8 groups, got {groups}")
    return _candidates(int(groups), int(w))


@lru_cache(maxsize=8)
def _candidates(groups: int, w: int) -> np.ndarray:
    idx = np.arange(N_SYMBOLS ** groups, dtype=np.int64)
    digits = np.empty((idx.size, groups), dtype=np.int8)
    for g in range(groups - 1, -1, -1):
        digits[:, g] = idx % N_SYMBOLS
        idx //= N_SYMBOLS
    keep = SYMBOL_WEIGHTS[digits].sum(axis=1) == w
    out = np.ascontiguousarray(digits[keep])
    out.setflags(write=False)
    return out


def expansion_sizes(tuples: np.ndarray) -> np.ndarray:
    """3^(number of groups with symbol in 1..4) for each tuple."""
    T = np.asarray(tuples, dtype=np.int64)
    return np.prod(N_ROTATIONS[T], axis=1) if T.ndim == 2 else np.zeros(0, dtype=np.int64)


def expansion_size(tuples: np.ndarray) -> int:
    return int(expansion_sizes(tuples).sum()) if len(tuples) else 0


def expand(tuples: np.ndarray) -> np.ndarray:
    """The full vectors of {0,1,2}^(3G) of the expansion of the tuples, shape (size, 3G), int8."""
    T = np.asarray(tuples, dtype=np.int64)
    if T.ndim != 2 or T.shape[0] == 0:
        return np.zeros((0, 3 * (T.shape[1] if T.ndim == 2 else 0)), dtype=np.int8)
    rows = []
    for t in T.tolist():
        for combo in itertools.product(*(SYMBOL_ROTATIONS[s] for s in t)):
            rows.append(sum(combo, ()))
    return np.array(rows, dtype=np.int8)


def _packbits(b: np.ndarray, n_words: int) -> np.ndarray:
    """Bool array (..., R) -> uint64 words (..., n_words), bit i of the row is bit i%64 of word i//64."""
    pad = n_words * 64 - b.shape[-1]
    if pad:
        b = np.concatenate([b, np.zeros(b.shape[:-1] + (pad,), dtype=bool)], axis=-1)
    packed = np.packbits(b, axis=-1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u8").astype(np.uint64, copy=False)


class _Remaining:
    """Bitset machinery over the candidates still to visit (in visiting order)."""

    def __init__(self, cand: np.ndarray, ids: np.ndarray):
        self.ids = ids
        cols = cand[ids].astype(np.int64)  # (R, G)
        R, G = cols.shape
        self.W = max(1, -(-R // 64))
        has = _packbits(cols.T[:, None, :] == np.arange(N_SYMBOLS)[None, :, None], self.W)  # (G, 7, W)
        table = np.zeros((G, 1 << N_SYMBOLS, self.W), dtype=np.uint64)
        for mask in range(1, 1 << N_SYMBOLS):
            low = (mask & -mask).bit_length() - 1
            table[:, mask] = table[:, mask ^ (1 << low)] | has[:, low]
        self.table = table  # table[g, m]: candidates whose symbol in group g is in subset m
        self.alive = _packbits(np.ones(R, dtype=bool), self.W)
        self.word = 0  # every word before this one is zero


def greedy_preadmissible(groups: int, w: int, priorities: np.ndarray) -> np.ndarray:
    """Greedy pre-admissible set: visit the weight-w G-tuples (given in `sym_candidates` order) by
    decreasing priority, ties in lexicographic order, and keep each tuple that leaves the set
    pre-admissible. Returns the chosen tuples in insertion order, shape (k, G), int8."""
    cand = sym_candidates(groups, w)
    M = cand.shape[0]
    pr = np.asarray(priorities, dtype=np.float64)
    if pr.shape != (M,):
        raise ValueError(f"expected {M} priorities, got shape {pr.shape}")
    if np.isnan(pr).any():
        raise ValueError("NaN priority")
    order = np.argsort(-pr, kind="stable")
    cand64 = cand.astype(np.int64)
    chosen: list[int] = []
    mem = np.zeros((0, groups), dtype=np.int64)  # members' symbols
    rem = _Remaining(cand, order)
    since_count = 0
    while True:
        nz = np.flatnonzero(rem.alive[rem.word:])
        if nz.size == 0:
            break
        rem.word += int(nz[0])
        word = int(rem.alive[rem.word])
        bit = (word & -word).bit_length() - 1
        rem.alive[rem.word] = np.uint64(word & ~(1 << bit))
        e = int(rem.ids[rem.word * 64 + bit])
        es = cand64[e]
        chosen.append(e)
        # blocks: same weight vector, and every c with BAD3[a_g, e_g, c_g] for all g, a a member
        masks = np.concatenate([SAME_WEIGHT_MASK[es][None, :], BAD3_MASK[mem, es[None, :]]], axis=0)  # (k+1, G)
        lo = rem.word
        blocked = rem.table[0, masks[:, 0], lo:].copy()
        for g in range(1, groups):
            blocked &= rem.table[g, masks[:, g], lo:]
        rem.alive[lo:] &= ~np.bitwise_or.reduce(blocked, axis=0)
        mem = np.concatenate([mem, es[None, :]], axis=0)
        since_count += 1
        if since_count >= 8:
            since_count = 0
            alive_bits = np.unpackbits(rem.alive.view(np.uint8), bitorder="little")[:rem.ids.size].astype(bool)
            n_alive = int(alive_bits.sum())
            if n_alive == 0:
                break
            if n_alive * 4 < rem.ids.size and rem.ids.size > 2048:
                rem = _Remaining(cand, rem.ids[alive_bits])
    return cand[np.array(chosen, dtype=np.int64)] if chosen else np.zeros((0, groups), dtype=np.int8)


def is_preadmissible(tuples: np.ndarray) -> bool:
    """Reduced-space check of the condition above (O(k^3 / 6) table look-ups, vectorised per pair)."""
    T = np.asarray(tuples, dtype=np.int64)
    k = T.shape[0]
    if k == 0:
        return True
    wv = SYMBOL_WEIGHTS[T]
    if np.unique(wv, axis=0).shape[0] != k:
        return False
    for i in range(k):
        for j in range(i + 1, k):
            C = T[j + 1:]
            if C.shape[0] and np.any(np.all(BAD3[T[i][None, :], T[j][None, :], C], axis=1)):
                return False
    return True


def check_admissible(vectors: np.ndarray, w: int) -> bool:
    """Admissibility of full vectors (weights, distinct supports, no bad triple), with per-coordinate
    bitsets: for a pair (a, b) the coordinate i is bad for c iff c_i is outside
    good(a_i, b_i) = {1,2} if a_i = b_i = 0, {0, 3-x} if exactly one of them is 0 and the other x,
    {0} if both are nonzero and different, {} if both equal nonzero. Independent of the
    pre-admissible machinery; O(k^2 n k/64) word operations."""
    V = np.asarray(vectors, dtype=np.int64)
    if V.size == 0:
        return True
    k, n = V.shape
    if np.any((V < 0) | (V > 2)) or np.any((V != 0).sum(axis=1) != w):
        return False
    if np.unique(V != 0, axis=0).shape[0] != k:
        return False
    W = -(-k // 64)
    # H[i, v]: members with value v at coordinate i; bad-c sets are unions of H[i, v] over v not good
    H = _packbits((V.T[:, None, :] == np.arange(3)[None, :, None]), W)  # (n, 3, W)
    # for (a_i, b_i) in 3x3: 3-bit mask of the c-values that leave coordinate i bad
    badmask = np.zeros((3, 3), dtype=np.int64)
    for x in range(3):
        for y in range(3):
            badmask[x, y] = sum(1 << v for v in range(3) if not _good(x, y, v))
    U = np.zeros((n, 8, W), dtype=np.uint64)
    for m in range(1, 8):
        for v in range(3):
            if m >> v & 1:
                U[:, m] |= H[:, v]
    ci = np.arange(n)
    later = _packbits(np.arange(k)[None, :] > np.arange(k)[:, None], W)  # later[b]: members c > b
    for a in range(k - 2):
        bs = np.arange(a + 1, k - 1)
        masks = badmask[V[a][None, :], V[bs]]  # (nb, n)
        acc = np.bitwise_and.reduce(U[ci[None, :], masks], axis=1)  # (nb, W): c bad on every coordinate
        if np.any(acc & later[bs]):
            return False
    return True


# ---------------------------------------------------------------------------------------- sandbox side
def symmetric_priorities(ns: dict, payload: dict) -> dict:
    """Trusted driver (runs in the sandbox): priority of every weight-w G-tuple of symbols, in
    lexicographic order of the tuples; `el` is passed as a tuple of ints."""
    fn = _function(ns, payload["function"])
    groups, n, w = int(payload["groups"]), int(payload["n"]), int(payload["w"])
    tuples = sym_candidates(groups, w).tolist()
    return {"priorities": encode_array(score_priorities(fn, map(tuple, tuples), len(tuples), n, w))}


REFERENCE_PRIORITY = '''\
def priority(el, n, w):
    """Simple baseline: prefer tuples with a large expansion (3 vectors per group whose symbol is
    1, 2, 3 or 4), ties in lexicographic order."""
    return float(sum(1 for s in el if 1 <= s <= 4))
'''


class AdmissibleSetSymmetric(AHDTask):
    """A(3G, w) through pre-admissible G-tuples (FunSearch's symmetric formulation of A(21, 15))."""

    sense = "max"
    entry = "esopt.ahd.tasks.admissible_sym:symmetric_priorities"
    function_name = "priority"
    signature = "def priority(el: tuple[int, ...], n: int, w: int) -> float:"
    greedy_name = "number of groups with 3 rotations (symbols 1-4), ties lexicographic"
    optimum_source = "best-known (FunSearch)"
    greedy_code = REFERENCE_PRIORITY
    template = '''\
def priority(el, n, w):
    """el: tuple of 7 symbols in 0..6 (one per group of 3 coordinates); constant = lexicographic order."""
    return 0.0
'''
    default_instances = 1

    def __init__(self, n: int = 21, w: int = 15, limits: Limits | None = None):
        super().__init__()
        if n % 3:
            raise ValueError(f"the symmetric formulation needs n divisible by 3, got {n}")
        self.n, self.w, self.groups = int(n), int(w), int(n) // 3
        self.n_candidates = n_sym_candidates(self.groups, self.w)
        if self.n_candidates > MAX_SYM_CANDIDATES:
            raise ValueError(f"A({n},{w}) has {self.n_candidates} pre-admissible candidates, "
                             f"more than {MAX_SYM_CANDIDATES}")
        self.name = f"admissible_{self.n}_{self.w}"
        self.default_limits = limits or Limits(timeout_s=120.0, memory_mb=2048)
        G = self.groups
        self.description = (
            f"Admissible sets A({n}, {w}) (FunSearch), symmetric formulation. An admissible set is a set of "
            f"vectors in {{0,1,2}}^{n}, each with exactly {w} nonzero entries and each with a different support "
            f"(set of nonzero positions), such that for any three distinct vectors there is a coordinate where "
            f"their three values are {{0,1,2}}, {{0,0,1}} or {{0,0,2}} (as multisets). Here the {n} coordinates "
            f"form {G} groups of 3 and you score compressed elements: `el` is a tuple of {G} ints, one symbol "
            f"0..6 per group, symbol s standing for the group's values "
            f"0=(0,0,0), 1=(0,0,1), 2=(0,0,2), 3=(0,1,2), 4=(0,2,1), 5=(1,1,1), 6=(2,2,2), i.e. weights "
            f"(nonzeros) 0,1,1,2,2,3,3; every `el` has total weight {w}. A tuple stands for all vectors obtained "
            f"by rotating each group's triple cyclically (3 rotations for symbols 1-4, 1 for 0, 5 and 6), i.e. "
            f"3^k vectors where k is the number of its symbols in 1..4. The evaluator calls `priority(el, n, w)` "
            f"(n={n}, w={w}) once for each of the {self.n_candidates} tuples of weight {w}, visits them by "
            f"decreasing priority (ties in lexicographic order of the tuples) and adds each tuple whose "
            f"vectors keep the whole set admissible (so two kept tuples never have the same weight in every "
            f"group). Score: the number of vectors of the resulting admissible set (higher is better; best "
            f"known {BEST_KNOWN.get((self.n, self.w), 'unknown')}). Keep the function fast; only numpy and "
            f"the standard library are available.")

    def instances(self, seed: int, n: int) -> list[dict]:
        """Deterministic problem: one instance whatever the seed."""
        return [{"n": self.n, "w": self.w}]

    def evaluate(self, code, seed=0, n_instances=None, limits=None):
        return super().evaluate(code, seed, 1, limits)

    def _payload(self, insts):
        return {"function": self.function_name, "groups": self.groups, "n": self.n, "w": self.w}

    def _score(self, insts, value: Any, seed: int) -> list[float]:
        pr = decode_array(value["priorities"])
        if pr.shape != (self.n_candidates,) or np.isnan(pr).any():
            raise CandidateError("wrong number of priorities")
        return [float(expansion_size(greedy_preadmissible(self.groups, self.w, pr)))]

    def optimum(self, seed, n):
        return float(BEST_KNOWN[(self.n, self.w)]) if (self.n, self.w) in BEST_KNOWN else None

    def extra_reference(self, seed, n):
        return {"n_candidates": self.n_candidates, "formulation": "symmetric (pre-admissible 7-tuples)"
                if self.groups == 7 else f"symmetric (pre-admissible {self.groups}-tuples)"}

    def reference(self, seed=0, n_instances=None):
        return super().reference(0, 1)
