"""CoPES: members split evenly into subspaces and move only theirs; the trainer runs it and replays it (the
noise x strategy contract is in test_es_contract.py)."""

import math

import pytest
import torch

from esopt.confutil import ConfigError
from esopt.es import ESConfig, make_strategy, perturb_tensor, read_history, replay, subspace_mask

from tiny_models import weights_moved


def _copes(population=8, subspaces=4, **kw):
    return make_strategy(ESConfig(strategy="copes", population=population, subspaces=subspaces, **kw), total_steps=3, run_seed=11)


def test_members_are_split_evenly_with_scaled_sigma():
    strategy = _copes()
    members = strategy.ask(0)
    assert [m.subspace for m in members] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(m.sigma == pytest.approx(strategy.sigma(0) * math.sqrt(4)) for m in members)
    assert len({m.partition for m in members}) == 1
    assert strategy.ask(1)[0].partition != members[0].partition  # fresh partition every step


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
        mask = member.partition.mask("layer.weight", base.shape, member.subspace)
        assert not moved[~mask].any()
        assert moved[mask].float().mean() > 0.99


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
    assert weights_moved(base, policy.master_weights())
    rebuilt = replay(base, read_history(tmp_path / "copes" / "history.jsonl"))
    assert all(torch.equal(rebuilt[n], t) for n, t in policy.master_weights().items())
