"""Bounded-staleness asynchronous ES on a RayEvaluator.

Workers never wait for a population to finish: a free worker is first sent the updates committed
since its last job (queued behind its current work, as Update objects), then the next member of
the member stream of that weights version v. The stream of version v is Strategy.ask(v) (the
members synchronous step v would evaluate, on step v's tasks and decoding seed), continued past G
with fresh seeds when more members are dispatched at that version.

Results are processed in dispatch order (a reorder buffer), so which results form an update does
not depend on which worker happened to finish first. A result's lag is the number of updates
committed since the version it was evaluated at; a result with lag > max_lag is discarded. Every
`commit_every` (M) accepted results, the Strategy shapes their fitness into one Update (a normal
history record). With max_lag 0 and M = G, update k is made of exactly the members of
Strategy.ask(k), in order, so the run equals synchronous ES bit for bit. With max_lag > 0 one
update may mix members evaluated at different versions, hence on different task batches: the
common-random-numbers property then holds only among members of the same version.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from esopt.population.base import MemberResult
from esopt.population.ray_evaluator import RayEvaluator
from esopt.envs.base import Task
from esopt.es import Member, Strategy, Update, derive_seed
from esopt.rollout import RolloutConfig

WorkFor = Callable[[int], tuple[list[Task], int]]
"""version -> (tasks, decoding seed) of the members evaluated at that version."""


@dataclass
class AsyncCommit:
    update: Update
    members: list[Member]
    results: list[MemberResult]
    lags: list[int]
    metrics: dict[str, float]


class AsyncES:
    def __init__(
        self,
        evaluator: RayEvaluator,
        strategy: Strategy,
        work_for: WorkFor,
        rollout: RolloutConfig,
        max_lag: int,
        commit_every: int,
        keep_trajectories: int = 0,
    ):
        if max_lag < 0 or commit_every < 1:
            raise ValueError(f"max_lag must be >= 0 and commit_every >= 1, got {max_lag}, {commit_every}")
        self.evaluator = evaluator
        self.strategy = strategy
        self.work_for = work_for
        self.rollout = rollout
        self.max_lag = max_lag
        self.commit_every = commit_every
        self.keep = keep_trajectories
        self._dispatched: dict[int, int] = {}  # version -> members dispatched at it (newest only)
        self._work: dict[int, tuple] = {}  # version -> (tasks ref, decoding seed)
        self._asked: dict[int, list[Member]] = {}
        self._seq = 0  # dispatch order
        self._next = 0  # next sequence number to process
        self._members: dict[int, Member] = {}  # sequence number -> member, while in flight
        self._finished: dict[int, tuple[Member, int, MemberResult]] = {}
        self._accepted: list[tuple[Member, int, MemberResult]] = []
        self.evaluated = 0
        self.discarded = 0

    # ---- the member stream -------------------------------------------------------------------
    def member(self, version: int, i: int) -> Member:
        """Member i of version `version`: Strategy.ask(version)[i] for i < G, then fresh seeds."""
        if version not in self._asked:
            self._asked = {v: m for v, m in self._asked.items() if v >= version - self.max_lag - 1}
            self._asked[version] = self.strategy.ask(version)
        asked = self._asked[version]
        rounds, j = divmod(i, len(asked))
        base = asked[j]
        if rounds == 0:
            return base
        pair = j // 2 if self.strategy.config.antithetic else j  # antithetic pairs keep sharing a seed
        seed = derive_seed("async-member", self.strategy.run_seed, version, rounds, pair)
        return replace(base, index=i, seed=seed)

    def _work_ref(self, version: int):
        if version not in self._work:
            self._work = {v: w for v, w in self._work.items() if v >= version - self.max_lag - 1}
            tasks, seed = self.work_for(version)
            self._work[version] = (self.evaluator.put(tasks), seed)
        return self._work[version]

    def _dispatch(self) -> None:
        ev = self.evaluator
        for slot in ev.idle_slots():
            version = ev.version
            i = self._dispatched.get(version, 0)
            self._dispatched = {version: i + 1}  # members are only ever drawn at the newest version
            tasks_ref, seed = self._work_ref(version)
            member = self.member(version, i)
            self._members[self._seq] = member
            ev.submit(slot, self._seq, member, version, tasks_ref, self.rollout, seed, self.keep)
            self._seq += 1

    def _collect(self) -> None:
        for seq, version, result in self.evaluator.wait():
            self._finished[seq] = (self._members.pop(seq), version, result)

    # ---- commits -----------------------------------------------------------------------------
    def next_update(self, step: int) -> AsyncCommit:
        """Keep every worker busy until M results with lag <= max_lag are in; return their Update
        (not yet applied: the caller applies it through the evaluator)."""
        ev = self.evaluator
        if step != ev.version:
            raise RuntimeError(f"asynchronous ES: asked for update {step} but the weights are at version {ev.version}")
        ev.reset_restart_budget()
        processed = discarded = 0
        while len(self._accepted) < self.commit_every:
            if self._next in self._finished:
                member, version, result = self._finished.pop(self._next)
                self._next += 1
                processed += 1
                lag = ev.version - version
                if lag > self.max_lag:
                    discarded += 1
                else:
                    self._accepted.append((member, version, result))
                continue
            self._dispatch()
            self._collect()
        self.evaluated += processed
        self.discarded += discarded
        used, self._accepted = self._accepted, []
        members = [m for m, _, _ in used]
        results = [r for _, _, r in used]
        update = self.strategy.tell(step, members, [r.fitness for r in results])
        all_lags = [ev.version - v for _, v, _ in used]
        metrics = {
            "async/lag_mean": math.fsum(all_lags) / len(all_lags),
            "async/lag_max": float(max(all_lags)),
            "async/discard_rate": discarded / processed if processed else 0.0,
            "async/discarded": float(discarded),
            "async/evaluated": float(processed),
            "async/discard_rate_total": self.discarded / self.evaluated if self.evaluated else 0.0,
            "async/inflight": float(ev.inflight()),
        }
        return AsyncCommit(update, members, results, all_lags, metrics)

    def drain(self) -> None:
        """Wait for the evaluations in flight (kept for the next commit); no new ones are started."""
        while self.evaluator.inflight():
            self._collect()
