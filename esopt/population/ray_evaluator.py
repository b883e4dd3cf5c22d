"""Population evaluation on Ray actors, each holding its own policy replica.

- Each actor builds its replica once (base weights from a picklable policy factory, optionally a
  checkpoint, then a replay of the updates since), and the env from (name, options).
- The driver sends members (seed, sigma, sign, subspace), the step's tasks and the decoding seed,
  and gets MemberResults back; members go to whichever actor is free (a work queue), results come
  back in member order.
- An update is sent to every actor as the `Update` object (seeds + coefficients, never weights);
  the driver's own policy (which the trainer evaluates and checkpoints) applies it too, and every
  replica's fingerprint must equal the driver's, or a RuntimeError names the ones that differ.
- An actor that dies (RayActorError) is replaced by a new one rebuilt from the base weights plus a
  replay of the updates applied so far; its fingerprint is checked and its lost member evaluated
  again, so the step ends with the same update as without the fault.
- CPU limits: each actor reserves `threads` CPUs of the cluster and runs torch on `threads`
  threads; workers x threads may not exceed the CPUs (no oversubscription, no actor that can never
  be scheduled).
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from esopt.confutil import ConfigError
from esopt.population.base import Evaluator, MemberResult
from esopt.population.replica import PolicyFactory, Replica
from esopt.envs.base import Task
from esopt.es import Member, Update
from esopt.policy.base import Policy
from esopt.rollout import RolloutConfig

OBJECT_STORE_MB = 256
"""Object store of a local cluster: only seeds, tasks and scalar results travel through it."""


def require_ray():
    """Import Ray, or raise a ConfigError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "dist.workers > 0 evaluates members on Ray, which is not installed; "
            "install it with: pip install 'esopt[ray]'  (or pip install 'ray>=2.40'), or set dist.workers 0"
        ) from None
    return ray


def worker_lost_errors(ray) -> tuple[type, ...]:
    """What ray.get raises when a worker process is gone: the actor died (crash, kill, node loss)
    or Ray's memory monitor killed it."""
    return (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError)


def machine_cpus() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_threads(workers: int, threads_per_worker: int, cpus: int) -> int:
    """Threads per actor (0 = cores // workers, at least 1); ConfigError when workers x threads > cpus."""
    if workers < 1:
        raise ConfigError(f"dist.workers must be >= 1 for Ray evaluation, got {workers}")
    threads = threads_per_worker or max(1, cpus // workers)
    if workers * threads > cpus:
        raise ConfigError(
            f"dist.workers ({workers}) x dist.threads_per_worker ({threads}) = {workers * threads} CPUs, but the "
            f"Ray cluster has {cpus}; lower dist.workers or dist.threads_per_worker (oversubscribed CPUs run slower "
            "and actors that cannot get their CPUs never start)"
        )
    return threads


@dataclass
class _Slot:
    """One worker position: its current actor, the weights version it has been sent, and the
    apply() fingerprints not yet checked."""

    rank: int
    actor: Any = None
    version: int = 0
    pid: int = 0
    busy: bool = False
    pending: list = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"worker {self.rank} (pid {self.pid})"


@dataclass
class _Job:
    slot: _Slot
    tag: Any
    member: Member
    version: int
    args: tuple


class RayEvaluator(Evaluator):
    def __init__(
        self,
        policy: Policy,
        env_name: str,
        env_options: dict,
        factory: PolicyFactory,
        workers: int,
        threads_per_worker: int = 0,
        ray_address: str | None = None,
        checkpoint: str | None = None,
        base_version: int = 0,
        updates: list[Update] | None = None,
        max_restarts: int = 3,
        startup_timeout_s: float = 900.0,
        log: Callable[[str], None] | None = None,
    ):
        """`policy` is the driver's replica, already at version base_version + len(updates): the
        checkpoint (None = the factory's base weights) plus `updates` replayed in order."""
        self.ray = ray = require_ray()
        self.policy = policy
        self.env_name, self.env_options = env_name, dict(env_options)
        self.factory = factory
        self.checkpoint = None if checkpoint is None else str(checkpoint)
        self.base_version = base_version
        self.updates: list[Update] = list(updates or [])
        self.version = base_version + len(self.updates)
        self.max_restarts = max_restarts
        self.startup_timeout_s = startup_timeout_s
        self.log = log or (lambda message: None)
        self.restarts = 0
        self._restarts_left = max_restarts
        self._inflight: dict[Any, _Job] = {}
        self._rss_refs: list = []
        self._driver_fp = {self.version: policy.fingerprint()}
        self.slots: list[_Slot] = []

        self._owns_ray = False
        if not ray.is_initialized():
            if ray_address:
                ray.init(address=ray_address, log_to_driver=False)
            else:
                ray.init(
                    num_cpus=machine_cpus(),
                    include_dashboard=False,
                    log_to_driver=False,
                    object_store_memory=OBJECT_STORE_MB * 1024 * 1024,
                )
            self._owns_ray = True
        try:
            cpus = int(ray.cluster_resources().get("CPU", 0))
            self.threads = resolve_threads(workers, threads_per_worker, cpus)
            # max_restarts=0: a dead actor stays dead; replacing it (and replaying updates) is ours to do.
            self._actor_class = ray.remote(Replica).options(num_cpus=self.threads, max_restarts=0)
            free = ray.available_resources().get("CPU", 0)
            if free < workers * self.threads:
                self.log(
                    f"[yellow]waiting for Ray CPUs: {workers} workers x {self.threads} need {workers * self.threads}, "
                    f"{free:g} free now (other actors hold the rest)[/]"
                )
            self.slots = [_Slot(rank) for rank in range(workers)]
            for slot in self.slots:
                slot.actor = self._spawn(self.version)
                slot.version = self.version
            self._await_ready(self.slots)
        except BaseException:
            self.close()
            raise

    # ---- actors ------------------------------------------------------------------------------
    def _spawn(self, version: int):
        if version < self.base_version:
            raise RuntimeError(f"cannot rebuild a worker at version {version}: its base is now version {self.base_version}")
        updates = self.updates[: version - self.base_version]
        return self._actor_class.remote(
            self.factory, self.env_name, self.env_options, self.threads, self.checkpoint, self.base_version, updates
        )

    def _await_ready(self, slots: list[_Slot]) -> None:
        ray = self.ray
        refs = [slot.actor.ready.remote() for slot in slots]
        try:
            ready = ray.get(refs, timeout=self.startup_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"Ray workers did not start within {self.startup_timeout_s:.0f}s: each needs {self.threads} CPU(s); "
                f"cluster resources: {ray.cluster_resources()}, available: {ray.available_resources()}"
            ) from None
        except worker_lost_errors(ray) as e:
            raise RuntimeError(f"a Ray worker died while building its policy replica: {e}") from e
        checks = []
        for slot, (version, fp, pid) in zip(slots, ready):
            slot.pid = pid
            checks.append((slot.name, version, fp))
        self._check(checks)

    def _check(self, checks: list[tuple[str, int, str]]) -> None:
        """Raise a RuntimeError naming every replica whose fingerprint differs from the driver's."""
        bad = [(name, version, fp) for name, version, fp in checks if fp != self._driver_fp.get(version)]
        if bad:
            lines = [f"driver: {self._driver_fp[self.version]} after {self.version} updates"]
            lines += [
                f"{name}: {fp} after {version} updates (driver had {self._driver_fp.get(version, '?')})"
                for name, version, fp in bad
            ]
            raise RuntimeError(
                "weight replicas are out of sync; differing: "
                + ", ".join(name for name, _, _ in bad)
                + "\n  "
                + "\n  ".join(lines)
            )

    def _replace(self, slot: _Slot, version: int, error: BaseException) -> None:
        """A new actor for `slot`, rebuilt at `version` by replay and checked against the driver."""
        if self._restarts_left <= 0:
            raise RuntimeError(
                f"{slot.name} died ({type(error).__name__}) and {self.max_restarts} workers were already "
                f"replaced in this step (dist.max_restarts); giving up"
            ) from error
        self._restarts_left -= 1
        self.restarts += 1
        old = slot.name
        try:
            self.ray.kill(slot.actor)
        except Exception:
            pass
        slot.actor = self._spawn(version)
        slot.version = version
        slot.pending = []
        slot.busy = False
        self._await_ready([slot])
        self.log(
            f"[yellow]{old} died ({type(error).__name__}); replaced by pid {slot.pid}, "
            f"rebuilt by replaying {version - self.base_version} updates (fingerprint matches the driver)[/]"
        )

    def _sync_slot(self, slot: _Slot, version: int) -> None:
        """Queue the updates the slot's actor lacks (they run after whatever it is doing now)."""
        while slot.version < version:
            update = self.updates[slot.version - self.base_version]
            slot.pending.append(slot.actor.apply.remote(update))
            slot.version += 1

    def _poll(self, block: bool) -> None:
        """Check the fingerprints returned by apply() calls (all of them when `block`, else the ready ones)."""
        ray = self.ray
        for slot in self.slots:
            if not slot.pending:
                continue
            if block:
                ready = list(slot.pending)
            else:
                ready, _ = ray.wait(slot.pending, num_returns=len(slot.pending), timeout=0)
            if not ready:
                continue
            ready_set = set(ready)
            slot.pending = [ref for ref in slot.pending if ref not in ready_set]
            try:
                results = ray.get(ready)
            except worker_lost_errors(ray) as e:
                if not slot.busy:  # a busy slot is replaced when its evaluation fails
                    self._replace(slot, slot.version, e)
                continue
            self._check([(slot.name, version, fp) for version, fp in results])

    # ---- jobs (shared by synchronous evaluation and asynchronous ES) -------------------------
    def idle_slots(self) -> list[_Slot]:
        return [slot for slot in self.slots if not slot.busy]

    def submit(self, slot: _Slot, tag: Any, member: Member, version: int, tasks_ref, config, seed: int, keep: int) -> None:
        """Evaluate `member` on `slot` at weights `version` (the slot is first sent the updates it lacks)."""
        self._sync_slot(slot, version)
        if slot.version != version:
            raise RuntimeError(f"{slot.name} holds version {slot.version}, cannot evaluate at {version}")
        ref = slot.actor.evaluate.remote(member, tasks_ref, config, seed, keep)
        slot.busy = True
        self._inflight[ref] = _Job(slot, tag, member, version, (tasks_ref, config, seed, keep))

    def inflight(self) -> int:
        return len(self._inflight)

    def wait(self, timeout: float | None = None) -> list[tuple[Any, int, MemberResult]]:
        """Block until at least one job finishes; (tag, version, result) of every finished job. A job
        whose actor died is evaluated again, at the same version, on a replacement actor."""
        ray = self.ray
        if not self._inflight:
            return []
        refs = list(self._inflight)
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        done = []
        for ref in ready:
            job = self._inflight.pop(ref)
            job.slot.busy = False
            try:
                version, result = ray.get(ref)
            except worker_lost_errors(ray) as e:
                self._replace(job.slot, job.version, e)
                self.submit(job.slot, job.tag, job.member, job.version, *job.args)
                continue
            if version != job.version:
                raise RuntimeError(f"{job.slot.name} evaluated at version {version}, expected {job.version}")
            done.append((job.tag, version, result))
        self._poll(block=False)
        return done

    def reset_restart_budget(self) -> None:
        self._restarts_left = self.max_restarts

    def put(self, value):
        return self.ray.put(value)

    # ---- Evaluator ---------------------------------------------------------------------------
    def evaluate(
        self, members: list[Member], tasks: list[Task], config: RolloutConfig, seed: int, keep_trajectories: int = 0
    ) -> list[MemberResult]:
        if self._inflight:
            raise RuntimeError("evaluate() called while asynchronous evaluations are in flight")
        self.reset_restart_budget()
        tasks_ref = self.put(tasks)
        queue = deque(enumerate(members))
        results: list[MemberResult | None] = [None] * len(members)
        while queue or self._inflight:
            for slot in self.idle_slots():
                if not queue:
                    break
                i, member = queue.popleft()
                self.submit(slot, i, member, self.version, tasks_ref, config, seed, keep_trajectories)
            for i, _, result in self.wait():
                results[i] = result
        return results  # type: ignore[return-value]

    def apply(self, update: Update, verify: bool = True) -> None:
        """Apply on the driver's policy and send to every actor; with `verify`, wait for every actor
        and check its fingerprint (asynchronous ES passes False: busy actors apply it when free)."""
        self.updates.append(update)
        self.policy.apply(update)
        self.version += 1
        self._driver_fp[self.version] = self.policy.fingerprint()
        for slot in self.slots:
            self._sync_slot(slot, self.version)
        if verify:
            self.verify()

    def rebase(self, checkpoint: str, version: int) -> None:
        """Replacement workers start from this checkpoint (taken after `version` updates) from now on."""
        if version != self.version or self._inflight:
            raise RuntimeError(f"rebase at version {version} needs the evaluator idle at that version ({self.version})")
        self.checkpoint, self.base_version, self.updates = str(checkpoint), version, []

    def verify(self) -> None:
        """Wait for every update sent so far and check every replica against the driver."""
        self.reset_restart_budget()
        self._poll(block=True)

    def fingerprints(self) -> list[str]:
        """The driver's fingerprint, then every actor's (after the updates sent to it so far)."""
        self._poll(block=True)
        answers = self.ray.get([slot.actor.fingerprint.remote() for slot in self.slots])
        return [self.policy.fingerprint()] + [fp for _, fp in answers]

    def metrics(self) -> dict[str, float]:
        """Worker-side numbers for metrics.jsonl: replacements so far and the workers' peak RSS."""
        ray = self.ray
        values = {"dist/restarts": float(self.restarts)}
        if self._inflight:  # asynchronous ES: never wait for busy workers; report the last answers
            refs, self._rss_refs = self._rss_refs, [slot.actor.rss_mb.remote() for slot in self.slots]
            if not refs or len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) < len(refs):
                return values
        else:
            refs = [slot.actor.rss_mb.remote() for slot in self.slots]
        try:
            rss = ray.get(refs, timeout=60)
        except (ray.exceptions.GetTimeoutError, *worker_lost_errors(ray)):
            return values  # a worker just died (it is replaced when next used)
        return {**values, "mem/workers_peak_rss_mb": float(sum(rss))}

    def close(self) -> None:
        ray = self.ray
        for slot in self.slots:
            if slot.actor is not None:
                try:
                    ray.kill(slot.actor)
                except Exception:
                    pass
                slot.actor = None
        self._inflight = {}
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
            self._owns_ray = False
