"""The ES trainer: ask -> evaluate members inside perturbed() -> shape -> update, with evals,
checkpoints, an append-only update history, resume and a report."""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from esopt.confutil import ConfigError, to_dict
from esopt.population import Evaluator, LocalEvaluator
from esopt.population.async_es import AsyncES
from esopt.population.replica import model_policy
from esopt.envs import make_env
from esopt.machine import changes_since
from esopt.es import HistoryWriter, derive_seed, make_strategy, read_history
from esopt.policy import load_policy
from esopt.policy.base import Policy
from esopt.rollout import RolloutConfig, rollout
from esopt.train.config import TrainConfig, load_config
from esopt.train.diagnostics import BaseSnapshot, trained_names
from esopt.train.forgetting import log_probe
from esopt.train.logging import MetricsLogger, peak_rss_mb, read_metrics, write_trajectories
from esopt.train.report import write_report

CHECKPOINT_PREFIX = "step_"


def read_run_history(run_dir: Path) -> list:
    """The updates in a run's history.jsonl (none if it has none yet); a damaged file is a ConfigError
    naming the bad line, not a traceback."""
    path = Path(run_dir) / "history.jsonl"
    if not path.exists():
        return []
    try:
        history = read_history(path)
    except (ValueError, KeyError, TypeError) as e:  # a corrupt middle line, or a record missing its fields
        raise ConfigError(f"run directory {run_dir} is damaged: {e}") from None
    for expected, update in enumerate(history):
        if update.step != expected:
            raise ConfigError(f"run directory {run_dir} is damaged: {path} is out of order at line {expected + 1}")
    return history


def checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """(updates applied, directory) of every complete checkpoint, oldest first."""
    found = []
    for path in (run_dir / "checkpoints").glob(CHECKPOINT_PREFIX + "*"):
        if (path / "esopt.json").exists():  # written last: its presence marks a complete checkpoint
            found.append((int(path.name[len(CHECKPOINT_PREFIX) :]), path))
    return sorted(found)


def step_work(config: TrainConfig, env, step: int) -> tuple[list, int]:
    """The episodes (each task samples_per_task times in a row) and decoding seed of the members evaluated at
    weights version `step`."""
    tasks = env.tasks("train", config.tasks_per_step, derive_seed(config.seed, "tasks", step))
    episodes = [task for task in tasks for _ in range(config.samples_per_task)]
    return episodes, derive_seed(config.seed, "decode", step)  # common random numbers across members


def eval_rollout_config(config: TrainConfig) -> RolloutConfig:
    """The rollout settings of held-out evaluation: training's, decoded greedily when eval_greedy is set, and
    always played as real episodes (never scored by rollout.expected_reward)."""
    rollout_config = config.rollout.real_episodes()
    if not config.eval_greedy or rollout_config.sampling.greedy:
        return rollout_config
    return dataclasses.replace(rollout_config, sampling=dataclasses.replace(rollout_config.sampling, temperature=0.0))


@dataclass
class EvalResult:
    step: int
    metrics: dict[str, float]
    seconds: float


class ESTrainer:
    def __init__(
        self,
        config: TrainConfig,
        run_dir: Path,
        policy: Policy,
        console: Console | None = None,
        policy_factory: Callable[[], Policy] | None = None,
    ):
        """`policy_factory` (dist.workers > 0): a picklable callable each Ray worker calls to build its
        replica with the run's base weights; default: load config.model."""
        config.validate()
        self.config = config
        self.run_dir = Path(run_dir)
        self.policy = policy
        self.console = console or Console()
        self.env = make_env(config.env.name, config.env.options)
        self.strategy = make_strategy(config.es, config.steps, config.seed)
        self.strategy.prepare(policy.master_weights())  # scope and noise fit this model (ConfigError if not)
        self.eval_env = config.make_eval_env()
        self.eval_tasks = self.eval_env.tasks(config.eval_split, config.eval_tasks, config.eval_seed)
        self.policy_factory = policy_factory or functools.partial(model_policy, config.model)
        self.evaluator: Evaluator | None = None  # built by run(), once the weights are restored
        self.async_es: AsyncES | None = None
        self._restore_point: tuple[Path | None, int, list] = (None, 0, [])
        """(checkpoint or None = base weights, its update count, the updates replayed after it)."""

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        config: TrainConfig,
        policy: Policy | None = None,
        console: Console | None = None,
        policy_factory: Callable[[], Policy] | None = None,
    ) -> "ESTrainer":
        """A new run: creates the run directory and saves the resolved config."""
        config.validate()
        run_dir = config.create_run_dir()
        return cls(config, run_dir, policy or load_policy(engine_model_config(config)), console, policy_factory)

    @classmethod
    def resume(
        cls,
        run_dir: str | Path,
        policy: Policy | None = None,
        console: Console | None = None,
        policy_factory: Callable[[], Policy] | None = None,
    ) -> "ESTrainer":
        """Continue a run from its directory: base weights + latest checkpoint + history replay."""
        run_dir = Path(run_dir)
        if not (run_dir / "config.yaml").exists():
            raise ConfigError(f"{run_dir} is not a run directory (no config.yaml)")
        config = load_config(run_dir / "config.yaml")
        read_run_history(run_dir)  # a damaged history fails here, before the model is loaded
        trainer = cls(config, run_dir, policy or load_policy(engine_model_config(config)), console, policy_factory)
        changed = changes_since(run_dir)
        if changed:
            trainer.console.print(
                f"[yellow]warning[/yellow]: resuming on another machine or library version ({'; '.join(changed)}): "
                "the steps from here can differ from an uninterrupted run's (the weights so far are exact)"
            )
        return trainer

    def _make_evaluator(self) -> Evaluator:
        """LocalEvaluator (dist.workers 0) or RayEvaluator, whose workers reach the policy's current
        weights from the same checkpoint plus a replay of the same updates."""
        dist = self.config.dist
        if dist.workers == 0:
            return LocalEvaluator(self.policy, self.env)
        from esopt.population.ray_evaluator import RayEvaluator

        checkpoint, base_version, updates = self._restore_point
        evaluator = RayEvaluator(
            self.policy,
            self.config.env.name,
            self.config.env.options,
            self.policy_factory,
            workers=dist.workers,
            threads_per_worker=dist.threads_per_worker,
            ray_address=dist.ray_address,
            checkpoint=None if checkpoint is None else str(checkpoint),
            base_version=base_version,
            updates=updates,
            max_restarts=dist.max_restarts,
            log=self.console.print,
        )
        self.console.print(
            f"evaluating on {dist.workers} Ray workers x {evaluator.threads} thread(s)"
            + (f", asynchronous ES (max_lag {dist.max_lag}, commit_every {self.config.commit_every})" if dist.mode == "async" else "")
        )
        if dist.mode == "async":
            self.async_es = AsyncES(
                evaluator,
                self.strategy,
                self._work_for,
                self.config.rollout,
                max_lag=dist.max_lag,
                commit_every=self.config.commit_every,
                keep_trajectories=self.config.trajectories_per_step,
            )
        return evaluator

    def _work_for(self, step: int) -> tuple[list, int]:
        return step_work(self.config, self.env, step)

    # ---- state -------------------------------------------------------------------------------
    def _restore_progress(self) -> int:
        """Bring the policy to the state after every update in history.jsonl; return that step count."""
        history = read_run_history(self.run_dir)
        usable = [(k, path) for k, path in checkpoints(self.run_dir) if k <= len(history)]
        first = 0
        self._restore_point = (None, 0, history)
        if usable:
            first, path = usable[-1]
            self.policy.load_checkpoint(path)
            expected = json.loads((path / "esopt.json").read_text())["fingerprint"]
            if self.policy.fingerprint() != expected:
                raise ConfigError(f"run directory {self.run_dir} is damaged: checkpoint {path} does not match its recorded fingerprint")
            self._restore_point = (path, first, history[first:])
        for update in history[first:]:
            self.policy.apply(update)
        return len(history)

    def save_checkpoint(self, updates: int) -> Path:
        path = self.run_dir / "checkpoints" / f"{CHECKPOINT_PREFIX}{updates:05d}"
        self.policy.save(str(path))
        (path / "esopt.json").write_text(json.dumps({"updates": updates, "fingerprint": self.policy.fingerprint()}))
        if self.evaluator is not None:
            if self.async_es is not None:
                self.async_es.drain()  # no job in flight may need a replica older than the new base
            self.evaluator.rebase(str(path), updates)  # older checkpoints may be deleted below
        for _, old in checkpoints(self.run_dir)[: -self.config.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return path

    # ---- evaluation --------------------------------------------------------------------------
    def evaluate(self, step: int) -> EvalResult:
        if self.async_es is not None:
            self.async_es.drain()  # no worker competes with the driver for the CPUs meanwhile
        start = time.perf_counter()
        result = rollout(self.policy, self.eval_env, self.eval_tasks, eval_rollout_config(self.config), seed=self.config.eval_seed)
        seconds = time.perf_counter() - start
        write_trajectories(
            self.run_dir / "trajectories" / f"eval_step{step:05d}.jsonl",
            [t.to_json() for t in result.trajectories],
        )
        return EvalResult(step, result.metrics, seconds)

    # ---- the loop ----------------------------------------------------------------------------
    def _train_step(self, step: int) -> dict[str, float]:
        cfg = self.config
        start_step = time.perf_counter()
        extra: dict[str, float] = {}
        if self.async_es is not None:
            commit = self.async_es.next_update(step)
            results, update = commit.results, commit.update
            fitness = update.fitness
            extra.update(commit.metrics)
            t0 = time.perf_counter()
            self.evaluator.apply(update, verify=False)  # busy workers apply it when they pick up new work
        else:
            members = self.strategy.ask(step)
            tasks, decode_seed = self._work_for(step)
            results = self.evaluator.evaluate(
                members, tasks, cfg.rollout, decode_seed, keep_trajectories=cfg.trajectories_per_step
            )
            fitness = [r.fitness for r in results]
            update = self.strategy.tell(step, members, fitness)
            t0 = time.perf_counter()
            self.evaluator.apply(update)
        update_s = time.perf_counter() - t0
        extra.update(self.evaluator.metrics())
        self.history.append(update)
        if cfg.trajectories_per_step:
            write_trajectories(
                self.run_dir / "trajectories" / "train.jsonl",
                [{"step": step, "member": 0, "fitness": fitness[0], **t} for t in results[0].trajectories],
            )
        n = len(results)
        step_s = time.perf_counter() - start_step
        tokens = sum(r.generated_tokens for r in results)
        return {
            "train/fitness_mean": update.stats["mean"],
            "train/fitness_std": update.stats["std"],
            "train/fitness_max": update.stats["max"],
            "train/success": sum(r.metrics["success"] for r in results) / n,
            "train/mean_turns": sum(r.metrics["mean_turns"] for r in results) / n,
            "train/invalid_rate": sum(r.metrics["invalid_rate"] for r in results) / n,
            "es/sigma": update.sigma,
            "es/alpha": update.alpha,
            "train/generated_tokens": tokens,
            "time/step_s": step_s,
            "time/tokens_per_s": tokens / step_s if step_s > 0 else 0.0,
            "time/generate_s": sum(r.generate_s for r in results),
            "time/env_s": sum(r.env_s for r in results),
            "time/perturb_s": sum(r.perturb_s for r in results),
            "time/restore_s": sum(r.restore_s for r in results),
            "time/update_s": update_s,
            "mem/peak_rss_mb": peak_rss_mb(),
            **extra,
        }

    def _log_eval(self, result: EvalResult) -> None:
        self.metrics.log(
            result.step,
            {**{f"eval/{k}": v for k, v in result.metrics.items()}, "time/eval_s": result.seconds},
        )
        m = result.metrics
        self.console.print(
            f"[bold]eval[/] after {result.step} updates: success {m['success']:.3f}  "
            f"reward {m['mean_reward']:.3f}  turns {m['mean_turns']:.2f}  invalid {m['invalid_rate']:.3f}  "
            f"({result.seconds:.0f}s)"
        )

    def run(self) -> dict:
        self.metrics = MetricsLogger(self.run_dir, self.config.report_to, to_dict(self.config))
        # The policy holds the base weights until _restore_progress moves it (also on resume), and the
        # report compares the final weights with them: a copy now is cheaper than loading the base again.
        self.base_weights = BaseSnapshot(self.policy.master_weights(), trained_names(self.strategy, self.policy.master_weights()))
        done = self._restore_progress()
        self.evaluator = self._make_evaluator()
        try:
            return self._run(done)
        finally:
            self.evaluator.close()

    def _run(self, done: int) -> dict:
        cfg = self.config
        self.history = HistoryWriter(self.run_dir / "history.jsonl")
        if done:
            self.console.print(f"resuming {self.run_dir} after {done} of {cfg.steps} steps")
        else:
            self._log_eval(self.evaluate(0))
            log_probe(self.metrics, self.policy, cfg, 0)
        last_eval = max((r["step"] for r in read_metrics(self.run_dir) if "eval/success" in r), default=-1)
        columns = [
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("sigma {task.fields[sigma]:.2e}  reward {task.fields[reward]:.3f}"),
        ]
        with Progress(*columns, console=self.console, transient=False) as progress:
            bar = progress.add_task("ES steps", total=cfg.steps, completed=done, sigma=self.strategy.sigma(done), reward=0.0)
            for step in range(done, cfg.steps):
                values = self._train_step(step)
                updates = step + 1
                self.metrics.log(updates, values)
                progress.update(bar, advance=1, sigma=values["es/sigma"], reward=values["train/fitness_mean"])
                if cfg.eval_every and updates % cfg.eval_every == 0 and updates < cfg.steps:
                    self._log_eval(self.evaluate(updates))
                    last_eval = updates
                if cfg.checkpoint_every and updates % cfg.checkpoint_every == 0 and updates < cfg.steps:
                    self.save_checkpoint(updates)
        if self.async_es is not None:
            self.async_es.drain()
            self.evaluator.verify()  # every worker has every update and matches the driver
        if last_eval != cfg.steps:
            self._log_eval(self.evaluate(cfg.steps))
        if not any(k == cfg.steps for k, _ in checkpoints(self.run_dir)):
            self.save_checkpoint(cfg.steps)
        log_probe(self.metrics, self.policy, cfg, cfg.steps)
        self.history.close()
        self.metrics.close()
        sigma_final = cfg.es.sigma_final if self.strategy.sigma_decays else cfg.es.sigma
        magnitudes = self.base_weights.take_update_magnitudes(self.policy.master_weights(), cfg.es.sigma, sigma_final)
        self.base_weights = None  # its memory goes back before the report is written
        summary = write_report(
            self.run_dir, cfg, read_metrics(self.run_dir), self.policy.fingerprint(), self.eval_env, self.eval_tasks,
            update_magnitudes=magnitudes,
        )
        summary["run_dir"] = str(self.run_dir)
        return summary


def engine_model_config(config: TrainConfig):
    """The model config to start the policy with: on the vLLM backend, low-rank members with frozen
    vectors run as LoRA adapters, so the engine reserves one adapter slot per member of the rank asked
    for (unless model.vllm sets lora_slots / lora_rank itself)."""
    model, es = config.model, config.es
    if model.backend == "vllm" and es.noise == "lowrank" and es.lowrank_vectors == "frozen":
        return dataclasses.replace(model, vllm={"lora_slots": es.population, "lora_rank": es.rank, **model.vllm})
    return model
