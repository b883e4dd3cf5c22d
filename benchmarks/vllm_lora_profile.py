"""Where vLLM's time goes when the population runs as LoRA adapters: torch-profiler op split, with and without.

    .venv-vllm/bin/python -m benchmarks.vllm_lora_profile [--population 8] [--tasks 8] [--rank 1] [--top 12]

One in-process vLLM engine with room for G adapters (make bench's workload: configs/bench_decode.yaml, G x N
prompts, 64-token greedy replies). The same G x N prompts are generated twice, untimed once each for warm-up,
then under torch.profiler: (a) with the unperturbed weights, (b) each prompt with its member's rank-r adapter
(esopt's low-rank ES step). Prints each run's wall-clock and the ops that took the most self CPU time, so the
cost the adapters add is attributed to the ops that add it.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/bench_decode.yaml")
    parser.add_argument("--population", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()

    from torch.profiler import ProfilerActivity, profile

    from esopt.envs import make_env
    from esopt.es import make_strategy
    from esopt.policy import load_policy
    from esopt.population.local import evaluate_population
    from esopt.rollout import rollout
    from esopt.train.config import load_config
    from esopt.train.es_trainer import engine_model_config, step_work

    config = load_config(args.config)
    config.model.backend = "vllm"
    config.model.vllm = {"multiprocessing": False}  # the engine in this process, where the profiler sees it
    config.es.population, config.tasks_per_step = args.population, args.tasks
    config.es.noise, config.es.rank, config.es.lowrank_vectors = "lowrank", args.rank, "frozen"
    config.validate()
    policy = load_policy(engine_model_config(config))
    env = make_env(config.env.name, config.env.options)
    tasks, seed = step_work(config, env, 0)
    members = make_strategy(config.es, total_steps=1, run_seed=config.seed).ask(0)

    def plain() -> int:  # the same G x N episodes with the unperturbed weights
        return rollout(policy, env, tasks * len(members), config.rollout, seed=seed).generated_tokens

    def adapters() -> int:  # what a low-rank ES step runs
        results = evaluate_population(policy, env, members, tasks, config.rollout, seed)
        return sum(r.generated_tokens for r in results)

    for name, run in (("without adapters", plain), ("with G adapters", adapters)):
        run()  # warm-up at the timed shapes
        policy.reset_prefix_cache()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            tokens = run()
            seconds = time.perf_counter() - t
        events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
        total = sum(e.self_cpu_time_total for e in events)
        print(f"\n## {name}: {seconds:.2f} s, {tokens} tokens, {tokens / seconds:.1f} tokens/s")
        print("| op | self CPU s | share | calls |\n|---|---|---|---|")
        for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[: args.top]:
            print(f"| {e.key} | {e.self_cpu_time_total / 1e6:.2f} | {e.self_cpu_time_total / total:.1%} | {e.count} |")
    policy.close()


if __name__ == "__main__":
    main()
