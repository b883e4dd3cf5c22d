"""The resolved configuration of a training run (saved as config.yaml in its run directory)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from esopt.confutil import Config, ConfigError, load_yaml, opt
from esopt.es import ESConfig
from esopt.policy.config import ModelConfig
from esopt.rollout import RolloutConfig
from esopt.runconfig import EnvRunConfig, EnvSection
from esopt.train.logging import REPORT_TO_HELP, check_report_to


DIST_MODES = ("sync", "async")


@dataclass
class DistSection(Config):
    """Where members are evaluated: in the trainer process, or on Ray actors with one replica each."""

    workers: int = opt(
        0,
        "Ray actors evaluating members, each holding its own policy replica (0 = evaluate in the trainer "
        "process, no Ray; >0 needs the `ray` extra: pip install 'esopt[ray]')",
    )
    ray_address: str | None = opt(
        None, "join this running Ray cluster (e.g. 'auto'); null = start a local one sized to this machine's cores"
    )
    threads_per_worker: int = opt(
        0, "torch CPU threads (and Ray CPUs) per actor; 0 = cores // workers. workers x threads must fit the cores"
    )
    mode: str = opt(
        "sync",
        "'sync': each step evaluates all G members, then updates. 'async': bounded-staleness asynchronous ES "
        "(method async-es): workers evaluate members continuously against the weights version they hold; a result "
        "more than max_lag updates stale is discarded; an update is committed every commit_every accepted results "
        "(needs workers >= 1; max_lag 0 with commit_every = population is exactly synchronous ES)",
    )
    max_lag: int = opt(1, "async: L, the largest lag (updates committed since a result's weights version) still used")
    commit_every: int = opt(0, "async: M, accepted results per committed update (0 = es.population)")
    max_restarts: int = opt(3, "dead workers replaced (replayed from the base weights) per step before the run fails")

    def check(self) -> None:
        for name in ("workers", "threads_per_worker", "max_lag", "commit_every", "max_restarts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"dist.{name} must be an integer >= 0, got {value!r}")
        if self.mode not in DIST_MODES:
            raise ConfigError(f"dist.mode must be one of {', '.join(DIST_MODES)}, got {self.mode!r}")
        if self.mode == "async" and self.workers < 1:
            raise ConfigError("dist.mode async needs dist.workers >= 1 (asynchronous ES runs on Ray workers)")


@dataclass
class TrainingRunConfig(EnvRunConfig):
    """What ES and GRPO/PPO runs share, validated in one place: held-out evaluation, the forgetting probe,
    saved trajectories and where metrics are reported."""

    eval_tasks: int = opt(32, "held-out tasks per evaluation (the same tasks every time)")
    eval_seed: int = opt(0, "seed of the held-out task set (fixed, so runs with different seeds compare)")
    eval_split: str = opt("eval", "split of the periodic evaluation: 'eval' (held out, for reporting) or 'val' (for choosing settings)")
    eval_every: int = opt(5, "evaluate every k steps (0 = only before and after training)")
    eval_env_options: dict = opt(
        {},
        "env options held-out evaluation sets differently from training (same tasks): e.g. train on the first turn "
        "of each Sudoku (env.max_turns 1 with partial credit), evaluate whole puzzles ({max_turns: 3})",
    )
    probe_tasks: int = opt(32, "forgetting probe before and after training: tasks of another env (0 = no probe; see train/forgetting.py)")
    trajectories_per_step: int = opt(2, "training episodes saved per step, besides all eval episodes")
    report_to: str = opt("auto", REPORT_TO_HELP)

    def check(self) -> None:
        super().check()
        check_report_to(self.report_to)
        if self.eval_tasks < 1:
            raise ConfigError(f"eval_tasks must be >= 1, got {self.eval_tasks}")
        for name in ("eval_every", "trajectories_per_step", "probe_tasks"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.eval_split not in ("val", "eval"):
            raise ConfigError(f"eval_split must be 'val' or 'eval', got {self.eval_split!r}")
        if not isinstance(self.eval_env_options, dict):
            raise ConfigError(f"eval_env_options must be a mapping of env options, got {self.eval_env_options!r}")
        self.make_eval_env()  # validates them

    def eval_env_section(self) -> EnvSection:
        """The env held-out evaluation plays: training's, with eval_env_options set."""
        return EnvSection(name=self.env.name, options={**self.env.options, **self.eval_env_options})

    def make_eval_env(self):
        from esopt.envs import make_env

        section = self.eval_env_section()
        return make_env(section.name, section.options)


@dataclass
class TrainConfig(TrainingRunConfig):
    model: ModelConfig = opt(ModelConfig(), "the policy model")
    es: ESConfig = opt(ESConfig(), "evolution-strategy hyperparameters")
    rollout: RolloutConfig = opt(RolloutConfig(), "how episodes are run (training and evaluation)")
    dist: DistSection = opt(DistSection(), "where members are evaluated (local or Ray workers; sync or async ES)")
    steps: int = opt(10, "ES steps (updates)")
    tasks_per_step: int = opt(8, "N: training tasks per step; every member sees the same N tasks")
    samples_per_task: int = opt(
        1,
        "k: each member plays every task k times, with k sampler draws that are the same for every member (common "
        "random numbers), and its fitness is the mean over the N x k episodes: an estimate of its expected reward "
        "that varies smoothly with the weights. Repeated prompts share their prefill, so short replies make it cheap",
    )
    eval_greedy: bool = opt(True, "evaluate with greedy decoding whatever rollout.sampling says (false: evaluate with rollout.sampling)")
    seed: int = opt(0, "run seed: member seeds, task batches and decoding seeds derive from it")
    checkpoint_every: int = opt(0, "save a checkpoint every k steps (0 = only the final one)")
    keep_checkpoints: int = opt(2, "how many checkpoints to keep (the newest)")

    run_marker = "history.jsonl"

    def run_label(self) -> str:
        return f"{self.env.name}__{self.method}"

    def existing_run_hint(self, run_dir: Path) -> str:
        return f"resume it with --resume {run_dir}"

    def check(self) -> None:
        super().check()
        if self.dist.mode == "async" and self.es.strategy == "copes" and self.dist.max_lag > 0:
            raise ConfigError("dist.mode async with es.strategy copes needs dist.max_lag 0 (one update holds one partition)")
        # What this machine has installed, not a value of the run: checked here, so a Ray run's
        # config.yaml still loads (for replay) where Ray is missing.
        if self.dist.workers > 0 and importlib.util.find_spec("ray") is None:
            raise ConfigError(
                f"dist.workers {self.dist.workers} evaluates members on Ray, which is not installed; install it with: "
                "pip install 'esopt[ray]'  (or set dist.workers 0)"
            )
        for name in ("steps", "tasks_per_step", "samples_per_task"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.samples_per_task > 1 and self.rollout.sampling.greedy:
            raise ConfigError(
                f"samples_per_task {self.samples_per_task} repeats each task under greedy decoding, which gives the same "
                "episode every time; set rollout.sampling.temperature > 0 (or samples_per_task 1)"
            )
        if self.rollout.expected_reward and self.model.backend != "hf":
            raise ConfigError(
                f"rollout.expected_reward scores replies by their log-probabilities, which the {self.model.backend} "
                "backend does not provide; use --model.backend hf"
            )
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if self.keep_checkpoints < 1:
            raise ConfigError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")

    @property
    def method(self) -> str:
        """The run's method name: the ES strategy, with +lowrank / +table and +async when those are on."""
        return (
            self.es.strategy
            + (f"+{self.es.noise}" if self.es.noise != "full" else "")
            + ("+async" if self.dist.mode == "async" else "")
        )

    @property
    def commit_every(self) -> int:
        """Async ES: accepted results per update (dist.commit_every, 0 = the population)."""
        return self.dist.commit_every or self.es.population


def load_config(path: str | Path | None) -> TrainConfig:
    """TrainConfig from a YAML file (None = all defaults). Unknown keys are errors."""
    return load_yaml(TrainConfig, path)
