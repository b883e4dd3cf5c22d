"""The settings of a Trace2Skill experiment, and the names of its conditions."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from esopt.confutil import ConfigError, opt
from esopt.skills.analyst import AnalystConfig
from esopt.skills.distill import DistillConfig
from esopt.train.config import TrainConfig

CONDITIONS = ("baseline", "trace2skill", "es", "es+trace2skill", "coevolve")
LABELS = {
    "baseline": "No Skill",
    "trace2skill": "Trace2Skill",
    "es": "Agentic ESOpt + No Skill",
    "es+trace2skill": "Agentic ESOpt + Trace2Skill",
    "coevolve": "Co-evolution (ES <-> skill)",
}
RESULT_FILE = "result.json"


@dataclass
class SkillRunConfig(TrainConfig):
    """A TrainConfig (model, env, ES, rollout, steps, ... used by the ES conditions) plus the skill settings."""

    skill: str = opt("", "starting skill document of every distillation ('' = a two-section seed document)")
    analyst: AnalystConfig = opt(AnalystConfig(), "who proposes patches and how")
    distill: DistillConfig = opt(DistillConfig(), "hierarchical merge and skill limits")
    samples: int = opt(4, "k: episodes per held-out task for Mean@k / Pass@k")
    eval_temperature: float = opt(0.7, "sampling temperature of the Mean@k / Pass@k evaluation")
    iterations: int = opt(2, "trace2skill: rounds of (frozen-model rollouts -> distillation)")
    trace_tasks: int = opt(16, "trace2skill: train tasks rolled out per round")
    skill_every: int = opt(2, "coevolve: ES steps between skill updates")
    es_run: str = opt("", "es+trace2skill: the ES run directory to distil from ('' = <experiment>/es)")

    def check(self) -> None:
        super().check()
        for name in ("samples", "trace_tasks", "skill_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.iterations < 0:
            raise ConfigError(f"iterations must be >= 0, got {self.iterations}")
        if self.eval_temperature < 0:
            raise ConfigError(f"eval_temperature must be >= 0, got {self.eval_temperature}")
        if self.skill and not Path(self.skill).is_file():
            raise ConfigError(f"skill document not found: {self.skill}")

    @property
    def experiment_dir(self) -> Path:
        return Path(self.runs_dir) / (self.run_name or f"skill_{self.env.name}__{self.seed}")

    def train_config(self, run_name: str, skill: str = "") -> TrainConfig:
        """The plain TrainConfig of this experiment's ES runs (saved as their config.yaml, so
        `esopt replay` works on them). Every member-0 training episode is kept, for distillation."""
        config = TrainConfig(**{f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(TrainConfig)})
        config.runs_dir = str(self.experiment_dir)
        config.run_name = run_name
        config.rollout.skill = skill
        config.trajectories_per_step = max(config.trajectories_per_step, config.tasks_per_step)
        return config
