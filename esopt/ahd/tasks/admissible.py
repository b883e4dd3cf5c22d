"""Admissible sets A(n, w) (FunSearch, Romera-Paredes et al. 2023): pure-numpy machinery.

A constant-weight admissible set is a set of vectors in {0,1,2}^n, each with
exactly w nonzero entries and each with a *different support*, such that for
any three distinct members there is a coordinate where their three values are,
as a multiset, {0,1,2}, {0,0,1} or {0,0,2}.

Evaluation of a `priority(el, n, w)` function: score every weight-w vector,
visit them by decreasing priority (ties: lexicographic order of the vector),
and add each one that keeps the set admissible. Adding a vector e blocks its
whole support and every vector c that would form a bad triple with e and a
member a. For a pair (a, e), c is blocked iff on every coordinate the triple
fails, which (all weights being w) means: supp(c) = (A | E) minus d positions
of G, where d = |A \\ E| and G are the positions in A & E where a and e agree;
c copies a on A \\ E and e on E \\ A, and is free (nonzero) elsewhere on its
support. The greedy enumerates those blocked sets vectorised over all members.

Sizes: (15,10) has C(15,10)*2^10 = 3,075,072 candidates (~10-20 s of greedy
plus the priority calls). (21,15) has C(21,15)*2^15 = 1.78e9 candidates: the
plain enumeration is infeasible (memory and ~hours of Python calls), so this
module refuses it; the task `admissible_21_15` uses FunSearch's symmetric
(pre-admissible 7-tuple) formulation instead, in `esopt.ahd.tasks.admissible_sym`.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import numpy as np

ADMISSIBLE_21_15_NOTE = (
    "A(21,15) has 1.78e9 weight-15 candidates; enumerating them and calling priority() on each "
    "needs >10 GB and hours, so the plain evaluator refuses it (max 2e7 candidates). "
    "Use the symmetric formulation instead: task admissible_21_15 "
    "(esopt.ahd.tasks.admissible_sym.AdmissibleSetSymmetric, 68,768 pre-admissible 7-tuples). "
    "Best known size 43596 (FunSearch, symmetric construction).")
MAX_CANDIDATES = 20_000_000


def n_candidates(n: int, w: int) -> int:
    return math.comb(n, w) * 2 ** w


@lru_cache(maxsize=4)
def _tables(n: int, w: int):
    """Candidates indexed flat = support_id * 2^w + pattern (pattern bit j: j-th support position is 2)."""
    if n_candidates(n, w) > MAX_CANDIDATES:
        raise ValueError(ADMISSIBLE_21_15_NOTE if (n, w) == (21, 15) else
                         f"A({n},{w}) has {n_candidates(n, w)} candidates, more than {MAX_CANDIDATES}")
    supports = np.array(list(itertools.combinations(range(n), w)), dtype=np.int64).reshape(-1, w)
    n_sup = supports.shape[0]
    sup_mask = (np.int64(1) << supports).sum(axis=1)
    sid_of_mask = np.full(1 << n, -1, dtype=np.int64)
    sid_of_mask[sup_mask] = np.arange(n_sup)
    rank = np.full((n_sup, n), -1, dtype=np.int64)
    rank[np.arange(n_sup)[:, None], supports] = np.arange(w)[None, :]
    pats = np.arange(1 << w, dtype=np.int64)
    bits = (pats[:, None] >> np.arange(w)[None, :]) & 1  # (2^w, w)
    # full vectors, flat order
    vec = np.zeros((n_sup, 1 << w, n), dtype=np.int8)
    vec[:, :, :] = 0
    for j in range(w):
        vec[np.arange(n_sup)[:, None], :, supports[:, j][:, None]] = (1 + bits[:, j])[None, :]
    vec = vec.reshape(-1, n)
    key = (vec.astype(np.int64) * (3 ** np.arange(n - 1, -1, -1, dtype=np.int64))[None, :]).sum(axis=1)
    lex = np.argsort(key, kind="stable")  # lex[k] = flat id of the k-th vector in lexicographic order
    # twos mask (full positions) of every candidate
    twos = ((vec == 2).astype(np.int64) << np.arange(n, dtype=np.int64)[None, :]).sum(axis=1)
    pos_of_mask = np.full((1 << n, n), -1, dtype=np.int64)
    for m in range(1 << n):
        p = [i for i in range(n) if (m >> i) & 1]
        pos_of_mask[m, :len(p)] = p
    return {"vec": vec, "lex": lex, "sup_mask": sup_mask, "sid_of_mask": sid_of_mask, "rank": rank,
            "twos": twos, "pos_of_mask": pos_of_mask, "n_sup": n_sup}


def lexicographic_vectors(n: int, w: int) -> np.ndarray:
    """All weight-w vectors of {0,1,2}^n in lexicographic order, shape (C(n,w)*2^w, n), int8.
    Built recursively (first digit 0, then 1, then 2), without the greedy's tables."""
    if n_candidates(n, w) > MAX_CANDIDATES:
        raise ValueError(ADMISSIBLE_21_15_NOTE if (n, w) == (21, 15) else
                         f"A({n},{w}) has {n_candidates(n, w)} candidates, more than {MAX_CANDIDATES}")
    return _lex(n, w)


@lru_cache(maxsize=64)
def _lex(n: int, w: int) -> np.ndarray:
    if w < 0 or w > n:
        return np.zeros((0, n), dtype=np.int8)
    if n == 0:
        return np.zeros((1, 0), dtype=np.int8)
    parts = []
    for digit, rest_w in ((0, w), (1, w - 1), (2, w - 1)):
        rest = _lex(n - 1, rest_w)
        if rest.shape[0]:
            parts.append(np.concatenate([np.full((rest.shape[0], 1), digit, dtype=np.int8), rest], axis=1))
    return np.concatenate(parts, axis=0) if parts else np.zeros((0, n), dtype=np.int8)


def _popcount(x: np.ndarray) -> np.ndarray:
    c = np.zeros_like(x)
    y = x.copy()
    while np.any(y):
        c += y & 1
        y >>= 1
    return c


def greedy_admissible(n: int, w: int, priorities_lex: np.ndarray) -> np.ndarray:
    """Greedy admissible set from priorities given in lexicographic order; returns (size, n) int8."""
    t = _tables(n, w)
    lex, twos, sup_mask = t["lex"], t["twos"], t["sup_mask"]
    P = 1 << w
    M = t["n_sup"] * P
    pr = np.asarray(priorities_lex, dtype=np.float64)
    if pr.shape != (M,):
        raise ValueError(f"expected {M} priorities, got shape {pr.shape}")
    order = lex[np.argsort(-pr, kind="stable")]
    dead = np.zeros(M, dtype=bool)
    used = np.zeros(t["n_sup"], dtype=bool)
    members_A: list[int] = []
    members_T: list[int] = []
    chosen: list[int] = []
    pats = np.arange(P, dtype=np.int64)
    combos_cache: dict[tuple[int, int], np.ndarray] = {}
    ptr = 0
    chunk = 4096
    while ptr < M:
        window = order[ptr:ptr + chunk]
        alive = ~dead[window] & ~used[window // P]
        hits = np.flatnonzero(alive)
        if hits.size == 0:
            ptr += chunk
            continue
        ptr += int(hits[0]) + 1
        e = int(window[hits[0]])
        s_e = e // P
        E, Te = int(sup_mask[s_e]), int(twos[e])
        used[s_e] = True
        chosen.append(e)
        if members_A:
            A = np.array(members_A, dtype=np.int64)
            Ta = np.array(members_T, dtype=np.int64)
            _block(t, n, w, A, Ta, E, Te, dead, used, pats, combos_cache)
        members_A.append(E)
        members_T.append(Te)
    return t["vec"][np.array(chosen, dtype=np.int64)]


def _block(t, n, w, A, Ta, E, Te, dead, used, pats, combos_cache) -> None:
    P = 1 << w
    I = A & E
    X = A ^ E
    U = A | E
    G = I & ~(Ta ^ Te)
    F2 = (Ta & A & ~E) | (Te & E & ~A)
    d = _popcount(A & ~E)
    g = _popcount(G)
    ok = (g >= d) & (d >= 1)
    if not np.any(ok):
        return
    for gv, dv in set(zip(g[ok].tolist(), d[ok].tolist())):
        rows = np.flatnonzero(ok & (g == gv) & (d == dv))
        key = (gv, dv)
        if key not in combos_cache:
            combos_cache[key] = np.array(list(itertools.combinations(range(gv), dv)), dtype=np.int64)
        cmb = combos_cache[key]  # (C, d)
        gpos = t["pos_of_mask"][G[rows]][:, :gv]  # (r, g)
        Dmask = (np.int64(1) << gpos[:, cmb]).sum(axis=2)  # (r, C)
        T = U[rows][:, None] & ~Dmask
        sid = t["sid_of_mask"][T]  # (r, C)
        keep = ~used[sid]
        if not np.any(keep):
            continue
        sid = sid[keep]
        Xr = np.broadcast_to(X[rows][:, None], keep.shape)[keep]
        Fr = np.broadcast_to(F2[rows][:, None], keep.shape)[keep]
        rk = t["rank"][sid]  # (k, n)
        m = np.zeros_like(sid)
        v = np.zeros_like(sid)
        for pos in range(n):
            r = rk[:, pos]
            xb = (Xr >> pos) & 1
            fb = (Fr >> pos) & 1
            sh = np.where(r >= 0, r, 0)
            m |= (xb << sh) * (r >= 0)
            v |= (fb << sh) * (r >= 0)
        match = (pats[None, :] & m[:, None]) == v[:, None]  # (k, P)
        flat = (sid[:, None] * P + pats[None, :])[match]
        dead[flat] = True


def is_admissible(vectors: np.ndarray, w: int) -> bool:
    """Brute-force check (O(size^3)); for tests on small sets."""
    V = np.asarray(vectors, dtype=np.int64)
    if V.size == 0:
        return True
    if np.any((V != 0).sum(axis=1) != w) or np.any((V < 0) | (V > 2)):
        return False
    sup = [tuple(np.flatnonzero(r)) for r in V]
    if len(set(sup)) != len(sup):
        return False
    k = len(V)
    for i in range(k):
        for j in range(i + 1, k):
            a, b = V[i], V[j]
            C = V[j + 1:]
            if C.shape[0] == 0:
                continue
            zeros = (a == 0).astype(int)[None, :] + (b == 0).astype(int)[None, :] + (C == 0).astype(int)
            nz_all_differ = (zeros == 1) & (np.maximum(np.maximum(a[None, :], b[None, :]), C) == 2) & \
                (((a[None, :] == 1) | (b[None, :] == 1) | (C == 1)))
            good = (zeros == 2) | nz_all_differ
            if not np.all(good.any(axis=1)):
                return False
    return True
