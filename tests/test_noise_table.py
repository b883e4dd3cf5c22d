"""Shared noise table (es.noise=table): slices of one N(0,1) table instead of fresh per-member normals."""

from __future__ import annotations

import json

import pytest
import torch

from esopt.confutil import ConfigError
from esopt.es import (
    ESConfig,
    Member,
    Update,
    make_strategy,
    perturb_tensor,
    read_history,
    replay,
    table_noise,
    update_direction,
)
from esopt.es import Partition, TableNoise
from esopt.es.noise import full as full_noise
from esopt.es.noise import table as noise_mod

from tiny_models import weights_moved

SIZE = 1 << 16


def _member(index=0, seed=1, sigma=0.05, sign=1, **kw):
    return Member(index=index, seed=seed, sigma=sigma, sign=sign, noise=TableNoise(SIZE), **kw)


def test_table_is_gaussian_fixed_and_independent_of_chunking(monkeypatch):
    table = noise_mod.noise_table(SIZE).clone()
    assert table.dtype == torch.float32 and table.shape == (SIZE,)
    assert abs(table.double().mean().item()) < 0.02 and abs(table.double().std().item() - 1.0) < 0.02
    noise_mod._build_table.cache_clear()
    monkeypatch.setattr(full_noise, "CHUNK_NUMEL", 100)  # the per-member streams' tunable must not change the table
    assert torch.equal(noise_mod.noise_table(SIZE), table)


def test_table_noise_is_a_slice_at_a_hashed_offset():
    table = noise_mod.noise_table(SIZE)
    eps = table_noise(3, "w", (40, 30), SIZE)
    assert eps.shape == (40, 30)
    offset = (eps.data_ptr() - table.data_ptr()) // 4
    assert torch.equal(eps.flatten(), table[offset : offset + 1200])
    assert torch.equal(eps, table_noise(3, "w", (40, 30), SIZE))
    others = [table_noise(4, "w", (40, 30), SIZE), table_noise(3, "v", (40, 30), SIZE)]
    for other in others:
        assert not torch.equal(other, eps)
    # Different offsets give uncorrelated vectors, like independent draws.
    corr = torch.corrcoef(torch.stack([eps.flatten(), *[o.flatten() for o in others]]))
    assert corr[0, 1].abs() < 0.15 and corr[0, 2].abs() < 0.15
    with pytest.raises(ValueError, match="raise es.table_size"):
        table_noise(3, "huge", (SIZE + 1,), SIZE)


def test_perturb_and_update_read_the_table_without_changing_it():
    base = torch.randn(40, 30)
    table = noise_mod.noise_table(SIZE).clone()
    out = torch.empty_like(base)
    perturb_tensor("w", base, _member(seed=3, sign=-1, sigma=0.1), out)
    assert torch.equal(out, torch.add(base, table_noise(3, "w", base.shape, SIZE), alpha=-0.1))
    # CoPES masks the slice out of place: the shared table is read-only.
    copes = _member(seed=3, partition=Partition(9, 2), subspace=1)
    perturb_tensor("w", base, copes, out)
    moved = out != base
    assert 0.3 < moved.float().mean().item() < 0.7
    update = Update(step=0, seeds=[3, 5, 3], coefficients=[1.0, -2.0, 0.5], alpha=1.0, sigma=0.1, fitness=[0, 0, 0],
                    noise=TableNoise(SIZE))
    expected = 1.5 * table_noise(3, "w", (40, 30), SIZE) - 2.0 * table_noise(5, "w", (40, 30), SIZE)
    assert torch.allclose(update_direction(update, "w", (40, 30)), expected, atol=1e-6)
    assert torch.equal(noise_mod.noise_table(SIZE), table)


def test_config_members_and_history_carry_the_table():
    with pytest.raises(ConfigError, match="table_size"):
        ESConfig(noise="table", table_size=0).validate()
    strategy = make_strategy(ESConfig(noise="table", table_size=SIZE, population=4, antithetic=True), 2, 0)
    members = strategy.ask(0)
    assert all(m.noise == TableNoise(SIZE) for m in members)
    update = strategy.tell(0, members, [1.0, 0.0, 2.0, 3.0])
    record = json.loads(json.dumps(update.to_json()))
    assert record["noise"] == {"kind": "table", "size": SIZE}
    assert Update.from_json(record) == update


def test_trainer_with_table_noise_replays_and_checks_the_table_size(tmp_path, make_tiny_policy, tiny_train_config):
    from rich.console import Console

    from esopt.train.es_trainer import ESTrainer

    size = 1 << 22  # the tiny model's embedding has 3.1M entries
    config = tiny_train_config(tmp_path, "table", steps=2, tasks_per_step=2, eval_tasks=1, eval_every=0)
    config.es.noise, config.es.table_size = "table", size
    policy = make_tiny_policy()
    assert max(t.numel() for t in policy.master_weights().values()) <= size
    base = {n: t.clone() for n, t in policy.master_weights().items()}
    ESTrainer.start(config, policy=policy, console=Console(quiet=True)).run()
    history = read_history(tmp_path / "table" / "history.jsonl")
    assert [u.noise for u in history] == [TableNoise(size)] * 2
    assert weights_moved(base, policy.master_weights()) and any(c != 0.0 for u in history for c in u.coefficients)
    rebuilt = replay(base, history)
    assert all(torch.equal(rebuilt[n], t) for n, t in policy.master_weights().items())

    config.es.table_size, config.run_name = 8, "too_small"
    with pytest.raises(ConfigError, match="largest tensor"):
        ESTrainer.start(config, policy=make_tiny_policy(), console=Console(quiet=True))


def test_nested_parallel_loops_do_not_deadlock(monkeypatch):
    # The table is built lazily from inside the per-tensor pool (perturbing a tensor); a nested
    # for_each_tensor must not wait on the pool it runs in.
    from esopt.es.parallel import for_each_tensor

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    done = []
    for_each_tensor(lambda i: for_each_tensor(lambda j: done.append((i, j)), range(3)), range(4))
    assert sorted(done) == [(i, j) for i in range(4) for j in range(3)]
