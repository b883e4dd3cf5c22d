"""The ES options beyond plain SGD on all weights: es.optimizer (momentum, adam), es.weight_decay toward the
base weights and es.scope; their state survives resume and replays bit-exactly."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from rich.console import Console

from esopt.confutil import ConfigError
from esopt.es import (
    SGD,
    Adam,
    ESConfig,
    LowRankNoise,
    Member,
    Momentum,
    OptimizerState,
    Scope,
    Update,
    apply_update,
    make_strategy,
    read_history,
    replay,
    update_direction,
)

SEEDS, COEFFICIENTS = [11, 12, 13, 14], [1.0, -0.5, 0.25, -0.75]


def _update(step, optimizer, coefficients=COEFFICIENTS, alpha=0.1):
    return Update(step, SEEDS, list(coefficients), alpha, 0.01, [0.0] * 4, optimizer=optimizer)


def _gradient(update, tensors):
    """g = 1/G * sum_i c_i eps_i per tensor, in float64."""
    return {n: update_direction(update, n, t.shape).double() / len(update.seeds) for n, t in tensors.items()}


def _tensors():
    gen = torch.Generator().manual_seed(3)
    return {"w": torch.randn(12, 8, generator=gen), "b": torch.randn(8, generator=gen)}


# ---------------------------------------------------------------- optimizers


def test_momentum_steps_along_the_decayed_sum_of_estimates():
    tensors, state = _tensors(), OptimizerState()
    start = {n: t.double() for n, t in tensors.items()}
    first, second = _update(0, Momentum(beta=0.8)), _update(1, Momentum(beta=0.8), coefficients=[0.3, 0.9, -1.0, 0.1])
    apply_update(tensors, first, state)
    apply_update(tensors, second, state)
    g0, g1 = _gradient(first, tensors), _gradient(second, tensors)
    for n, t in tensors.items():
        expected = start[n] + 0.1 * g0[n] + 0.1 * (0.8 * g0[n] + g1[n])
        torch.testing.assert_close(t.double(), expected, rtol=0, atol=1e-6)
    assert state.steps == 2 and set(state.tensors) == {"velocity/w", "velocity/b"}


def test_adam_first_step_moves_every_weight_by_alpha_along_the_sign():
    tensors, state = _tensors(), OptimizerState()
    start = {n: t.clone() for n, t in tensors.items()}
    update = _update(0, Adam(), alpha=1e-3)
    apply_update(tensors, update, state)
    for n, g in _gradient(update, tensors).items():
        delta = (tensors[n] - start[n]).double()
        assert torch.equal(torch.sign(delta), torch.sign(g))
        torch.testing.assert_close(delta.abs(), torch.full_like(delta, 1e-3), rtol=1e-4, atol=0)  # sign-SGD


def test_weight_decay_pulls_toward_the_base_weights():
    tensors, state = _tensors(), OptimizerState()
    base = {n: t.clone() for n, t in tensors.items()}
    apply_update(tensors, _update(0, SGD(weight_decay=2.0)), state)  # moves away from the base
    away = {n: t.clone() for n, t in tensors.items()}
    assert all(not torch.equal(away[n], base[n]) for n in base)
    apply_update(tensors, _update(1, SGD(weight_decay=2.0), coefficients=[0.0] * 4), state)  # no signal: only the pull
    for n in base:
        # theta -= alpha * wd * (theta - base): 1 - 0.1 * 2.0 of the distance remains
        torch.testing.assert_close(tensors[n] - base[n], 0.8 * (away[n] - base[n]), rtol=1e-5, atol=1e-6)
    assert torch.equal(state.tensors["base/w"], base["w"])


def test_weight_decay_without_its_base_is_an_error():
    with pytest.raises(ValueError, match="base weights"):
        apply_update(_tensors(), _update(3, SGD(weight_decay=0.1)), OptimizerState())
    with pytest.raises(ValueError, match="OptimizerState"):
        apply_update(_tensors(), _update(0, Momentum()))


def test_plain_sgd_records_keep_their_format_and_other_optimizers_round_trip():
    plain = _update(0, SGD()).to_json()
    assert "optimizer" not in plain and "scope" not in plain and "noise" not in plain
    for optimizer in (Momentum(beta=0.5, weight_decay=0.01), Adam(beta1=0.8, eps=1e-6), SGD(weight_decay=0.2)):
        update = _update(0, optimizer)
        assert Update.from_json(update.to_json()) == update


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"optimizer": "lion"}, "es.optimizer"),
        ({"optimizer": "momentum", "momentum": 1.0}, "es.momentum"),
        ({"optimizer": "adam", "adam_beta2": -0.1}, "es.adam_beta2"),
        ({"optimizer": "adam", "adam_eps": 0.0}, "es.adam_eps"),
        ({"weight_decay": -1.0}, "es.weight_decay"),
        ({"weight_decay": 10.0, "alpha": 0.5}, "es.weight_decay"),
        ({"scope": "embeddings"}, "es.scope"),
        ({"scope": "last:0"}, "es.scope"),
        ({"scope": "last:x"}, "es.scope"),
    ],
)
def test_bad_option_values_are_config_errors(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        ESConfig(**kwargs).validate()


def test_cli_reports_a_bad_option_in_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "esopt.cli", "train", "--es.optimizer", "foo"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "es.optimizer" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------- scope

SCOPE_SIZES = {"all": 20, "all-but-embeddings": 19, "linear": 14, "attention": 8, "mlp": 6, "last:1": 9}


@pytest.mark.parametrize("scope", SCOPE_SIZES)
def test_scope_moves_only_its_tensors(scope, make_tiny_policy):
    policy = make_tiny_policy()
    names = Scope(scope).select(policy.master_weights())
    assert len(names) == SCOPE_SIZES[scope]
    if scope == "attention":
        assert all(".self_attn." in n for n in names)
    if scope == "last:1":
        assert all(n.startswith("model.layers.1.") for n in names)
    base = {n: t.clone() for n, t in policy.master_weights().items()}
    strategy = make_strategy(ESConfig(population=4, sigma=0.05, alpha=0.05, scope=scope, optimizer="momentum"), 2, 0)
    history = []
    for step in range(2):
        members = strategy.ask(step)
        with policy.perturbed(members[0]):
            params = dict(policy.model.named_parameters())
            changed = {n for n, t in policy.master_weights().items() if not torch.equal(params[n], t)}
        assert changed == set(names)
        update = strategy.tell(step, members, [0.0, 1.0, 3.0, 2.0])
        policy.apply(update)
        history.append(update)
    moved = {n for n, t in policy.master_weights().items() if not torch.equal(t, base[n])}
    assert moved == set(names)  # inside: moved; outside: bit-identical to the base
    params = dict(policy.model.named_parameters())
    assert all(torch.equal(params[n], t) for n, t in policy.master_weights().items())
    rebuilt = replay(base, [Update.from_json(u.to_json()) for u in history])  # the scope travels in the record
    assert all(torch.equal(rebuilt[n], t) for n, t in policy.master_weights().items())


def test_population_batching_hooks_only_the_scope(make_tiny_policy):
    policy = make_tiny_policy()
    members = [
        Member(index=i, seed=50 + i, sigma=0.1, noise=LowRankNoise(rank=2), scope=Scope("attention")) for i in range(2)
    ]
    assert policy.supports_population(members)
    encoded = policy.tokenizer(["sudoku board", "a longer prompt here"], return_tensors="pt", padding=True, padding_side="left")
    with torch.no_grad():
        base = policy.model(**encoded).logits
        with policy.population(members), policy._member_rows(members):
            batched = policy.model(**encoded).logits
            hooked = sum(bool(m._forward_hooks) for m in policy.model.modules())
        for j, member in enumerate(members):
            with policy.perturbed(member):
                reference = policy.model(**encoded).logits[j]
            mask = encoded["attention_mask"][j].bool()
            torch.testing.assert_close(batched[j][mask], reference[mask], rtol=0, atol=1e-4)
            assert (batched[j][mask] - base[j][mask]).abs().max() > 1e-3
    assert hooked == 8  # q/k/v/o of two blocks, not the MLPs or the (tied) embedding


# ---------------------------------------------------------------- resume and replay through the trainer


@pytest.mark.parametrize("options", [{"optimizer": "momentum", "weight_decay": 0.5}, {"optimizer": "adam", "alpha": 0.01}])
def test_optimizer_state_survives_resume_and_replays(options, tmp_path, make_tiny_policy, monkeypatch, tiny_train_config):
    from esopt.train.es_trainer import ESTrainer, checkpoints

    def config(name):
        cfg = tiny_train_config(tmp_path, name, steps=3, tasks_per_step=2, eval_tasks=1, eval_every=0, checkpoint_every=1)
        for key, value in options.items():
            setattr(cfg.es, key, value)
        return cfg

    reference = make_tiny_policy()
    base = {n: t.clone() for n, t in reference.master_weights().items()}
    ESTrainer.start(config("ref"), policy=reference, console=Console(quiet=True)).run()
    assert any(not torch.equal(base[n], t) for n, t in reference.master_weights().items())
    history = read_history(tmp_path / "ref" / "history.jsonl")
    assert history[0].optimizer.kind == options["optimizer"]
    rebuilt = replay(base, history)
    assert all(torch.equal(rebuilt[n], t) for n, t in reference.master_weights().items())

    crashing = make_tiny_policy()
    original_apply, calls = crashing.apply, []

    def apply_then_crash(update):
        calls.append(update.step)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed mid-run")
        original_apply(update)

    monkeypatch.setattr(crashing, "apply", apply_then_crash)
    with pytest.raises(KeyboardInterrupt):
        ESTrainer.start(config("crash"), policy=crashing, console=Console(quiet=True)).run()
    last = checkpoints(tmp_path / "crash")[-1][1]
    assert last.name.endswith("00002") and (last / "optimizer.safetensors").exists()
    resumed = make_tiny_policy()  # a fresh process: base weights, then the checkpoint and its optimizer state
    ESTrainer.resume(tmp_path / "crash", policy=resumed, console=Console(quiet=True)).run()
    assert resumed.fingerprint() == reference.fingerprint()
    assert resumed.optimizer_state.steps == reference.optimizer_state.steps == 3
