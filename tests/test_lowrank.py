"""Low-rank (EGGROLL) noise: factor math, updates, replay, and the population-batched forward of the HF
policy against materialised member weights."""

from __future__ import annotations

import json
import math

import pytest
import torch

from esopt.confutil import ConfigError
from esopt.es import (
    ESConfig,
    FullNoise,
    LowRankNoise,
    Member,
    Update,
    apply_update,
    lowrank_direction,
    lowrank_factors,
    lowrank_perturbation,
    make_strategy,
    perturb_tensor,
    read_history,
    replay,
    stacked_factors,
    tensor_noise,
    update_direction,
)
from esopt.policy.base import SamplingConfig

from tiny_models import weights_moved


def _lowrank(index=0, seed=1, sigma=0.05, sign=1, rank=2, vectors="frozen"):
    return Member(index=index, seed=seed, sigma=sigma, sign=sign, noise=LowRankNoise(rank, vectors))


# ---------------------------------------------------------------- factor math


def test_factors_deterministic_distinct_and_nested():
    a, b = lowrank_factors(7, "w", (30, 20), 3)
    assert a.shape == (30, 3) and b.shape == (20, 3) and a.dtype == b.dtype == torch.float32
    a2, b2 = lowrank_factors(7, "w", (30, 20), 3)
    assert torch.equal(a, a2) and torch.equal(b, b2)
    assert not torch.equal(a, lowrank_factors(8, "w", (30, 20), 3)[0])
    assert not torch.equal(a, lowrank_factors(7, "v", (30, 20), 3)[0])
    a1, b1 = lowrank_factors(7, "w", (30, 20), 1)
    assert torch.equal(a1, a[:, :1]) and torch.equal(b1, b[:, :1])  # rank r is a prefix of rank r+1
    sa, sb = stacked_factors([7, 9], "w", (30, 20), 3)
    assert torch.equal(sa[:, :3], a) and torch.equal(sb[:, 3:], lowrank_factors(9, "w", (30, 20), 3)[1])
    with pytest.raises(ValueError, match="2-D"):
        lowrank_factors(1, "b", (5,), 1)
    with pytest.raises(ValueError, match="rank"):
        lowrank_factors(1, "w", (5, 4), 0)


@pytest.mark.parametrize("rank", [1, 4])
def test_perturbation_is_low_rank_with_unit_variance(rank):
    eps = lowrank_perturbation(3, "w", (64, 48), rank)
    a, b = lowrank_factors(3, "w", (64, 48), rank)
    torch.testing.assert_close(eps, a @ b.T / math.sqrt(rank))
    assert torch.linalg.matrix_rank(eps).item() == rank
    # Entry variance is 1 in expectation over seeds (the 1/sqrt(r) scaling of EGGROLL).
    var = torch.stack([lowrank_perturbation(s, "w", (64, 48), rank) for s in range(200)]).var(dim=0).mean()
    assert abs(var.item() - 1.0) < 0.1


def test_perturb_tensor_dispatches_on_noise():
    base_w, base_b = torch.randn(12, 8), torch.randn(8)
    out_w, out_b = torch.empty(12, 8), torch.empty(8)
    m = _lowrank(seed=5, sigma=0.1, sign=-1, rank=2)
    perturb_tensor("w", base_w, m, out_w)
    torch.testing.assert_close(out_w, base_w - 0.1 * lowrank_perturbation(5, "w", (12, 8), 2))
    perturb_tensor("b", base_b, m, out_b)
    assert torch.equal(out_b, base_b)  # frozen vectors
    perturb_tensor("b", base_b, _lowrank(seed=5, sigma=0.1, sign=-1, vectors="full"), out_b)
    assert torch.equal(out_b, torch.add(base_b, tensor_noise(5, "b", (8,)), alpha=-0.1))


def test_lowrank_update_equals_naive_sum():
    seeds, coefs, rank = [11, 12, 11, 13], [0.5, -2.0, 0.25, 1.5], 3  # seed 11 twice: merged like antithetic pairs
    up = Update(0, seeds, coefs, 0.2, 1e-2, [0.0] * 4, noise=LowRankNoise(rank))
    naive = torch.zeros(40, 30, dtype=torch.float64)
    for s, c in zip(seeds, coefs):
        a, b = lowrank_factors(s, "w", (40, 30), rank)
        naive += c * (a.double() @ b.double().T) / math.sqrt(rank)
    torch.testing.assert_close(update_direction(up, "w", (40, 30)).double(), naive, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        lowrank_direction(list(zip(seeds, coefs)), "w", (40, 30), rank).double(), naive, rtol=1e-5, atol=1e-5
    )
    tensors = {"w": torch.randn(40, 30), "norm": torch.randn(30)}
    before = {k: v.clone() for k, v in tensors.items()}
    apply_update(tensors, up)
    torch.testing.assert_close(tensors["w"].double(), before["w"].double() + 0.2 / 4 * naive, rtol=1e-5, atol=1e-5)
    assert torch.equal(tensors["norm"], before["norm"])  # frozen: not even touched
    full = Update(0, seeds, coefs, 0.2, 1e-2, [0.0] * 4, noise=LowRankNoise(rank, "full"))
    expected = sum(c * tensor_noise(s, "norm", (30,)) for s, c in zip(seeds, coefs))
    torch.testing.assert_close(update_direction(full, "norm", (30,)), expected)


def test_update_matmul_is_thread_count_invariant():
    # Replay must be bit-exact however many threads the replaying process uses; the update is a BLAS
    # matmul, so check that its result does not depend on the thread count here.
    pairs = [(s, (-1) ** s * 0.37 * s) for s in range(1, 17)]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(max(2, threads))
        many = lowrank_direction(pairs, "w", (1024, 384), 2)
        torch.set_num_threads(1)
        one = lowrank_direction(pairs, "w", (1024, 384), 2)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(many, one)


def test_config_validation_and_strategy_members():
    for kwargs, field in [
        ({"noise": "sparse"}, "es.noise"),
        ({"noise": "lowrank", "rank": 0}, "es.rank"),
        ({"noise": "lowrank", "lowrank_vectors": "half"}, "es.lowrank_vectors"),
        ({"noise": "lowrank", "strategy": "copes", "population": 8}, "copes"),
    ]:
        with pytest.raises(ConfigError, match=field):
            ESConfig(**kwargs).validate()
    st = make_strategy(ESConfig(noise="lowrank", rank=2, population=4, antithetic=True), total_steps=3, run_seed=1)
    members = st.ask(0)
    assert all(m.noise == LowRankNoise(2, "frozen") for m in members)
    assert [m.sign for m in members] == [1, -1, 1, -1]
    up = st.tell(0, members, [1.0, 0.0, 2.0, 2.0])
    assert up.noise == LowRankNoise(2, "frozen")
    back = Update.from_json(json.loads(json.dumps(up.to_json())))
    assert back == up
    # Full-rank records are unchanged (no new keys), old records read as full-rank.
    full = make_strategy(ESConfig(population=2), total_steps=1, run_seed=0)
    record = full.tell(0, full.ask(0), [0.0, 1.0]).to_json()
    assert "noise" not in record and Update.from_json(record).noise == FullNoise()


# ---------------------------------------------------------------- population-batched forward (HF policy)


def _prompts(tokenizer, texts):
    return tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_forward_matches_materialised_weights(make_tiny_policy, dtype):
    policy = make_tiny_policy(dtype=dtype)
    model = policy.model
    a, b, c = _lowrank(0, seed=101, sigma=0.05), _lowrank(1, seed=102, sigma=0.08), _lowrank(2, seed=103, sigma=0.05)
    anti = _lowrank(3, seed=101, sigma=0.05, sign=-1)  # shares factors with `a`
    rows = [a, b, None, c, anti, b]
    texts = ["hello", "a much longer prompt with quite a few more tokens in it", "x y", "sudoku 4x4", "hello", "?"]
    enc = _prompts(policy.tokenizer, texts)
    assert (enc["attention_mask"] == 0).any()  # some rows are left-padded
    fingerprint = policy.fingerprint()
    with torch.no_grad():
        with policy.population([a, b, c, anti]), policy._member_rows(rows):
            batched = model(**enc).logits.float()
        base = model(**enc).logits.float()
        for j, member in enumerate(rows):
            if member is None:
                reference = base[j]
            else:
                with policy.perturbed(member):
                    reference = model(**enc).logits[j].float()
            mask = enc["attention_mask"][j].bool()
            tol = 1e-4 if dtype == torch.float32 else 0.25  # bf16: the materialised weights are rounded
            torch.testing.assert_close(batched[j][mask], reference[mask], rtol=0, atol=tol)
            if member is not None:
                assert (batched[j][mask] - base[j][mask]).abs().max() > 10 * tol  # the perturbation is visible
    assert policy.fingerprint() == fingerprint and not policy.model._forward_hooks
    assert all(not m._forward_hooks for m in policy.model.modules())  # hooks removed on exit


def test_generate_with_members_matches_sequential(make_tiny_policy):
    policy = make_tiny_policy()
    members = [_lowrank(i, seed=200 + i, sigma=0.1, rank=2) for i in range(3)]
    chats = [[{"role": "system", "content": "Play."}, {"role": "user", "content": f"Board {i} " * (i + 1)}] for i in range(2)]
    sampling = SamplingConfig(max_new_tokens=12)
    sequential = []
    for m in members:
        with policy.perturbed(m):
            sequential += policy.generate(chats, sampling)
    base = policy.generate(chats, sampling)
    rows = [m for m in members for _ in chats]
    batched = policy.generate(chats * 3, sampling, members=rows)  # factors built on the fly
    assert batched == sequential
    policy.max_batch_size = 4  # split calls keep each row's member
    with policy.population(members):
        assert policy.generate(chats * 3 + chats, sampling, members=rows + [None, None]) == sequential + base
    assert len(set(sequential)) > 1  # members actually differ


def test_population_support_and_errors(make_tiny_policy):
    policy = make_tiny_policy()
    chats = [[{"role": "user", "content": "hi"}]]
    full = Member(index=0, seed=1, sigma=0.1)
    assert policy.supports_population([_lowrank()])
    assert not policy.supports_population([full])
    assert not policy.supports_population([_lowrank(vectors="full")])  # norm weights cannot be batched
    assert not policy.supports_population([_lowrank(rank=1), _lowrank(rank=2)])
    with pytest.raises(ValueError, match="low-rank"):
        policy.generate(chats, SamplingConfig(max_new_tokens=2), members=[full])
    with pytest.raises(ValueError, match="lowrank_vectors"):
        policy.generate(chats, SamplingConfig(max_new_tokens=2), members=[_lowrank(vectors="full")])
    with pytest.raises(ValueError, match="members"):
        policy.generate(chats, SamplingConfig(max_new_tokens=2), members=[None, None])
    assert policy.generate(chats, SamplingConfig(max_new_tokens=4), members=[None]) == policy.generate(
        chats, SamplingConfig(max_new_tokens=4)
    )


# ---------------------------------------------------------------- evaluator: batched == sequential


def _sudoku_setup():
    from esopt.envs import make_env
    from esopt.rollout import RolloutConfig

    env = make_env("sudoku", {"size": 4, "empty_cells": 3, "grammar": "format"})
    config = RolloutConfig(history_turns=0, sampling=SamplingConfig(max_new_tokens=10))
    return env, env.tasks("train", 3, 0), config


def test_batched_rollout_fitness_equals_sequential(make_tiny_policy):
    from esopt.population.local import LocalEvaluator

    env, tasks, config = _sudoku_setup()
    policy = make_tiny_policy()
    st = make_strategy(ESConfig(noise="lowrank", rank=1, population=4, antithetic=True, sigma=0.2), total_steps=1, run_seed=9)
    members = st.ask(0)
    batched_eval = LocalEvaluator(policy, env)
    sequential_eval = LocalEvaluator(policy, env, population_batching=False)
    assert batched_eval.batched(members) and not sequential_eval.batched(members)
    batched = batched_eval.evaluate(members, tasks, config, seed=5, keep_trajectories=3)
    sequential = sequential_eval.evaluate(members, tasks, config, seed=5, keep_trajectories=3)
    assert [r.index for r in batched] == [m.index for m in members]
    for got, want in zip(batched, sequential):
        assert got.fitness == pytest.approx(want.fitness)
        assert got.metrics == pytest.approx(want.metrics)
        assert [t["actions"] for t in got.trajectories] == [t["actions"] for t in want.trajectories]
    actions = {json.dumps([t["actions"] for t in r.trajectories]) for r in sequential}
    assert len(actions) > 1  # members behave differently, so the split back per member is tested
    # Full-rank members always take the sequential path.
    assert not batched_eval.batched(make_strategy(ESConfig(population=2), total_steps=1, run_seed=0).ask(0))


def test_trainer_runs_lowrank_and_replays(tmp_path, make_tiny_policy, monkeypatch, tiny_train_config):
    from rich.console import Console

    from esopt.population.local import LocalEvaluator

    from esopt.train.es_trainer import ESTrainer

    config = tiny_train_config(tmp_path, "lowrank", steps=2, tasks_per_step=2, eval_tasks=1, eval_every=0)
    config.es.noise, config.es.rank = "lowrank", 2
    policy = make_tiny_policy()
    base = {n: t.clone() for n, t in policy.master_weights().items()}
    trainer = ESTrainer.start(config, policy=policy, console=Console(quiet=True))
    batched_calls = []
    original = LocalEvaluator.evaluate

    def spy(self, members, *args, **kwargs):
        batched_calls.append(self.batched(members))
        return original(self, members, *args, **kwargs)

    monkeypatch.setattr(LocalEvaluator, "evaluate", spy)
    trainer.run()
    assert batched_calls == [True, True]  # the trainer's evaluator took the population-batched path
    history = read_history(tmp_path / "lowrank" / "history.jsonl")
    assert all(u.noise == LowRankNoise(2) for u in history)
    assert weights_moved(base, policy.master_weights())
    rebuilt = replay(base, history)
    assert all(torch.equal(rebuilt[n], t) for n, t in policy.master_weights().items())
