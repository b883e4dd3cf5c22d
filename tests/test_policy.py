"""HF policy contract on a tiny random Llama: exact restore, updates, replay, save, guided decoding."""

import contextlib
import re

import pytest
import torch
from transformers import AutoModelForCausalLM

from esopt.es import ESConfig, Member, make_strategy, replay
from esopt.policy.base import SamplingConfig


def _snapshot(policy):
    return {name: p.detach().clone() for name, p in policy.model.named_parameters()}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_perturb_restore_cycles_are_bit_exact(make_tiny_policy, dtype):
    policy = make_tiny_policy(dtype=dtype)
    before = _snapshot(policy)
    fingerprint = policy.fingerprint()
    for i in range(50):
        with policy.perturbed(Member(index=i, seed=1000 + i, sigma=1e-2, sign=1 if i % 2 else -1)):
            changed = sum(not torch.equal(p, before[n]) for n, p in policy.model.named_parameters())
            assert changed == len(before)  # every tensor is perturbed inside the context
    _assert_same(_snapshot(policy), before)
    assert policy.fingerprint() == fingerprint


def test_restore_on_exception(make_tiny_policy):
    policy = make_tiny_policy()
    before = _snapshot(policy)
    with pytest.raises(RuntimeError, match="boom"):
        with policy.perturbed(Member(index=0, seed=7, sigma=0.1)):
            raise RuntimeError("boom")
    _assert_same(_snapshot(policy), before)


def test_perturbation_matches_seeded_noise(make_tiny_policy):
    from esopt.es import tensor_noise

    policy = make_tiny_policy()
    name, base = next(iter(policy.master_weights().items()))
    base = base.clone()
    with policy.perturbed(Member(index=0, seed=3, sigma=0.5, sign=-1)):
        param = dict(policy.model.named_parameters())[name]
        assert torch.equal(param, base - 0.5 * tensor_noise(3, name, base.shape))


def test_updates_replay_bit_exactly(make_tiny_policy):
    policy = make_tiny_policy()
    base = {n: t.clone() for n, t in policy.master_weights().items()}
    strategy = make_strategy(ESConfig(population=4, alpha=1e-2), total_steps=3, run_seed=5)
    history = []
    for step in range(3):
        members = strategy.ask(step)
        update = strategy.tell(step, members, [float(i * (step + 1) % 3) for i in range(len(members))])
        policy.apply(update)
        history.append(update)
    rebuilt = replay(base, history)
    _assert_same(rebuilt, policy.master_weights())
    assert any(not torch.equal(base[n], rebuilt[n]) for n in base)
    # the model's weights follow the master copy
    _assert_same({n: p.detach() for n, p in policy.model.named_parameters()}, policy.master_weights())


def test_all_equal_fitness_leaves_weights_unchanged(make_tiny_policy):
    policy = make_tiny_policy()
    before = _snapshot(policy)
    strategy = make_strategy(ESConfig(population=4), total_steps=1, run_seed=0)
    members = strategy.ask(0)
    policy.apply(strategy.tell(0, members, [0.5] * 4))
    _assert_same(_snapshot(policy), before)


def test_bf16_model_keeps_small_updates_in_master(make_tiny_policy):
    policy = make_tiny_policy(dtype=torch.bfloat16)
    base = {n: t.clone() for n, t in policy.master_weights().items()}
    strategy = make_strategy(ESConfig(population=2, alpha=1e-7), total_steps=1, run_seed=0)
    members = strategy.ask(0)
    policy.apply(strategy.tell(0, members, [0.0, 1.0]))
    # an update far below bf16 resolution still moves the fp32 master
    assert all(not torch.equal(base[n], t) for n, t in policy.master_weights().items())


def test_the_output_head_multiplies_a_contiguous_input_in_prefill(make_tiny_policy):
    # A non-contiguous [B, 1, H] slice made torch copy the frozen head's weight once per row (a bmm path):
    # 200x slower and B x the head's size in memory on the real model.
    policy = make_tiny_policy(dtype=torch.bfloat16)
    seen = []
    policy.model.get_output_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].is_contiguous()))
    chats = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "a longer question than that"}]]
    policy.generate(chats, SamplingConfig(max_new_tokens=3))
    assert len(seen) >= 2 and all(seen)


@pytest.mark.parametrize("population", [False, True])
def test_shared_prefill_gives_the_logits_of_a_plain_prefill(make_tiny_policy, population):
    from esopt.es import LowRankNoise
    from esopt.policy.prefill import cache_keyword, shared_prefill

    policy = make_tiny_policy()
    tok = policy.tokenizer
    system = {"role": "system", "content": "You play a game. Reply with one move."}
    chats = [[system, {"role": "user", "content": "Board " + "x " * i}] for i in (1, 4, 2)]
    chats = chats + chats[:2]  # repeated prompts share cache rows (without members)
    texts = tok.apply_chat_template(chats, add_generation_prompt=True, tokenize=False)
    members = [None] * len(chats)
    if population:  # each row its member: the shared system prompt must still run once per member
        members = [Member(index=i % 2, seed=300 + i % 2, sigma=0.5, noise=LowRankNoise(rank=2)) for i in range(len(chats))]
    rows = policy._member_rows(members) if population else contextlib.nullcontext()
    with torch.inference_mode(), rows:
        plain = tok(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        expected = policy.model(**plain).logits[:, -1]
        ids = tok(texts, add_special_tokens=False)["input_ids"]
        batch = shared_prefill(policy.model, ids, members, tok.pad_token_id, policy._run_rows_as)
        assert batch.cache.get_seq_length() == batch.input_ids.shape[1] - 1  # every column but the last
        mask = batch.attention_mask
        positions = (mask.cumsum(-1) - 1)[:, -1:]
        got = policy.model(input_ids=batch.input_ids[:, -1:], attention_mask=mask, position_ids=positions, **{cache_keyword(policy.model): batch.cache}).logits[:, -1]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    same_prompt_gap = (got[3] - got[0]).abs().max()  # chats[3] repeats chats[0]
    assert same_prompt_gap > 1e-3 if population else same_prompt_gap < 1e-5
    assert (expected[1] - expected[0]).abs().max() > 1e-3  # the prompts differ where it matters


@pytest.mark.parametrize("population", [False, True])
def test_generate_with_a_shared_prefill_gives_the_replies_of_a_plain_one(make_tiny_policy, population):
    from esopt.es import LowRankNoise

    shared, plain = make_tiny_policy(), make_tiny_policy()
    plain.share_prefill = False
    chats = [[{"role": "system", "content": "Play."}, {"role": "user", "content": "Board " + "x " * i}] for i in (1, 4, 2, 1)]
    members = None
    if population:
        members = [Member(index=i % 2, seed=300 + i % 2, sigma=0.5, noise=LowRankNoise(rank=2)) for i in range(len(chats))]
    for sampling, seed in ((SamplingConfig(max_new_tokens=6), 0), (SamplingConfig(max_new_tokens=6, temperature=1.0), 4)):
        shared.generate(chats, sampling, seed=seed, members=members)
        plain.generate(chats, sampling, seed=seed, members=members)
        assert shared.last_reply_ids == plain.last_reply_ids


@pytest.mark.parametrize("population", [False, True])
def test_reply_logprobs_equal_teacher_forced_log_likelihoods(make_tiny_policy, population):
    from esopt.es import LowRankNoise

    policy = make_tiny_policy()
    tok = policy.tokenizer
    chats = [[{"role": "system", "content": "Play."}, {"role": "user", "content": "Board " + "x " * i}] for i in (1, 3)]
    # one-token tails (read off one row), tails of one length after another cell (a row each, one shared
    # prompt prefill) and replies that differ earlier (rows of their own)
    replies = [["set 1 1 1", "set 1 1 2", "set 2 3 1", "set 2 3 4"], ["answer: 12", "answer: 7 + 5", "no"]]
    members = None
    if population:
        members = [Member(index=i, seed=400 + i, sigma=0.5, noise=LowRankNoise(rank=2)) for i in range(2)]
    prefilled = []  # rows of each decoder forward: common prefix, distinct pieces, then the scored columns
    hook = policy.model.get_decoder().register_forward_hook(lambda m, a, kw, out: prefilled.append(kw["input_ids"].shape[0]), with_kwargs=True)
    try:
        got = policy.reply_logprobs(chats, replies, members=members)
    finally:
        hook.remove()
    # chat 0's two scoring rows share one prompt piece; chat 1's three rows differ in length
    assert prefilled[-3:] == [1 if not population else 2, 4, 5] and len(got[0]) == 4
    for i, (chat, candidates) in enumerate(zip(chats, replies)):
        prompt = tok(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
        for reply, value in zip(candidates, got[i]):
            reply_ids = tok(reply, add_special_tokens=False)["input_ids"]
            ids = torch.tensor([prompt + reply_ids])
            context = policy.perturbed(members[i]) if population else contextlib.nullcontext()
            with torch.no_grad(), context:
                logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(reply_ids)[:, None]).sum().item()
            assert value == pytest.approx(expected, abs=1e-3 if population else 1e-4), (i, reply)
    assert len({round(v, 3) for v in got[0]}) == 4


def _teacher_forced(policy, chat, reply):
    tok = policy.tokenizer
    prompt = tok(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
    reply_ids = tok(reply, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = policy.model(input_ids=torch.tensor([prompt + reply_ids])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(reply_ids)[:, None]).sum().item()


def test_members_of_the_last_blocks_share_one_run_of_the_blocks_below_and_score_as_a_full_forward(make_tiny_policy):
    from esopt.es import Scope

    policy = make_tiny_policy()
    lower_runs = []
    policy.model.get_decoder().layers[0].register_forward_hook(lambda *_: lower_runs.append(1))
    chats = [[{"role": "system", "content": "Play."}, {"role": "user", "content": "Board " + "x " * i}] for i in (1, 3)]
    replies = [["set 1 1 1", "set 1 1 2", "set 2 3 4"], ["answer: 12", "no"]]

    def score(member):
        """(log-probs, their teacher-forced values, how many forwards of block 0 the log-probs took)"""
        with policy.perturbed(member):
            before = len(lower_runs)
            got = policy.reply_logprobs(chats, replies)
            runs = len(lower_runs) - before
            expected = [[_teacher_forced(policy, chat, reply) for reply in candidates] for chat, candidates in zip(chats, replies)]
        return got, expected, runs

    upper = [Member(index=i, seed=500 + i, sigma=0.5, scope=Scope("last:1")) for i in range(2)]
    scored = [score(member) for member in upper]
    assert [runs for *_, runs in scored] == [2, 0]  # block 0 ran for the first member only (prefix, rest)
    for got, expected, _ in scored:
        assert got == [pytest.approx(row, abs=1e-4) for row in expected]
    assert abs(scored[0][0][0][0] - scored[1][0][0][0]) > 1e-3  # the members differ

    # an update of every weight changes block 0: its cached states must not serve the next member
    pair = [Member(index=0, seed=9, sigma=0.5), Member(index=1, seed=9, sigma=0.5, sign=-1)]
    policy.apply(make_strategy(ESConfig(population=2, alpha=1.0), total_steps=1, run_seed=0).tell(0, pair, [1.0, 0.0]))
    got, expected, runs = score(upper[1])
    assert runs == 2 and got == [pytest.approx(row, abs=1e-4) for row in expected]

    # a member that perturbs block 0 itself scores through the whole model
    got, expected, runs = score(Member(index=0, seed=7, sigma=0.5))
    assert got == [pytest.approx(row, abs=1e-4) for row in expected]


def test_generating_holds_no_master_copy_and_the_first_weight_change_starts_from_the_loaded_weights(make_tiny_policy):
    policy = make_tiny_policy(dtype=torch.bfloat16)
    loaded = _snapshot(policy)
    policy.generate([[{"role": "user", "content": "hi"}]], SamplingConfig(max_new_tokens=3))
    held = [t for value in vars(policy).values() if isinstance(value, dict) for t in value.values()]
    assert not any(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in held)  # the bf16 model only
    with policy.perturbed(Member(index=0, seed=3, sigma=1e-2)):
        assert all(not torch.equal(p, loaded[n]) for n, p in policy.model.named_parameters())
    _assert_same(_snapshot(policy), loaded)
    assert all(torch.equal(t, loaded[n].float()) for n, t in policy.master_weights().items())


def test_save_loads_with_from_pretrained(make_tiny_policy, tmp_path):
    policy = make_tiny_policy()
    strategy = make_strategy(ESConfig(population=2, alpha=1e-2), total_steps=1, run_seed=0)
    policy.apply(strategy.tell(0, strategy.ask(0), [0.0, 1.0]))
    policy.save(str(tmp_path / "ckpt"))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    loaded_params = dict(loaded.named_parameters())
    for name, tensor in policy.master_weights().items():
        assert torch.equal(loaded_params[name], tensor), name


def test_guided_generation_matches_regex(make_tiny_policy):
    policy = make_tiny_policy()
    regex = r"set [1-4] [1-4] [1-4]"
    chats = [[{"role": "system", "content": "Play."}, {"role": "user", "content": f"Board {i}"}] for i in range(3)]
    replies = policy.generate(chats, SamplingConfig(max_new_tokens=12), action_regex=regex)
    assert len(replies) == 3
    assert all(re.fullmatch(regex, r) for r in replies), replies
    sampled = policy.generate(chats, SamplingConfig(max_new_tokens=12, temperature=1.0), action_regex=regex, seed=1)
    assert all(re.fullmatch(regex, r) for r in sampled), sampled


def test_sampling_is_seeded(make_tiny_policy):
    policy = make_tiny_policy()
    chats = [[{"role": "user", "content": "hello"}]] * 2
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0)
    assert policy.generate(chats, sampling, seed=3) == policy.generate(chats, sampling, seed=3)


def test_stop_strings_cut_replies(make_tiny_policy):
    policy = make_tiny_policy()
    chats = [[{"role": "user", "content": "x"}]]
    full = policy.generate(chats, SamplingConfig(max_new_tokens=12), action_regex=r"set 1 2 3")[0]
    cut = policy.generate(chats, SamplingConfig(max_new_tokens=12, stop=[" 2"]), action_regex=r"set 1 2 3")[0]
    assert full == "set 1 2 3" and cut == "set 1"


def test_inverse_cdf_sampler_draws_from_the_softmax_and_never_a_masked_token():
    from esopt.policy.sampling import InverseCDFSampler

    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, float("-inf"), 0.0, -1.0]]).repeat(20000, 1)
    out = InverseCDFSampler()(None, logits)
    assert torch.isfinite(out).sum(dim=1).eq(1).all()  # exactly one token left per row
    drawn = out.argmax(dim=1)
    freq = torch.bincount(drawn, minlength=5).double() / len(drawn)
    expected = torch.softmax(logits[0].double(), dim=0)
    assert freq[2] == 0
    assert torch.allclose(freq, expected, atol=0.012), (freq, expected)


def test_sampled_generate_respects_top_k_and_is_reproducible(make_tiny_policy):
    from esopt.policy.base import SamplingConfig

    policy = make_tiny_policy()
    chats = [[{"role": "user", "content": f"say something {i}"}] for i in range(6)]
    hot = SamplingConfig(temperature=1.5, max_new_tokens=6)
    first = policy.generate(chats, hot, seed=3)
    assert first == policy.generate(chats, hot, seed=3)
    assert first != policy.generate(chats, hot, seed=4)
    top1 = SamplingConfig(temperature=1.5, top_k=1, max_new_tokens=6)  # top-1 sampling is greedy decoding
    assert policy.generate(chats, top1, seed=5) == policy.generate(chats, SamplingConfig(max_new_tokens=6))


def test_reply_lengths_count_tokens_up_to_the_first_end_of_sequence():
    from esopt.policy.hf import _reply_lengths

    eos, pad = 2, 0
    rows = torch.tensor([[5, 6, 2, 0, 0], [5, 6, 7, 8, 9], [5, 0, 0, 0, 0], [2, 0, 0, 0, 0]])
    assert _reply_lengths(rows, eos, pad) == [3, 5, 1, 1]  # eos counts; padding after a stop string does not
    same = torch.tensor([[5, 2, 2, 2], [5, 6, 7, 8]])  # pad == eos (SmolLM2's tokenizer)
    assert _reply_lengths(same, eos, eos) == [2, 4]


def test_rollout_counts_generated_tokens(make_tiny_policy):
    from esopt.envs import make_env
    from esopt.rollout import RolloutConfig, rollout

    policy = make_tiny_policy()
    env = make_env("sudoku", {"size": 4, "empty_cells": 2, "grammar": "format"})
    config = RolloutConfig(history_turns=0, guided_decoding=False, sampling=SamplingConfig(max_new_tokens=6))
    calls = []
    generate = policy.generate

    def spy(chats, *args, **kwargs):
        replies = generate(chats, *args, **kwargs)
        calls.append(list(policy.last_reply_tokens))
        tokenizer = policy.tokenizer
        for reply, length in zip(replies, policy.last_reply_tokens):
            # A reply decodes from at most `length` tokens, and never more than max_new_tokens were generated.
            assert len(tokenizer(reply, add_special_tokens=False)["input_ids"]) <= length + 1 and 1 <= length <= 6
        return replies

    policy.generate = spy
    result = rollout(policy, env, env.tasks("train", 3, 0), config)
    assert sum(len(c) for c in calls) == sum(t.turns for t in result.trajectories)
    assert result.generated_tokens == sum(sum(c) for c in calls) > 0


def test_min_new_tokens_suppresses_early_end_of_sequence(make_tiny_policy):
    policy = make_tiny_policy()
    chats = [[{"role": "user", "content": f"question {i}"}] for i in range(3)]
    eos = policy.tokenizer.eos_token_id
    # Make end-of-sequence the greedy choice everywhere: without min_new_tokens every reply is one token.
    bias = torch.zeros(policy.model.config.vocab_size)
    bias[eos] = 1e4
    handle = policy.model.lm_head.register_forward_hook(lambda m, a, out: out + bias.to(out.dtype))
    try:
        policy.generate(chats, SamplingConfig(max_new_tokens=7))
        assert list(policy.last_reply_tokens) == [1, 1, 1]
        policy.generate(chats, SamplingConfig(max_new_tokens=7, min_new_tokens=5))
        assert list(policy.last_reply_tokens) == [6, 6, 6]  # 5 forced tokens, then the end-of-sequence token
    finally:
        handle.remove()
    with pytest.raises(ValueError, match="min_new_tokens"):
        SamplingConfig(max_new_tokens=4, min_new_tokens=5).validate()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [("fpu avx2 fma", "float32"), ("avx2 avx512f avx512_bf16", "bfloat16"), ("avx2 amx_bf16 amx_tile", "bfloat16")],
)
def test_auto_dtype_is_bf16_only_on_a_cpu_that_multiplies_it_natively(monkeypatch, flags, expected):
    from esopt import machine
    from esopt.policy.config import resolve_dtype

    monkeypatch.setattr(machine, "_cpuinfo_field", lambda name: flags if name == "flags" else None)
    assert resolve_dtype("auto", torch.device("cpu")) == expected
    assert resolve_dtype("float32", torch.device("cpu")) == "float32"  # an explicit dtype is never changed
    assert resolve_dtype("bfloat16", torch.device("cpu")) == "bfloat16"
    from esopt.policy.config import ModelConfig
    from esopt.train.report import dtype_shown

    assert dtype_shown(ModelConfig(dtype="auto", device="cpu")) == f"auto: {expected}"  # what a run's report.md says


def test_an_auto_dtype_model_loads_in_the_resolved_dtype_and_a_bad_one_is_a_config_error(tiny_model_dir, monkeypatch):
    from esopt import machine
    from esopt.confutil import ConfigError
    from esopt.policy.config import ModelConfig
    from esopt.policy.hf import HFPolicy

    for flags, dtype in (("avx2", torch.float32), ("avx512_bf16", torch.bfloat16)):
        monkeypatch.setattr(machine, "_cpuinfo_field", lambda name, flags=flags: flags if name == "flags" else None)
        policy = HFPolicy.load(ModelConfig(path=str(tiny_model_dir), dtype="auto", device="cpu"))
        assert next(policy.model.parameters()).dtype == dtype
    with pytest.raises(ConfigError, match="model.dtype must be one of"):
        ModelConfig(dtype="fp16").validate()
