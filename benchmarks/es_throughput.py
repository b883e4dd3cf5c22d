"""ES training throughput vs pure batched inference on the same workload, measured side by side.

    python -m benchmarks.es_throughput [--population 4] [--tasks 16] [--steps 2] [--warmup-steps 0] [--rank 1]
                                       [--lowrank-sequential]

(a) inference: G generate calls of N Sudoku prompts each (the shapes an ES step uses), unperturbed;
(b) ES, full-rank noise: whole training steps (perturb, rollouts, restore, update) of the trainer,
    members one after another;
(c) ES, low-rank noise (EGGROLL, --rank r): the same steps with `es.noise lowrank`, the G members
    population-batched into one rollout of G*N episodes over the shared base weights;
(d) with --lowrank-sequential: low-rank noise evaluated member by member (materialised weights), to
    separate the effect of batching from that of the cheaper noise.
Every ES run starts from the same base weights; its first --warmup-steps steps (new batch shapes: kernel
setup) are run but not timed. Reports episodes per wall-clock second and per process-CPU second (the
latter is less sensitive to other processes competing for the cores), their ratios, and each ES step's
time split. Writes bench_results/.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import tempfile
import time
from pathlib import Path
from unittest import mock

from rich.console import Console

from esopt.dist.local import LocalEvaluator
from esopt.envs import make_env
from esopt.policy.hf import HFPolicy
from esopt.rollout import rollout
from esopt.train import es_trainer
from esopt.train.config import load_config
from esopt.train.es_trainer import ESTrainer
from esopt.train.logging import peak_rss_mb, read_metrics

SPLIT = ("generate_s", "env_s", "perturb_s", "restore_s", "update_s")


class _CPUClock:
    """Process CPU seconds spent inside ES steps (sampled around the trainer's _train_step)."""

    def __init__(self, warmup: int):
        self.warmup, self.seconds = warmup, 0.0

    def wrap(self, train_step):
        def timed(trainer, step):
            start = time.process_time()
            try:
                return train_step(trainer, step)
            finally:
                if step >= self.warmup:
                    self.seconds += time.process_time() - start

        return timed


def _es_run(config, policy: HFPolicy, base: dict, name: str, warmup: int, batching: bool = True) -> dict:
    """Train warmup + config.steps steps from `base` weights; episodes/s of the timed steps and their time split."""
    policy.load_master_weights(base)
    timed_steps, config.steps = config.steps, config.steps + warmup
    evaluator = functools.partial(LocalEvaluator, population_batching=batching)
    clock = _CPUClock(warmup)
    with (
        tempfile.TemporaryDirectory() as runs,
        mock.patch.object(es_trainer, "LocalEvaluator", evaluator),
        mock.patch.object(ESTrainer, "_train_step", clock.wrap(ESTrainer._train_step)),
    ):
        config.runs_dir, config.run_name = runs, name
        ESTrainer.start(config, policy=policy, console=Console(quiet=True)).run()
        steps = [r for r in read_metrics(Path(runs) / name) if "time/step_s" in r and r["step"] > warmup]
    config.steps = timed_steps
    seconds = sum(r["time/step_s"] for r in steps)
    episodes = len(steps) * config.es.population * config.tasks_per_step
    return {
        "episodes_per_s": episodes / seconds,
        "episodes_per_cpu_s": episodes / clock.seconds,
        "step_s": seconds / len(steps),
        "split": {k: sum(r[f"time/{k}"] for r in steps) / seconds for k in SPLIT},
        "fitness_mean": [r["train/fitness_mean"] for r in steps],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/sudoku_demo.yaml", help="workload (model, env, rollout)")
    parser.add_argument("--population", type=int, default=4, help="G")
    parser.add_argument("--tasks", type=int, default=16, help="N tasks per member")
    parser.add_argument("--steps", type=int, default=2, help="ES steps timed")
    parser.add_argument("--warmup-steps", type=int, default=0, help="untimed ES steps before them (per run)")
    parser.add_argument("--rank", type=int, default=1, help="rank r of the low-rank (EGGROLL) run")
    parser.add_argument("--lowrank-sequential", action="store_true", help="also time low-rank noise member by member")
    parser.add_argument("--out", default="bench_results", help="output directory")
    args = parser.parse_args()

    config = load_config(args.config)
    config.es.population, config.tasks_per_step, config.steps = args.population, args.tasks, args.steps
    config.eval_tasks, config.eval_every, config.trajectories_per_step = 1, 0, 0
    policy = HFPolicy.load(config.model)
    base = {name: t.clone() for name, t in policy.master_weights().items()}
    env = make_env(config.env.name, config.env.options)
    tasks = env.tasks("train", args.tasks, 0)

    rollout(policy, env, tasks, config.rollout)  # warm-up at the timed shapes (kernels, grammar tables)
    start, cpu = time.perf_counter(), time.process_time()
    episodes = 0
    for _ in range(args.population):
        episodes += len(rollout(policy, env, tasks, config.rollout).trajectories)
    inference_s, inference_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    inference_rss = peak_rss_mb()
    inference = episodes / inference_s

    full = copy.deepcopy(config)
    full.es.noise = "full"
    lowrank = copy.deepcopy(config)
    lowrank.es.noise, lowrank.es.rank, lowrank.es.lowrank_vectors = "lowrank", args.rank, "frozen"
    runs = {"full_sequential": _es_run(full, policy, base, "full", args.warmup_steps)}
    full_rss = peak_rss_mb()
    runs["lowrank_batched"] = _es_run(lowrank, policy, base, "lowrank", args.warmup_steps)
    if args.lowrank_sequential:
        runs["lowrank_sequential"] = _es_run(lowrank, policy, base, "lowrank_seq", args.warmup_steps, batching=False)
    fullrate = runs["full_sequential"]["episodes_per_s"]
    fullcpu = runs["full_sequential"]["episodes_per_cpu_s"]
    result = {
        "workload": {
            "config": args.config, "G": args.population, "N": args.tasks, "steps": args.steps,
            "warmup_steps": args.warmup_steps, "dtype": config.model.dtype, "rank": args.rank,
        },
        "inference_episodes_per_s": inference,
        "inference_episodes_per_cpu_s": episodes / inference_cpu_s,
        "es_episodes_per_s": fullrate,
        "es_over_inference": fullrate / inference,
        "es_step_split": runs["full_sequential"]["split"],
        "runs": runs,
        "ratios": {
            **{f"{k}_over_inference": v["episodes_per_s"] / inference for k, v in runs.items()},
            **{f"{k}_over_full_sequential": v["episodes_per_s"] / fullrate for k, v in runs.items() if k != "full_sequential"},
            **{
                f"{k}_over_full_sequential_cpu": v["episodes_per_cpu_s"] / fullcpu
                for k, v in runs.items()
                if k != "full_sequential"
            },
        },
        "peak_rss_mb": {"inference": inference_rss, "es_training": full_rss, "all": peak_rss_mb()},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "es_throughput.json").write_text(json.dumps(result, indent=2))
    labels = {
        "full_sequential": "ES full-rank, sequential",
        "lowrank_batched": f"ES low-rank r={args.rank}, population-batched",
        "lowrank_sequential": f"ES low-rank r={args.rank}, sequential",
    }
    lines = [
        "| measure | value |",
        "|---|---|",
        f"| pure inference (episodes/s) | {inference:.2f} |",
        *[f"| {labels[k]} (episodes/s) | {v['episodes_per_s']:.2f} |" for k, v in runs.items()],
        *[f"| {labels[k]} / inference | {v['episodes_per_s'] / inference:.2f} |" for k, v in runs.items()],
        *[
            f"| {labels[k]} / ES full-rank sequential | {v['episodes_per_s'] / fullrate:.2f} |"
            for k, v in runs.items()
            if k != "full_sequential"
        ],
        f"| pure inference (episodes per CPU-s) | {result['inference_episodes_per_cpu_s']:.2f} |",
        *[f"| {labels[k]} (episodes per CPU-s) | {v['episodes_per_cpu_s']:.2f} |" for k, v in runs.items()],
        *[
            f"| {labels[k]} / ES full-rank sequential, per CPU-s | {v['episodes_per_cpu_s'] / fullcpu:.2f} |"
            for k, v in runs.items()
            if k != "full_sequential"
        ],
        *[
            f"| {labels[k]}: step share {s[:-2]} | {v['split'][s]:.1%} |"
            for k, v in runs.items()
            for s in SPLIT
        ],
        f"| peak RSS inference / full-rank training / all (MB) | {inference_rss:.0f} / {full_rss:.0f} / {result['peak_rss_mb']['all']:.0f} |",
    ]
    (out / "es_throughput.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
