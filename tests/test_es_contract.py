"""One contract for every noise kind x every strategy: each pair either fails at config time or follows
the gradient of a quadratic, replays bit-exactly from history.jsonl, and perturbs/restores/updates the
HF policy exactly as replay does. New kinds and strategies are picked up from the registries."""

from __future__ import annotations

import json

import pytest
import torch

from esopt.confutil import ConfigError
from esopt.es import (
    NOISE_KINDS,
    STRATEGIES,
    ESConfig,
    Member,
    Update,
    make_strategy,
    read_history,
    replay,
    tensors_moved,
    update_direction,
)

# Settings that make each noise kind cheap or interesting here; a kind not listed runs with its defaults.
NOISE_SETTINGS = {
    "full": {},
    "table": {"table_size": 1 << 16},
    "lowrank": {"rank": 2},
    "lowrank+vectors": {"noise": "lowrank", "rank": 2, "lowrank_vectors": "full"},
}
NOISES = {**{kind: {} for kind in NOISE_KINDS}, **NOISE_SETTINGS}
PAIRS = [(noise, strategy) for noise in NOISES for strategy in STRATEGIES]
SHAPES = (("block.weight", (20, 10)), ("block.bias", (10,)))


def _config(noise: str, strategy: str, **kwargs) -> ESConfig:
    return ESConfig(**{"strategy": strategy, "noise": noise, **NOISE_SETTINGS.get(noise, {}), **kwargs})


def _strategy_or_config_error(config: ESConfig, steps: int, seed: int = 7):
    """The strategy, or None when the pair is refused at config time (with a message naming both)."""
    try:
        return make_strategy(config, total_steps=steps, run_seed=seed)
    except ConfigError as e:
        assert config.noise in str(e) and config.strategy in str(e), str(e)
        return None


def _moved(base, live):
    return [k for k in base if not torch.equal(base[k], live[k])]


@pytest.mark.parametrize("noise, strategy", PAIRS)
def test_step_follows_the_gradient(noise, strategy, tmp_path, quadratic_es_run):
    # f(theta) = -||theta - T||^2: E[f(theta + sigma eps) eps] points along T - theta for every unit-variance noise.
    config = _config(noise, strategy, population=2000, sigma=0.05, sigma_final=0.05, alpha=0.01)
    if _strategy_or_config_error(config, 1) is None:
        return
    base, live, target, _ = quadratic_es_run(tmp_path, 1, config, shapes=SHAPES, run_seed=7)
    moved = tensors_moved(Update(0, [], [], 0.0, 0.0, [], noise=make_strategy(config, 1, 7).noise), base)
    assert _moved(base, live) == moved  # exactly the tensors the noise perturbs
    delta = torch.cat([(live[k] - base[k]).flatten() for k in moved])
    gradient = torch.cat([(target[k] - base[k]).flatten() for k in moved])
    assert torch.nn.functional.cosine_similarity(delta, gradient, dim=0).item() > 0.8


@pytest.mark.parametrize("noise, strategy", PAIRS)
def test_history_replays_bit_exactly(noise, strategy, tmp_path, quadratic_es_run):
    config = _config(noise, strategy, population=8, antithetic=True, shaping="rank", sigma=0.05, sigma_final=0.01,
                     alpha=0.05, alpha_final=0.01)
    if _strategy_or_config_error(config, 3) is None:
        return
    base, live, _, path = quadratic_es_run(tmp_path, 3, config, shapes=SHAPES)
    assert "block.weight" in _moved(base, live)  # the run moved the weights, so equality below means something
    history = read_history(path)
    assert [u.step for u in history] == [0, 1, 2]
    base_before = {k: v.clone() for k, v in base.items()}
    replayed = replay(base, history)
    assert all(torch.equal(replayed[k], live[k]) for k in live)
    assert all(torch.equal(base[k], base_before[k]) for k in base)  # replay works on copies
    member = make_strategy(config, 3, 7).ask(0)[0]
    assert Member.from_json(json.loads(json.dumps(member.to_json()))) == member


@pytest.mark.parametrize("noise", NOISES)
def test_direction_is_the_coefficient_weighted_sum_of_samples(noise):
    spec = make_strategy(_config(noise, "vanilla-es"), 1, 0).noise
    terms = [(11, 0.5), (12, -2.0), (13, 0.0), (14, 1.25)]
    update = Update(0, [s for s, _ in terms], [c for _, c in terms], 1.0, 0.1, [0.0] * 4, noise=spec)
    for name, shape in SHAPES:
        direction = update_direction(update, name, shape)
        assert direction.dtype == torch.float32 and direction.shape == shape
        if not spec.perturbs(shape):
            assert torch.equal(direction, torch.zeros(shape))
            continue
        expected = sum(c * spec.sample(s, name, shape).double() for s, c in terms)
        torch.testing.assert_close(direction.double(), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(spec.direction(terms, name, shape).double(), expected, rtol=1e-5, atol=1e-5)
        samples = torch.stack([spec.sample(seed, name, shape) for seed in range(300)])
        assert abs(samples.mean().item()) < 0.05 and abs(samples.var(dim=0).mean().item() - 1.0) < 0.15  # unit variance


@pytest.mark.parametrize("noise, strategy", PAIRS)
def test_policy_perturbs_restores_and_updates_like_replay(noise, strategy, make_tiny_policy):
    config = _config(noise, strategy, population=4, sigma=0.05, sigma_final=0.01, alpha=0.05,
                     **({"table_size": 1 << 22} if noise == "table" else {}))
    strategy_ = _strategy_or_config_error(config, 2)
    if strategy_ is None:
        return
    policy = make_tiny_policy()
    strategy_.prepare(policy.master_weights())
    base = {n: t.clone() for n, t in policy.master_weights().items()}
    history = []
    for step in range(2):
        members = strategy_.ask(step)
        for member in members[:2]:
            with policy.perturbed(member):
                params = dict(policy.model.named_parameters())
                changed = {n for n, master in policy.master_weights().items() if not torch.equal(params[n], master)}
            assert changed == set(tensors_moved(member, base))
        assert all(torch.equal(p, policy.master_weights()[n]) for n, p in policy.model.named_parameters())  # restored
        update = strategy_.tell(step, members, [0.0, 1.0, 3.0, 2.0])
        policy.apply(update)
        history.append(update)
    assert _moved(base, policy.master_weights())
    rebuilt = replay(base, history)
    assert all(torch.equal(rebuilt[n], t) for n, t in policy.master_weights().items())
