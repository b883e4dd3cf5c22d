"""A training run from Python instead of the command line: build the config, run the trainer, read the run.

`esopt train --config configs/sudoku_demo.yaml --steps 4` does the same; from Python you can build configs
in a loop (a sweep), pass your own policy object, and use the results without parsing files.

    python examples/python_api.py                         # SmolLM2-135M-Instruct, 4x4 Sudoku, a few minutes on a CPU
    python examples/python_api.py --model DIR --steps 2   # any local Hugging Face model directory
"""

from __future__ import annotations

import argparse
import json
import tempfile

from esopt.train.config import TrainConfig
from esopt.train.es_trainer import ESTrainer


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct) or a model directory")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--runs_dir", default=None, help="where the run directory goes (default: a temporary one)")
    args = parser.parse_args(argv)

    # Every field of every section is a dataclass attribute; `esopt train --help` lists them all.
    config = TrainConfig()
    config.model.path = args.model
    config.env.name = "sudoku"
    config.env.options = {"size": 4, "empty_cells": 2, "grammar": "legal"}
    config.es.population, config.es.sigma, config.es.sigma_final, config.es.alpha = 4, 1e-3, 5e-4, 5e-4
    config.rollout.sampling.max_new_tokens = 10
    config.steps, config.tasks_per_step, config.eval_tasks, config.eval_every = args.steps, 4, 8, 0
    config.runs_dir = args.runs_dir or tempfile.mkdtemp(prefix="esopt-runs-")
    config.run_name = "python_api"
    config.validate()  # the same checks as the CLI: a bad value is a ConfigError naming the field

    summary = ESTrainer.start(config).run()  # writes config.yaml, history.jsonl, metrics.jsonl, a checkpoint, report.md

    print(f"held-out success {summary['before']['success']:.3f} -> {summary['after']['success']:.3f} "
          f"on {summary['eval_n']} tasks; run directory {summary['run_dir']}")
    with open(f"{summary['run_dir']}/metrics.jsonl") as f:
        train = [r for r in map(json.loads, f) if "train/fitness_mean" in r]
    print("mean training fitness per step:", [round(r["train/fitness_mean"], 3) for r in train])
    return summary


if __name__ == "__main__":
    main()
