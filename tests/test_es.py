"""Tests for esopt.es: noise, shaping, schedules, strategy math, history and bit-exact replay."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

import esopt.es.noise.full as full_noise
from esopt.confutil import ConfigError, field_help
from esopt.es import (
    SGD,
    ESConfig,
    FullNoise,
    HistoryWriter,
    LowRankNoise,
    Member,
    Partition,
    Schedule,
    Scope,
    TableNoise,
    Update,
    apply_update,
    derive_seed,
    make_strategy,
    member_seeds,
    perturb_tensor,
    read_history,
    shape_fitness,
    tensor_noise,
    update_direction,
)


# ---------------------------------------------------------------- noise


def test_derive_seed_stable_range_and_injective():
    s = derive_seed(1, "layer.weight", 0)
    assert s == derive_seed(1, "layer.weight", 0)
    assert 0 <= s < 2**63
    assert derive_seed(1, "a") != derive_seed(1, "b")
    assert derive_seed(1, "a") != derive_seed(2, "a")
    assert derive_seed("ab", "c") != derive_seed("a", "bc")
    assert derive_seed(1) != derive_seed("1")
    assert 0 <= derive_seed(-(2**100), "x") < 2**63
    with pytest.raises(TypeError):
        derive_seed(1.5)


def test_derive_seed_stable_across_processes():
    # A fresh interpreter with a different hash seed must agree (Python's hash() would not).
    code = "from esopt.es import derive_seed; print(derive_seed(7, 'model.layers.0.weight', 3))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    ).stdout.strip()
    assert int(out) == derive_seed(7, "model.layers.0.weight", 3)


def test_tensor_noise_deterministic_and_independent():
    a = tensor_noise(3, "w", (64, 32))
    assert a.dtype == torch.float32 and a.shape == (64, 32)
    assert torch.equal(a, tensor_noise(3, "w", (64, 32)))
    other_name = tensor_noise(3, "v", (64, 32))
    other_seed = tensor_noise(4, "w", (64, 32))
    assert not torch.equal(a, other_name)
    assert not torch.equal(a, other_seed)
    # Independent streams: correlation across names/seeds is ~0.
    corr = torch.corrcoef(torch.stack([a.flatten(), other_name.flatten(), other_seed.flatten()]))
    assert corr[0, 1].abs() < 0.1 and corr[0, 2].abs() < 0.1


def test_tensor_noise_statistics():
    x = tensor_noise(11, "big", (400_000,)).double()
    assert abs(x.mean().item()) < 0.01
    assert abs(x.std().item() - 1.0) < 0.01


def test_tensor_noise_chunks(monkeypatch):
    monkeypatch.setattr(full_noise, "CHUNK_NUMEL", 100)
    x = tensor_noise(5, "w", (7, 50))  # 350 elements -> 4 chunks, the last partial
    flat = x.flatten()
    for k in range(4):
        gen = torch.Generator().manual_seed(derive_seed(5, "w", k))
        n = min(100, 350 - 100 * k)
        assert torch.equal(flat[100 * k : 100 * k + n], torch.randn(n, generator=gen))
    # Chunks get their own streams, not repeats of the first one.
    assert not torch.equal(flat[:100], flat[100:200])
    # Chunking is by flat index, so the shape does not change the values.
    assert torch.equal(tensor_noise(5, "w", (350,)), flat)


def test_tensor_noise_out():
    expected = tensor_noise(9, "x", (10, 20))
    out = torch.full((10, 20), 7.0)
    ret = tensor_noise(9, "x", (10, 20), out=out)
    assert ret is out and torch.equal(out, expected)
    nc = torch.zeros(20, 10).t()  # non-contiguous out
    tensor_noise(9, "x", (10, 20), out=nc)
    assert torch.equal(nc, expected)
    with pytest.raises(ValueError):
        tensor_noise(9, "x", (10, 20), out=torch.empty(5))
    with pytest.raises(TypeError):
        tensor_noise(9, "x", (10, 20), out=torch.empty(10, 20, dtype=torch.float64))


def test_tensor_noise_scalar_and_empty():
    assert tensor_noise(1, "s", ()).shape == ()
    assert tensor_noise(1, "e", (0, 4)).numel() == 0


def test_member_seeds():
    s = member_seeds(0, 3, 16)
    assert len(s) == 16 == len(set(s))
    assert s == member_seeds(0, 3, 16)
    assert member_seeds(0, 3, 4) == s[:4]
    assert set(s).isdisjoint(member_seeds(0, 4, 16))
    assert set(s).isdisjoint(member_seeds(1, 3, 16))
    assert member_seeds(0, 0, 0) == []


# ---------------------------------------------------------------- shaping


def test_zscore_known_values():
    z = shape_fitness([1.0, 2.0, 3.0, 4.0])
    std = math.sqrt(1.25)  # population std of 1..4
    assert z == pytest.approx([-1.5 / std, -0.5 / std, 0.5 / std, 1.5 / std], abs=1e-12)
    assert sum(z) == pytest.approx(0.0, abs=1e-12)


def test_rank_with_ties():
    assert shape_fitness([10.0, 30.0, 20.0], "rank") == pytest.approx([-0.5, 0.5, 0.0])
    # Ranks 0,1,2,3 -> ties (1,2) share 1.5 -> (r/3 - 0.5)
    assert shape_fitness([0.0, 5.0, 5.0, 9.0], "rank") == pytest.approx([-0.5, 0.0, 0.0, 0.5])
    r = shape_fitness([3.0, 1.0, 3.0, 3.0, 0.0], "rank")
    assert r == pytest.approx([0.25, -0.25, 0.25, 0.25, -0.5])


@pytest.mark.parametrize("method", ["zscore", "rank"])
def test_shaping_degenerate_is_zero(method):
    assert shape_fitness([], method) == []
    assert shape_fitness([3.0], method) == [0.0]
    assert shape_fitness([0.5] * 6, method) == [0.0] * 6


def test_shaping_errors():
    with pytest.raises(ValueError, match="finite"):
        shape_fitness([1.0, float("nan")])
    with pytest.raises(ValueError, match="finite"):
        shape_fitness([1.0, float("inf")], "rank")
    with pytest.raises(ValueError, match="unknown"):
        shape_fitness([1.0, 2.0], "softmax")


# ---------------------------------------------------------------- schedule


def test_constant_schedule():
    s = Schedule("constant", 0.5, total_steps=10)
    assert [s.value(i) for i in (0, 5, 9)] == [0.5, 0.5, 0.5]
    w = Schedule("constant", 0.5, warmup_steps=4, total_steps=10)
    assert [w.value(i) for i in range(5)] == pytest.approx([0.125, 0.25, 0.375, 0.5, 0.5])


def test_cosine_schedule():
    s = Schedule("cosine", 1e-3, 2.5e-4, total_steps=100)
    assert s.value(0) == 1e-3
    assert s.value(99) == 2.5e-4
    mid = s.value(49)
    assert 2.5e-4 < mid < 1e-3
    vals = [s.value(i) for i in range(100)]
    assert all(a >= b for a, b in zip(vals, vals[1:]))
    assert s.value(150) == 2.5e-4  # holds the end value past the horizon


def test_cosine_schedule_with_warmup():
    s = Schedule("cosine", 1.0, 0.1, warmup_steps=3, total_steps=10)
    assert [s.value(i) for i in range(3)] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert s.value(3) == 1.0
    assert s.value(9) == pytest.approx(0.1, abs=1e-15)
    # Halfway through the decay window (t = 3 of T = 6) is the midpoint.
    assert s.value(6) == pytest.approx(0.55)


def test_single_step_cosine():
    assert Schedule("cosine", 1.0, 0.5, total_steps=1).value(0) == 1.0


def test_schedule_validation():
    with pytest.raises(ValueError, match="kind"):
        Schedule("linear", 1.0)
    with pytest.raises(ValueError, match="end"):
        Schedule("cosine", 1.0)
    with pytest.raises(ValueError):
        Schedule("constant", -1.0)
    with pytest.raises(ValueError):
        Schedule("cosine", 1.0, -0.1)
    with pytest.raises(ValueError):
        Schedule("constant", 1.0, warmup_steps=-1)
    with pytest.raises(ValueError):
        Schedule("constant", 1.0).value(-1)


# ---------------------------------------------------------------- config & strategy


def test_config_fields_have_help():
    import dataclasses

    for f in dataclasses.fields(ESConfig):
        assert field_help(ESConfig, f.name), f.name


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"population": 0}, "population"),
        ({"population": 7, "antithetic": True}, "population"),
        ({"sigma": 0.0}, "sigma"),
        ({"sigma": -1e-3}, "sigma"),
        ({"sigma_final": 0.0}, "sigma_final"),
        ({"alpha": -1.0}, "alpha"),
        ({"alpha_final": -1.0}, "alpha_final"),
        ({"warmup_steps": -2}, "warmup_steps"),
        ({"strategy": "cma-es"}, "strategy"),
        ({"shaping": "softmax"}, "shaping"),
    ],
)
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ESConfig(**kwargs).validate()
    with pytest.raises(ConfigError):
        make_strategy(ESConfig(**kwargs), total_steps=5, run_seed=0)


def test_config_defaults_valid():
    ESConfig().validate()
    ESConfig(population=8, antithetic=True).validate()
    ESConfig(strategy="vanilla-es", sigma_final=0.0).validate()  # sigma_final unused there


def test_strategy_schedules():
    agentic = make_strategy(ESConfig(), total_steps=100, run_seed=0)
    assert agentic.sigma(0) == 1e-3 and agentic.sigma(99) == 2.5e-4
    assert agentic.alpha(0) == agentic.alpha(99) == 5e-4
    vanilla = make_strategy(ESConfig(strategy="vanilla-es", sigma=1.5e-3, alpha=2.5e-4), total_steps=70, run_seed=0)
    assert vanilla.sigma(0) == vanilla.sigma(69) == 1.5e-3
    decaying = make_strategy(ESConfig(alpha_final=1e-4), total_steps=10, run_seed=0)
    assert decaying.alpha(0) == 5e-4 and decaying.alpha(9) == pytest.approx(1e-4, abs=1e-18)


def test_ask_plain():
    st = make_strategy(ESConfig(population=6), total_steps=10, run_seed=42)
    ms = st.ask(2)
    assert [m.index for m in ms] == list(range(6))
    assert [m.seed for m in ms] == member_seeds(42, 2, 6)
    assert all(m.sign == 1 and m.sigma == st.sigma(2) for m in ms)
    assert ms == st.ask(2)
    assert {m.seed for m in ms}.isdisjoint({m.seed for m in st.ask(3)})


def test_ask_tell_antithetic_pairs():
    st = make_strategy(ESConfig(population=8, antithetic=True), total_steps=10, run_seed=1)
    ms = st.ask(0)
    assert len(ms) == 8 and [m.index for m in ms] == list(range(8))
    assert [m.seed for m in ms[0::2]] == member_seeds(1, 0, 4)
    for plus, minus in zip(ms[0::2], ms[1::2]):
        assert plus.seed == minus.seed and (plus.sign, minus.sign) == (1, -1)
    fitness = [1.0, 0.0, 3.0, 2.0, 5.0, 9.0, 4.0, 4.0]
    up = st.tell(0, ms, fitness)
    z = shape_fitness(fitness)
    assert up.seeds == [m.seed for m in ms]
    assert up.coefficients == [zi * m.sign for zi, m in zip(z, ms)]
    assert up.coefficients[1] == -z[1]
    # A +/- pair evaluated with equal fitness cancels exactly in the direction.
    pair = Update(0, [ms[6].seed, ms[7].seed], [0.7, -0.7], 1.0, 1e-3, [4.0, 4.0], {})
    assert torch.equal(update_direction(pair, "w", (50,)), torch.zeros(50))


def test_tell_stats_and_errors():
    st = make_strategy(ESConfig(population=4), total_steps=10, run_seed=0)
    ms = st.ask(1)
    up = st.tell(1, ms, [1.0, 2.0, 3.0, 6.0])
    assert up.step == 1 and up.alpha == st.alpha(1) and up.sigma == st.sigma(1)
    assert up.fitness == [1.0, 2.0, 3.0, 6.0]
    assert up.stats["mean"] == 3.0 and up.stats["min"] == 1.0 and up.stats["max"] == 6.0
    assert up.stats["std"] == pytest.approx(math.sqrt(3.5))
    with pytest.raises(ValueError):
        st.tell(1, ms, [1.0, 2.0])
    with pytest.raises(ValueError):
        st.tell(1, ms, [1.0, 2.0, float("nan"), 0.0])


def test_perturb_tensor_fp32_and_bf16():
    base = torch.randn(30, 20)
    m = Member(index=0, seed=123, sigma=0.01, sign=-1)
    out = torch.empty(30, 20)
    perturb_tensor("w", base, m, out)
    assert torch.equal(out, torch.add(base, tensor_noise(123, "w", (30, 20)), alpha=-0.01))
    out_bf16 = torch.empty(30, 20, dtype=torch.bfloat16)
    perturb_tensor("w", base, m, out_bf16)
    assert torch.equal(out_bf16, out.to(torch.bfloat16))
    # Restoring from the fp32 master is exact.
    out.copy_(base)
    assert torch.equal(out, base)


def test_zero_update_is_bit_identical():
    st = make_strategy(ESConfig(population=4), total_steps=5, run_seed=0)
    ms = st.ask(0)
    up = st.tell(0, ms, [0.25] * 4)
    assert up.coefficients == [0.0] * 4
    t = torch.tensor([0.0, -0.0, 1.5, -2.0, float("inf")])
    before = t.clone()
    tensors = {"w": t, "b": torch.randn(3, 3)}
    b_before = tensors["b"].clone()
    apply_update(tensors, up)
    assert tensors["w"].view(torch.int32).equal(before.view(torch.int32))
    assert tensors["b"].view(torch.int32).equal(b_before.view(torch.int32))


def test_apply_update_rejects_low_precision():
    up = Update(0, [1], [1.0], 0.1, 1e-3, [1.0], {})
    with pytest.raises(TypeError, match="float32"):
        apply_update({"w": torch.zeros(3, dtype=torch.bfloat16)}, up)


def test_update_json_round_trip_exact():
    st = make_strategy(ESConfig(population=5), total_steps=7, run_seed=99)
    ms = st.ask(3)
    up = st.tell(3, ms, [0.1, 1 / 3, 2 / 7, math.pi, 1e-17])
    back = Update.from_json(json.loads(json.dumps(up.to_json())))
    assert back == up
    assert back.coefficients == up.coefficients  # exact float equality, no rounding
    with pytest.raises(ValueError, match="missing"):
        Update.from_json({"step": 0})


def test_records_written_before_the_noise_spec_still_load():
    # history.jsonl lines as esopt wrote them when Update had flat noise / rank / lowrank_vectors /
    # table_size fields and CoPES fields of its own
    common = {"step": 2, "seeds": [5, 6], "coefficients": [1.0, -1.0], "alpha": 0.01, "sigma": 0.1, "fitness": [1.0, 0.0]}
    lowrank = Update.from_json({**common, "noise": "lowrank", "rank": 3, "lowrank_vectors": "full"})
    table = Update.from_json({**common, "noise": "table", "table_size": 4096})
    copes = Update.from_json({**common, "member_subspaces": [0, 1], "subspaces": 2, "partition_seed": 77})
    plain = Update.from_json(common)
    assert lowrank.noise == LowRankNoise(rank=3, vectors="full") and table.noise == TableNoise(size=4096)
    assert copes.partition == Partition(seed=77, parts=2) and copes.member_subspaces == [0, 1]
    assert plain.noise == FullNoise() and plain.scope == Scope("all") and plain.optimizer == SGD()
    # the same updates, rewritten in today's format, read back equal
    for update in (lowrank, table, copes, plain):
        assert Update.from_json(json.loads(json.dumps(update.to_json()))) == update


# ---------------------------------------------------------------- history & replay


def test_read_history_truncated_and_corrupt(tmp_path, quadratic_es_run):
    cfg = ESConfig(population=4, sigma=0.05, alpha=0.05)
    base, live, _, path = quadratic_es_run(tmp_path / "run", 3, cfg)
    good = path.read_text()
    full = read_history(path)
    assert len(full) == 3
    # A run killed mid-write: partial final line.
    path.write_text(good + good.splitlines()[0][:25])
    with pytest.warns(UserWarning, match="truncated"):
        assert read_history(path) == full
    # Resuming the writer drops the partial line so later appends stay readable.
    extra = Update(3, [1, 2], [0.5, -0.5], 0.01, 0.001, [1.0, 0.0], {"mean": 0.5})
    with HistoryWriter(path) as w:
        w.append(extra)
    assert read_history(path) == full + [extra]
    # A corrupt line in the middle is an error naming the line.
    lines = good.splitlines()
    lines[1] = lines[1][:10] + "#garbage"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r":2"):
        read_history(path)


def test_history_writer_keeps_complete_unterminated_line(tmp_path):
    path = tmp_path / "h.jsonl"
    a = Update(0, [1], [1.0], 0.1, 0.01, [1.0], {})
    b = Update(1, [2], [-1.0], 0.1, 0.01, [2.0], {})
    path.write_text(json.dumps(a.to_json()))  # complete record, newline missing
    with HistoryWriter(path) as w:
        w.append(b)
    assert read_history(path) == [a, b]
