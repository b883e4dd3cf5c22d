"""Peak memory of inference, an ES step and a GRPO step on the same model and batch, side by side.

    python -m benchmarks.memory [--population 4] [--tasks 16] [--group-size 4]

Each measurement runs in its own child process (a process's peak RSS only grows, so sharing one
process would hide the smaller peaks): (a) pure inference: G rollouts of N tasks with the unperturbed
model; (b) one ES training step with G members x N tasks (perturb, rollouts, restore, update);
(c) one GRPO step with G*N/K tasks x K samples (the same number of episodes), rollouts + scoring +
backprop + AdamW. Reports each peak RSS, the RSS right after loading the model, and ratios to (a).
Writes bench_results/memory.json and .md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

KINDS = ("inference", "es", "grpo")


def _child(kind: str, args: argparse.Namespace) -> dict:
    from rich.console import Console

    from esopt.dist import LocalEvaluator
    from esopt.envs import make_env
    from esopt.es import HistoryWriter
    from esopt.policy.hf import HFPolicy
    from esopt.rollout import rollout
    from esopt.train.config import load_config
    from esopt.train.logging import peak_rss_mb

    es_config = load_config(args.config)
    policy = HFPolicy.load(es_config.model)
    loaded_mb = peak_rss_mb()
    episodes = args.population * args.tasks
    with tempfile.TemporaryDirectory() as runs:
        if kind == "inference":
            env = make_env(es_config.env.name, es_config.env.options)
            tasks = env.tasks("train", args.tasks, 0)
            for _ in range(args.population):
                rollout(policy, env, tasks, es_config.rollout)
        elif kind == "es":
            from esopt.train.es_trainer import ESTrainer

            es_config.es.population, es_config.tasks_per_step, es_config.steps = args.population, args.tasks, 1
            es_config.eval_tasks, es_config.eval_every, es_config.trajectories_per_step = 1, 0, 0
            es_config.runs_dir, es_config.run_name = runs, "es"
            trainer = ESTrainer.start(es_config, policy=policy, console=Console(quiet=True))
            trainer.history = HistoryWriter(Path(runs) / "es" / "history.jsonl")
            trainer.evaluator = LocalEvaluator(policy, trainer.env)
            trainer._train_step(0)  # one step without the evaluations and checkpoint around it
        else:
            from esopt.train.grpo import GRPOConfig, GRPOTrainer
            from esopt.train.pg_common import load_pg_config

            config = load_pg_config(GRPOConfig, args.grpo_config)
            config.model, config.env.name, config.env.options = es_config.model, es_config.env.name, es_config.env.options
            config.rollout = es_config.rollout
            config.group_size = args.group_size
            config.tasks_per_step = max(1, episodes // args.group_size)
            config.steps, config.eval_tasks, config.trajectories_per_step = 1, 1, 0
            config.runs_dir, config.run_name = runs, "grpo"
            trainer = GRPOTrainer.start(config, policy=policy, console=Console(quiet=True))
            trainer.train_step(0)
    return {"kind": kind, "episodes": episodes, "loaded_mb": loaded_mb, "peak_rss_mb": peak_rss_mb()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/sudoku_demo.yaml", help="workload (model, env, rollout) of all three")
    parser.add_argument("--grpo-config", default="configs/grpo_sudoku_demo.yaml", help="GRPO optimiser settings")
    parser.add_argument("--population", type=int, default=4, help="G")
    parser.add_argument("--tasks", type=int, default=16, help="N tasks per member")
    parser.add_argument("--group-size", type=int, default=4, help="GRPO samples per task (K)")
    parser.add_argument("--out", default="bench_results", help="output directory")
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args)))
        return

    results = {}
    for kind in KINDS:
        cmd = [sys.executable, "-m", "benchmarks.memory", "--child", kind, *sys.argv[1:]]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{kind} measurement failed:\n{done.stderr[-3000:]}")
        results[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    base = results["inference"]["peak_rss_mb"]
    lines = [
        f"Workload: {args.config}, G={args.population} x N={args.tasks} episodes (GRPO: K={args.group_size}).",
        "",
        "| run | RSS after load (MB) | peak RSS (MB) | peak / inference |",
        "|---|---|---|---|",
        *[
            f"| {kind} | {r['loaded_mb']:.0f} | {r['peak_rss_mb']:.0f} | {r['peak_rss_mb'] / base:.2f} |"
            for kind, r in results.items()
        ],
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory.json").write_text(json.dumps(results, indent=2))
    (out / "memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
