"""vLLM backend vs HF backend on the same chats, measured side by side in one run.

    .venv-vllm/bin/python -m benchmarks.vllm_vs_hf [--batch 64] [--new-tokens 64] [--env sudoku]
        [--cycles 3] [--hf-python PATH] [--hf-attn sdpa] [--enforce-eager]

Each backend runs in its own child process (so each one's peak RSS is its own, and vLLM's CPU worker,
which disables torch.set_num_threads process-wide, cannot slow the HF run): load, warm up, then
(a) one batched generate of B env prompts, greedy; (b) the same, sampled (T=1, top_p 0.95);
(c) `--cycles` perturb / restore cycles of ES members and one apply of a G=4 update.
Reply tokens are counted with the model's tokenizer on both sides, so tokens/s compare like for
like. Prints one table with vllm/hf ratios and writes bench_results/vllm_vs_hf.json.
Needs the vllm extra (make test-vllm builds .venv-vllm); the HF side runs under --hf-python
(default: this interpreter).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _chats(env_name: str, n: int, seed: int = 0) -> list:
    from esopt.envs import make_env

    env = make_env(env_name)
    chats = []
    for task in env.tasks("eval", n, seed):
        episode = env.start(task)
        chats.append([{"role": "system", "content": env.system_prompt}, {"role": "user", "content": episode.observation}])
    return chats


def _peak_rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024


def _child(args) -> dict:
    """Measure one backend in this process; return the numbers."""
    import torch

    from esopt.es import ESConfig, make_strategy
    from esopt.policy.base import SamplingConfig

    start = time.perf_counter()
    if args.child == "hf":
        from esopt.policy.config import ModelConfig
        from esopt.policy.hf import HFPolicy

        policy = HFPolicy.load(ModelConfig(dtype=args.dtype, attn_implementation=args.hf_attn))
    else:
        from esopt.policy.vllm import VLLMConfig, VLLMPolicy

        policy = VLLMPolicy(VLLMConfig(dtype=args.dtype, enforce_eager=args.enforce_eager, kv_cache_gib=args.kv_cache_gib))
    load_s = time.perf_counter() - start
    tokenizer = policy.tokenizer
    chats = _chats(args.env, args.batch)
    greedy = SamplingConfig(max_new_tokens=args.new_tokens)
    sampled = SamplingConfig(max_new_tokens=args.new_tokens, temperature=1.0, top_p=0.95)
    policy.generate(chats[:4], SamplingConfig(max_new_tokens=8))  # warm-up

    out: dict = {"backend": args.child, "load_s": load_s, "torch_threads": torch.get_num_threads()}
    for label, sampling in (("greedy", greedy), ("sampled", sampled)):
        t = time.perf_counter()
        replies = policy.generate(chats, sampling, seed=1)
        seconds = time.perf_counter() - t
        tokens = sum(len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in replies)
        out[f"{label}_s"] = seconds
        out[f"{label}_tok_s"] = tokens / seconds
        out[f"{label}_replies"] = replies

    strategy = make_strategy(ESConfig(population=4, alpha=1e-3), total_steps=1, run_seed=0)
    members = strategy.ask(0)
    perturb, restore = [], []
    for member in members[: args.cycles]:
        t = time.perf_counter()
        with policy.perturbed(member):
            t_in = time.perf_counter()
        t_out = time.perf_counter()
        perturb.append(t_in - t)
        restore.append(t_out - t_in)
    t = time.perf_counter()
    policy.apply(strategy.tell(0, members, [0.0, 1.0, 2.0, 0.5]))
    out.update(
        perturb_s=statistics.median(perturb),
        restore_s=statistics.median(restore),
        apply_s=time.perf_counter() - t,
        fingerprint=policy.fingerprint(),
        peak_rss_mb=_peak_rss_mb(),
    )
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--env", default="sudoku")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument("--hf-attn", default="sdpa")
    parser.add_argument("--hf-python", default=sys.executable, help="interpreter for the HF side (e.g. .venv/bin/python)")
    parser.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0)
    parser.add_argument("--child", choices=("hf", "vllm"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        Path(args.out).write_text(json.dumps(_child(args)))
        return

    results = {}
    forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]
    for backend, python in (("hf", args.hf_python), ("vllm", sys.executable)):
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            command = [python, "-m", "benchmarks.vllm_vs_hf", *forwarded, "--child", backend, "--out", f.name]
            print(f"[{backend}] {' '.join(command)}", flush=True)
            t = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                print(done.stdout[-3000:], done.stderr[-6000:], sep="\n")
                raise SystemExit(f"{backend} benchmark failed ({done.returncode})")
            results[backend] = json.loads(Path(f.name).read_text())
            print(f"[{backend}] done in {time.perf_counter() - t:.0f}s", flush=True)

    hf, vl = results["hf"], results["vllm"]
    agree = sum(a == b for a, b in zip(hf["greedy_replies"], vl["greedy_replies"])) / len(hf["greedy_replies"])
    rows = [
        ("load (s)", "load_s"),
        (f"greedy B={args.batch}, {args.new_tokens} new tokens (s)", "greedy_s"),
        ("greedy reply tok/s", "greedy_tok_s"),
        (f"sampled B={args.batch} (s)", "sampled_s"),
        ("sampled reply tok/s", "sampled_tok_s"),
        ("perturb, median (s)", "perturb_s"),
        ("restore, median (s)", "restore_s"),
        ("apply G=4 update (s)", "apply_s"),
        ("peak RSS (MB)", "peak_rss_mb"),
    ]
    print(f"\nenv={args.env} dtype={args.dtype} hf_attn={args.hf_attn} batch={args.batch} new_tokens={args.new_tokens}")
    print(f"{'':44s} {'hf':>10s} {'vllm':>10s} {'vllm/hf':>8s}")
    for label, key in rows:
        ratio = vl[key] / hf[key] if hf[key] else float("nan")
        print(f"{label:44s} {hf[key]:10.2f} {vl[key]:10.2f} {ratio:8.2f}")
    print(f"greedy replies identical on {agree:.0%} of rows; fingerprints after the update equal: {hf['fingerprint'] == vl['fingerprint']}")
    print(f"torch threads: hf {hf['torch_threads']}, vllm {vl['torch_threads']}")
    out = Path("bench_results")
    out.mkdir(exist_ok=True)
    (out / "vllm_vs_hf.json").write_text(json.dumps({"args": vars(args), "results": results, "greedy_agreement": agree}, indent=1))


if __name__ == "__main__":
    main()
