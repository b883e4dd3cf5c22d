"""Trusted functions that run *inside* the sandbox child (via `call_in_sandbox`).

Each receives the namespace the candidate code was exec'd into and a JSON
payload, calls the candidate's function as the task prescribes, checks every
answer, and returns plain JSON. Bulky float arrays travel as base64-encoded
float64 bytes. Anything the candidate does wrong raises `CandidateError` with a
message meant for the LLM; the sandbox turns it into `SandboxResult.error`.

What comes back is never trusted as a score: the parent re-validates the
solutions and computes objectives itself (the candidate shares this process
and could monkeypatch numpy).
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

from esopt.ahd.tasks.admissible import lexicographic_vectors


class CandidateError(Exception):
    """The candidate function misbehaved (illegal move, wrong type, bad shape...)."""


def encode_array(a: np.ndarray) -> dict:
    a = np.ascontiguousarray(a, dtype=np.float64)
    return {"shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode("ascii")}


def decode_array(d: dict) -> np.ndarray:
    buf = base64.b64decode(d["b64"].encode("ascii"))
    return np.frombuffer(buf, dtype=np.float64).reshape(d["shape"]).copy()


def _function(ns: dict, name: str):
    fn = ns.get(name)
    if fn is None:
        raise CandidateError(f"the code does not define a function named {name!r}")
    if not callable(fn):
        raise CandidateError(f"{name!r} is not a function")
    return fn


def _as_index(x: Any, what: str) -> int:
    if isinstance(x, (bool, np.bool_)):
        raise CandidateError(f"{what} returned a bool ({x!r}), expected an int")
    if isinstance(x, (int, np.integer)):
        return int(x)
    raise CandidateError(f"{what} returned {x!r} of type {type(x).__name__}, expected an int")


def tsp_construct(ns: dict, payload: dict) -> dict:
    """Build one tour per instance with select_next_node; start and end at node 0."""
    fn = _function(ns, payload["function"])
    tours = []
    for k, inst in enumerate(payload["instances"]):
        dist = np.asarray(inst["distance_matrix"], dtype=np.float64)
        n = dist.shape[0]
        current, dest = 0, 0
        unvisited = list(range(1, n))
        tour = [0]
        step = 0
        while unvisited:
            choice = fn(current, dest, np.array(unvisited, dtype=np.int64), dist.copy())
            nxt = _as_index(choice, "select_next_node")
            if nxt not in unvisited:
                raise CandidateError(
                    f"illegal move: select_next_node returned {nxt}, which is not an unvisited node "
                    f"(instance {k}, step {step}, current node {current})")
            unvisited.remove(nxt)
            tour.append(nxt)
            current = nxt
            step += 1
        tours.append(tour)
    return {"tours": tours}


def knapsack_construct(ns: dict, payload: dict) -> dict:
    """Fill each knapsack with select_next_item until it returns -1 or nothing fits."""
    fn = _function(ns, payload["function"])
    selections = []
    for k, inst in enumerate(payload["instances"]):
        w = np.asarray(inst["weights"], dtype=np.float64)
        v = np.asarray(inst["values"], dtype=np.float64)
        cap = float(inst["capacity"])
        available = list(range(len(w)))
        taken: list[int] = []
        remaining = cap
        step = 0
        while available and np.any(w[available] <= remaining):
            choice = _as_index(fn(remaining, w[available].copy(), v[available].copy()), "select_next_item")
            if choice == -1:
                break
            if not 0 <= choice < len(available):
                raise CandidateError(
                    f"illegal move: select_next_item returned {choice}, but only {len(available)} items "
                    f"remain (valid: 0..{len(available) - 1}, or -1 to stop) (instance {k}, step {step})")
            item = available[choice]
            if w[item] > remaining:
                raise CandidateError(
                    f"illegal move: item {choice} has weight {w[item]:.4f} > remaining capacity "
                    f"{remaining:.4f} (instance {k}, step {step})")
            remaining -= w[item]
            taken.append(item)
            available.pop(choice)
            step += 1
        selections.append(taken)
    return {"selections": selections}


def score_priorities(fn, elements, count: int, n: int, w: int) -> np.ndarray:
    """priority(el, n, w) of each element (tuples), checked to be a real, non-NaN number."""
    out = np.empty(count, dtype=np.float64)
    for k, el in enumerate(elements):
        p = fn(el, n, w)
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.integer, np.floating)):
            raise CandidateError(f"priority returned {p!r} of type {type(p).__name__}, expected a number")
        p = float(p)
        if math.isnan(p):
            raise CandidateError(f"priority returned NaN for {el}")
        out[k] = p
    return out


def admissible_priorities(ns: dict, payload: dict) -> dict:
    """Priority of every vector in {0,1,2}^n with exactly w nonzeros, in lexicographic order."""
    fn = _function(ns, payload["function"])
    n, w = int(payload["n"]), int(payload["w"])
    vecs = lexicographic_vectors(n, w)
    elements = (el for start in range(0, vecs.shape[0], 65536) for el in map(tuple, vecs[start:start + 65536].tolist()))
    return {"priorities": encode_array(score_priorities(fn, elements, vecs.shape[0], n, w))}


def heuristic_matrices(ns: dict, payload: dict) -> dict:
    """Call heuristics(**instance) once per instance; return the matrices (checked in the parent)."""
    fn = _function(ns, payload["function"])
    mats = []
    for k, inst in enumerate(payload["instances"]):
        args = [np.asarray(inst[a], dtype=np.float64) if isinstance(inst[a], list) else inst[a]
                for a in payload["args"]]
        res = fn(*args)
        try:
            arr = np.asarray(res, dtype=np.float64)
        except (TypeError, ValueError):
            raise CandidateError(
                f"heuristics returned {type(res).__name__}, not an array of numbers (instance {k})") from None
        mats.append(encode_array(arr))
    return {"matrices": mats}
