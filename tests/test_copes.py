"""CoPES: members move only their subspace, partitions replay from history, updates stay bit-exact."""

import math

import pytest
import torch

from esopt.confutil import ConfigError
from esopt.es import ESConfig, HistoryWriter, Strategy, apply_update, perturb_tensor, read_history, replay, subspace_mask


def _copes(population=8, subspaces=4, **kw):
    return Strategy(ESConfig(strategy="copes", population=population, subspaces=subspaces, **kw), total_steps=3, run_seed=11)


def test_members_are_split_evenly_with_scaled_sigma():
    strategy = _copes()
    members = strategy.ask(0)
    assert [m.subspace for m in members] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(m.sigma == pytest.approx(strategy.sigma(0) * math.sqrt(4)) for m in members)
    assert len({m.partition_seed for m in members}) == 1
    assert strategy.ask(1)[0].partition_seed != members[0].partition_seed  # fresh partition every step


def test_partition_is_disjoint_and_complete():
    masks = [subspace_mask(5, "w", (64, 32), k, 4) for k in range(4)]
    total = torch.stack(masks).sum(0)
    assert torch.equal(total, torch.ones(64, 32, dtype=total.dtype))
    assert all(0.15 < m.float().mean() < 0.35 for m in masks)


def test_member_moves_only_its_subspace():
    base = torch.randn(50, 40)
    for member in _copes().ask(0):
        out = torch.empty_like(base)
        perturb_tensor("layer.weight", base, member, out)
        moved = out != base
        mask = subspace_mask(member.partition_seed, "layer.weight", base.shape, member.subspace, member.subspaces)
        assert not moved[~mask].any()
        assert moved[mask].float().mean() > 0.99


def test_copes_updates_replay_bit_exactly(tmp_path):
    strategy = _copes(population=4, subspaces=2, alpha=0.1)
    base = {"a": torch.randn(30, 20), "b": torch.randn(7)}
    live = {k: v.clone() for k, v in base.items()}
    with HistoryWriter(tmp_path / "history.jsonl") as history:
        for step in range(3):
            members = strategy.ask(step)
            update = strategy.tell(step, members, [1.0, 0.0, 0.0, 0.0])  # only subspace 0 is rewarded
            before = {k: v.clone() for k, v in live.items()}
            apply_update(live, update)
            history.append(update)
            for name, tensor in live.items():
                assert (tensor != before[name]).any()
    updates = read_history(tmp_path / "history.jsonl")
    assert updates[0].member_subspaces == [0, 0, 1, 1] and updates[0].subspaces == 2
    rebuilt = replay(base, updates)
    for name in base:
        assert torch.equal(rebuilt[name], live[name])


def test_copes_follows_the_gradient():
    dim = 200
    gen = torch.Generator().manual_seed(0)
    theta0, target = torch.randn(dim, generator=gen), torch.randn(dim, generator=gen)
    strategy = Strategy(ESConfig(strategy="copes", population=2000, subspaces=4, sigma=0.05, sigma_final=0.05, alpha=0.01), 1, 7)
    params = {"theta": theta0.clone()}
    members = strategy.ask(0)
    buf = torch.empty(dim)
    fitness = []
    for member in members:
        perturb_tensor("theta", params["theta"], member, buf)
        fitness.append(-float(((buf - target) ** 2).sum()))
    apply_update(params, strategy.tell(0, members, fitness))
    cos = torch.nn.functional.cosine_similarity(params["theta"] - theta0, target - theta0, dim=0).item()
    assert cos > 0.9


def test_population_must_split_into_subspaces():
    with pytest.raises(ConfigError, match="es.subspaces"):
        ESConfig(strategy="copes", population=6, subspaces=4).validate()


def test_trainer_runs_copes_and_replays(tmp_path, make_tiny_policy, tiny_train_config):
    from rich.console import Console

    from esopt.train.es_trainer import ESTrainer

    config = tiny_train_config(tmp_path, "copes", steps=2, eval_tasks=2, eval_every=0)
    config.env.options = {"size": 4, "empty_cells": 1, "grammar": "legal"}
    config.es.strategy, config.es.subspaces = "copes", 2
    policy = make_tiny_policy()
    base = {n: t.clone() for n, t in policy.master_weights().items()}
    ESTrainer.start(config, policy=policy, console=Console(quiet=True)).run()
    rebuilt = replay(base, read_history(tmp_path / "copes" / "history.jsonl"))
    assert all(torch.equal(rebuilt[n], t) for n, t in policy.master_weights().items())
