"""Ray evaluation: replicas match the local evaluator bit for bit, survive a dead worker, detect a
desynchronised replica; asynchronous ES with max_lag 0 and M = G is synchronous ES."""

import functools
import json
import os
import sys

import pytest
import torch
from rich.console import Console

from esopt.confutil import ConfigError
from esopt.population import LocalEvaluator, MemberResult
from esopt.population.async_es import AsyncES
from esopt.population.ray_evaluator import require_ray, resolve_threads
from esopt.envs import make_env
from esopt.es import ESConfig, Update, derive_seed, make_strategy, read_history, replay
from esopt.rollout import RolloutConfig
from esopt.train.config import TrainConfig
from esopt.train.es_trainer import ESTrainer, checkpoints

import tiny_models

ENV = "sudoku"
ENV_OPTIONS = {"size": 4, "empty_cells": 2, "grammar": "legal", "partial_credit": True}
STEPS = 4
TASKS = 3
FACTORY = functools.partial(tiny_models.tiny_hf_policy, 0)


def _rollout() -> RolloutConfig:
    config = RolloutConfig(history_turns=0)
    config.sampling.max_new_tokens = 10
    return config


def _strategy():
    # sigma large: a tiny random model needs a big push for its members' greedy replies to differ
    return make_strategy(ESConfig(population=4, sigma=0.05, sigma_final=0.01, alpha=0.05), STEPS, run_seed=0)


def _step_inputs(env, step):
    return env.tasks("train", TASKS, derive_seed(0, "tasks", step)), derive_seed(0, "decode", step)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    # Ray's memory monitor kills workers when the whole machine is nearly full, whoever uses the
    # memory; on a shared CI box that would fail these tests for others' jobs.
    saved = os.environ.get("RAY_memory_monitor_refresh_ms")
    os.environ["RAY_memory_monitor_refresh_ms"] = "0"
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=200 * 1024 * 1024)
    finally:
        if saved is None:
            del os.environ["RAY_memory_monitor_refresh_ms"]
        else:
            os.environ["RAY_memory_monitor_refresh_ms"] = saved
    ray.cloudpickle.register_pickle_by_value(tiny_models)  # workers cannot import the tests folder
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def reference():
    """Per step: fitness, metrics, the update and the fingerprint after it, from the LocalEvaluator."""
    env = make_env(ENV, ENV_OPTIONS)
    evaluator = LocalEvaluator(FACTORY(), env)
    strategy = _strategy()
    steps = []
    for step in range(STEPS):
        members = strategy.ask(step)
        tasks, seed = _step_inputs(env, step)
        results = evaluator.evaluate(members, tasks, _rollout(), seed)
        update = strategy.tell(step, members, [r.fitness for r in results])
        evaluator.apply(update)
        steps.append(
            {"fitness": [r.fitness for r in results], "metrics": [r.metrics for r in results],
             "update": update.to_json(), "fingerprint": evaluator.fingerprints()[0]}
        )
    assert len({f for s in steps for f in s["fitness"]}) > 1, "members should not all tie"
    return steps


@pytest.fixture(scope="class")
def crash_marker(tmp_path_factory):
    """While this file exists, the worker that perturbs member 1 deletes it and exits (CrashOnMarkerPolicy)."""
    return tmp_path_factory.mktemp("faults") / "crash_member_1"


@pytest.fixture(scope="class")
def evaluator(ray_cluster, crash_marker):
    """One 2-worker RayEvaluator shared by the tests of a class, in order (starting actors is the slow
    part); closed after the class, so the cluster's 2 CPUs are free for the trainers' workers. Its
    workers' policies are the tiny model, which exits mid-evaluation when `crash_marker` exists."""
    from esopt.population.ray_evaluator import RayEvaluator

    factory = functools.partial(tiny_models.crash_on_marker_policy, str(crash_marker), 1)
    evaluator = RayEvaluator(FACTORY(), ENV, ENV_OPTIONS, factory, workers=2, threads_per_worker=1)
    yield evaluator
    evaluator.close()


def _run_steps(evaluator, reference, steps, before_step=None):
    """Evaluate `steps` like the reference did (first applying any earlier reference update the
    evaluator lacks) and check every result, update and fingerprint."""
    env = make_env(ENV, ENV_OPTIONS)
    strategy = _strategy()
    for step in range(evaluator.version, steps[0]):
        evaluator.apply(Update.from_json(reference[step]["update"]))
    assert evaluator.version == steps[0]
    for step in steps:
        if before_step:
            before_step(step)
        members = strategy.ask(step)
        tasks, seed = _step_inputs(env, step)
        results = evaluator.evaluate(members, tasks, _rollout(), seed)
        assert [r.index for r in results] == [m.index for m in members]
        assert [r.fitness for r in results] == reference[step]["fitness"]
        assert [r.metrics for r in results] == reference[step]["metrics"]
        update = strategy.tell(step, members, [r.fitness for r in results])
        assert update.to_json() == reference[step]["update"]
        evaluator.apply(update)
        assert evaluator.fingerprints() == [reference[step]["fingerprint"]] * (1 + len(evaluator.slots))


@pytest.mark.ray
class TestRayEvaluator:
    def test_ray_evaluator_matches_local(self, evaluator, reference):
        assert evaluator.threads == 1 and len({s.pid for s in evaluator.slots}) == 2
        _run_steps(evaluator, reference, [0, 1])
        assert evaluator.restarts == 0

    def test_dead_worker_is_replaced_and_the_step_completes(self, ray_cluster, evaluator, reference, crash_marker):
        restarts = evaluator.restarts
        old_pids = {s.pid for s in evaluator.slots}

        def faults(step):
            if step == 2:  # the worker evaluating member 1 exits in the middle of its rollout
                crash_marker.touch()
            if step == 3:  # a worker is already dead when the step starts
                ray_cluster.kill(evaluator.slots[0].actor)

        _run_steps(evaluator, reference, [2, 3], before_step=faults)
        assert not crash_marker.exists()  # the worker evaluating member 1 did exit
        assert evaluator.restarts == restarts + 2
        assert len(old_pids - {s.pid for s in evaluator.slots}) == 2  # both original workers were replaced

    def test_desynchronised_replica_is_named(self, ray_cluster, evaluator, reference):
        stray = Update(step=0, seeds=[123], coefficients=[1.0], alpha=0.01, sigma=0.05, fitness=[0.0])
        # Change worker 1's weights behind the driver's back, without counting a version.
        ray_cluster.get(evaluator.slots[1].actor.__ray_call__.remote(lambda replica, u: replica.policy.apply(u), stray))
        update = Update(step=STEPS, seeds=[7], coefficients=[1.0], alpha=0.01, sigma=0.05, fitness=[0.0])
        with pytest.raises(RuntimeError, match=r"replicas are out of sync; differing: worker 1 \(pid \d+\)\n"):
            evaluator.apply(update)


def _train_config(tmp_path, name, **dist) -> TrainConfig:
    config = TrainConfig()
    config.env.options = dict(ENV_OPTIONS)
    config.es.population = 4
    config.es.sigma = 0.05
    config.es.sigma_final = 0.01
    config.es.alpha = 0.05
    config.rollout = _rollout()
    config.steps = 2
    config.tasks_per_step = TASKS
    config.eval_tasks = 1
    config.eval_every = 0
    config.trajectories_per_step = 1
    config.probe_tasks = 0
    config.runs_dir = str(tmp_path)
    config.run_name = name
    for key, value in dist.items():
        setattr(config.dist, key, value)
    return config


def _train(config):
    policy = FACTORY()
    ESTrainer.start(config, policy=policy, console=Console(quiet=True), policy_factory=FACTORY).run()
    return policy


@pytest.mark.ray
def test_async_with_no_lag_and_full_commits_is_synchronous_es(ray_cluster, tmp_path):
    sync = _train(_train_config(tmp_path, "sync"))
    assert sync.fingerprint() != FACTORY().fingerprint()  # the run moved the weights
    asynchronous = _train(
        _train_config(tmp_path, "async", workers=2, threads_per_worker=1, mode="async", max_lag=0, commit_every=0)
    )
    assert asynchronous.fingerprint() == sync.fingerprint()
    history = read_history(tmp_path / "async" / "history.jsonl")
    assert [u.to_json() for u in history] == [u.to_json() for u in read_history(tmp_path / "sync" / "history.jsonl")]
    rebuilt = replay(FACTORY().master_weights(), history)
    for name, tensor in asynchronous.master_weights().items():
        assert torch.equal(rebuilt[name], tensor), name
    lines = (tmp_path / "async" / "metrics.jsonl").read_text().splitlines()
    metrics = [r for r in map(json.loads, lines) if "async/lag_mean" in r]
    assert len(metrics) == 2 and all(m["async/lag_max"] == 0 for m in metrics)
    assert all(0 <= m["async/discard_rate"] < 1 for m in metrics)


@pytest.mark.ray
def test_resume_with_ray_workers_matches_the_uninterrupted_run(ray_cluster, tmp_path, monkeypatch):
    """A 2-worker run killed while writing its step-2 checkpoint, then resumed: the new workers rebuild
    the weights from the step-1 checkpoint plus a replay of update 2, evaluate step 3, and the run ends
    at the uninterrupted run's weights and history."""

    def config(name):
        config = _train_config(tmp_path, name, workers=2, threads_per_worker=1)
        config.steps, config.checkpoint_every = 3, 1
        return config

    reference = _train(config("ref"))
    assert reference.fingerprint() != FACTORY().fingerprint()  # the run moved the weights

    crashing = FACTORY()
    tiny_models.crash_mid_checkpoint(monkeypatch, crashing, "step_00002")
    with pytest.raises(KeyboardInterrupt):
        ESTrainer.start(config("crash"), policy=crashing, console=Console(quiet=True), policy_factory=FACTORY).run()
    assert len(read_history(tmp_path / "crash" / "history.jsonl")) == 2
    assert [k for k, _ in checkpoints(tmp_path / "crash")] == [1]

    resumed = FACTORY()  # a fresh process starts from the base weights
    ESTrainer.resume(tmp_path / "crash", policy=resumed, console=Console(quiet=True), policy_factory=FACTORY).run()
    assert resumed.fingerprint() == reference.fingerprint()
    history = [u.to_json() for u in read_history(tmp_path / "crash" / "history.jsonl")]
    assert history == [u.to_json() for u in read_history(tmp_path / "ref" / "history.jsonl")]


# ---- without Ray ---------------------------------------------------------------------------------
def test_missing_ray_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r"pip install 'esopt\[ray\]'"):
        require_ray()


def test_thread_limits():
    assert resolve_threads(2, 0, 2) == 1
    assert resolve_threads(1, 0, 2) == 2
    assert resolve_threads(3, 0, 16) == 5
    with pytest.raises(ConfigError, match="3 CPUs, but the Ray cluster has 2"):
        resolve_threads(3, 0, 2)
    with pytest.raises(ConfigError, match="dist.workers"):
        resolve_threads(0, 0, 2)


def test_dist_config_is_validated(tmp_path):
    config = _train_config(tmp_path, "bad", mode="async")
    with pytest.raises(ConfigError, match="needs dist.workers >= 1"):
        config.validate()
    config = _train_config(tmp_path, "bad", mode="both")
    with pytest.raises(ConfigError, match="dist.mode"):
        config.validate()
    config = _train_config(tmp_path, "bad", workers=-1)
    with pytest.raises(ConfigError, match="dist.workers"):
        config.validate()
    config = _train_config(tmp_path, "bad", workers=2, mode="async", max_lag=1)
    config.es.strategy = "copes"
    with pytest.raises(ConfigError, match="max_lag 0"):
        config.validate()
    assert _train_config(tmp_path, "ok").commit_every == 4


class _FakeSlot:
    def __init__(self, rank):
        self.rank, self.busy = rank, False


class _FakeEvaluator:
    """The job interface AsyncES uses, without Ray, on a simulated clock: a job takes 1-4 ticks
    (from its member's seed), so results arrive out of dispatch order; a member's fitness is a
    function of its seed and the weights version it was evaluated at."""

    def __init__(self, workers):
        self.version, self.slots, self.jobs, self.updates = 0, [_FakeSlot(r) for r in range(workers)], [], []
        self.now = 0

    def idle_slots(self):
        return [s for s in self.slots if not s.busy]

    def submit(self, slot, tag, member, version, tasks_ref, config, seed, keep):
        assert version == self.version
        slot.busy = True
        self.jobs.append((self.now + 1 + member.seed % 4, tag, slot, member, version))

    def wait(self, timeout=None):
        job = min(self.jobs, key=lambda j: j[:2])
        self.jobs.remove(job)
        self.now, tag, slot, member, version = job
        slot.busy = False
        fitness = (member.seed % 1000) / 1000 + version
        return [(tag, version, MemberResult(index=member.index, fitness=fitness, metrics={}))]

    def inflight(self):
        return len(self.jobs)

    def put(self, value):
        return value

    def reset_restart_budget(self):
        pass

    def apply(self, update, verify=True):
        self.updates.append(update)
        self.version += 1


def _async_run(workers, max_lag, commit_every, steps=4):
    evaluator = _FakeEvaluator(workers)
    strategy = _strategy()
    engine = AsyncES(evaluator, strategy, lambda v: ([], v), _rollout(), max_lag, commit_every)
    commits = []
    for step in range(steps):
        commit = engine.next_update(step)
        evaluator.apply(commit.update)
        commits.append(commit)
    return strategy, engine, commits


def test_async_lag_and_discards_without_ray():
    strategy, engine, commits = _async_run(workers=4, max_lag=1, commit_every=2, steps=6)
    lags = [lag for c in commits for lag in c.lags]
    assert max(lags) == 1 and 0 in lags  # stale-by-one results are used, fresher ones too
    assert sum(c.metrics["async/discarded"] for c in commits) > 0  # older ones are dropped
    for c in commits:
        assert len(c.update.seeds) == 2 and c.metrics["async/lag_max"] <= 1
        assert c.metrics["async/discard_rate"] == c.metrics["async/discarded"] / c.metrics["async/evaluated"]
        # each fitness was measured at the version its lag says
        step = c.update.step
        assert c.update.fitness == pytest.approx([(m.seed % 1000) / 1000 + step - lag for m, lag in zip(c.members, c.lags)])
    assert engine.evaluated == sum(c.metrics["async/evaluated"] for c in commits)


def test_async_without_lag_commits_the_synchronous_populations():
    strategy, _, commits = _async_run(workers=3, max_lag=0, commit_every=4)
    for step, c in enumerate(commits):
        members = strategy.ask(step)
        assert c.members == members and c.lags == [0] * 4
        assert c.update.to_json() == strategy.tell(step, members, [(m.seed % 1000) / 1000 + step for m in members]).to_json()
    assert sum(c.metrics["async/discarded"] for c in commits) > 0  # workers kept busy past G, results dropped
