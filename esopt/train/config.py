"""The resolved configuration of a training run (saved as config.yaml in its run directory)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from esopt.confutil import ConfigError, load_yaml, opt, to_dict
from esopt.envs import make_env
from esopt.es import ESConfig
from esopt.policy.hf import ModelConfig
from esopt.rollout import RolloutConfig


@dataclass
class EnvSection:
    name: str = opt("sudoku", "environment name (`esopt envs` lists them)")
    options: dict = opt({}, "env-specific options, e.g. size and empty_cells for sudoku (`esopt envs` lists them)")


@dataclass
class TrainConfig:
    model: ModelConfig = opt(ModelConfig(), "the policy model")
    env: EnvSection = opt(EnvSection(), "the task environment")
    es: ESConfig = opt(ESConfig(), "evolution-strategy hyperparameters")
    rollout: RolloutConfig = opt(RolloutConfig(), "how episodes are run (training and evaluation)")
    steps: int = opt(10, "ES steps (updates)")
    tasks_per_step: int = opt(8, "N: training tasks per step; every member sees the same N tasks")
    eval_tasks: int = opt(32, "held-out tasks per evaluation (the same tasks every time)")
    eval_seed: int = opt(0, "seed of the held-out task set (fixed, so runs with different seeds compare)")
    eval_every: int = opt(5, "evaluate every k steps (0 = only before and after training)")
    seed: int = opt(0, "run seed: member seeds, task batches and decoding seeds derive from it")
    checkpoint_every: int = opt(0, "save a checkpoint every k steps (0 = only the final one)")
    keep_checkpoints: int = opt(2, "how many checkpoints to keep (the newest)")
    trajectories_per_step: int = opt(2, "training episodes saved per step (from member 0), besides all eval episodes")
    runs_dir: str = opt("runs", "parent directory of run directories")
    run_name: str | None = opt(None, "run directory name (default: <env>__<method>__<seed>__<time>)")

    def validate(self) -> None:
        self.es.validate()
        for name in ("steps", "tasks_per_step", "eval_tasks"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("eval_every", "checkpoint_every", "trajectories_per_step"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.keep_checkpoints < 1:
            raise ConfigError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        make_env(self.env.name, self.env.options)  # validates the env options

    @property
    def method(self) -> str:
        return self.es.strategy

    def to_yaml(self) -> str:
        return yaml.safe_dump(to_dict(self), sort_keys=False)


def load_config(path: str | Path | None) -> TrainConfig:
    """TrainConfig from a YAML file (None = all defaults). Unknown keys are errors."""
    return load_yaml(TrainConfig, path)
