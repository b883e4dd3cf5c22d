"""ES training throughput vs pure batched inference on the same workload, measured side by side.

    python -m benchmarks.es_throughput [--population 4] [--tasks 16] [--steps 2]

(a) inference: G generate calls of N Sudoku prompts each (the shapes an ES step uses), unperturbed;
(b) ES: whole training steps (perturb, rollouts, restore, update) of the trainer on the same env.
Reports episodes/s for both, their ratio, and the ES step's time split. Writes bench_results/.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console

from esopt.envs import make_env
from esopt.policy.hf import HFPolicy
from esopt.rollout import rollout
from esopt.train.config import load_config
from esopt.train.es_trainer import ESTrainer
from esopt.train.logging import peak_rss_mb, read_metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/sudoku_demo.yaml", help="workload (model, env, rollout)")
    parser.add_argument("--population", type=int, default=4, help="G")
    parser.add_argument("--tasks", type=int, default=16, help="N tasks per member")
    parser.add_argument("--steps", type=int, default=2, help="ES steps timed")
    parser.add_argument("--out", default="bench_results", help="output directory")
    args = parser.parse_args()

    config = load_config(args.config)
    config.es.population, config.tasks_per_step, config.steps = args.population, args.tasks, args.steps
    config.eval_tasks, config.eval_every, config.trajectories_per_step = 1, 0, 0
    policy = HFPolicy.load(config.model)
    env = make_env(config.env.name, config.env.options)
    tasks = env.tasks("train", args.tasks, 0)

    rollout(policy, env, tasks[:2], config.rollout)  # warm-up (kernels, grammar tables)
    start = time.perf_counter()
    episodes = 0
    for _ in range(args.population):
        episodes += len(rollout(policy, env, tasks, config.rollout).trajectories)
    inference_s = time.perf_counter() - start
    inference_rss = peak_rss_mb()

    with tempfile.TemporaryDirectory() as runs:
        config.runs_dir, config.run_name = runs, "bench"
        ESTrainer.start(config, policy=policy, console=Console(quiet=True)).run()
        steps = [r for r in read_metrics(Path(runs) / "bench") if "time/step_s" in r]
    es_s = sum(r["time/step_s"] for r in steps)
    es_episodes = len(steps) * args.population * args.tasks
    split = {k: sum(r[f"time/{k}"] for r in steps) / es_s for k in ("generate_s", "env_s", "perturb_s", "restore_s", "update_s")}
    result = {
        "workload": {"config": args.config, "G": args.population, "N": args.tasks, "steps": args.steps, "dtype": config.model.dtype},
        "inference_episodes_per_s": episodes / inference_s,
        "es_episodes_per_s": es_episodes / es_s,
        "es_over_inference": (es_episodes / es_s) / (episodes / inference_s),
        "es_step_split": split,
        "peak_rss_mb": {"inference": inference_rss, "es_training": peak_rss_mb()},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "es_throughput.json").write_text(json.dumps(result, indent=2))
    lines = [
        "| measure | value |",
        "|---|---|",
        f"| pure inference (episodes/s) | {result['inference_episodes_per_s']:.2f} |",
        f"| ES training (episodes/s) | {result['es_episodes_per_s']:.2f} |",
        f"| ES / inference | {result['es_over_inference']:.2f} |",
        *[f"| ES step share: {k[:-2]} | {v:.1%} |" for k, v in split.items()],
        f"| peak RSS inference / training (MB) | {inference_rss:.0f} / {result['peak_rss_mb']['es_training']:.0f} |",
    ]
    (out / "es_throughput.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
