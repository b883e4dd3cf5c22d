"""`esopt compare`: ES against the GRPO and PPO baselines on one env and model, at a matched budget.

Every method gets the same model, env, rollout/evaluation settings, held-out tasks and seed, and
the same number of training episodes (`budget_episodes`; steps = budget // episodes per step).
With `match: wall_clock`, ES runs first and the gradient methods then train for as many seconds of
training steps as ES took (their episode count then differs; it is reported). Each method runs in
its own subprocess (`esopt train|grpo|ppo --config <generated yaml>`), so its peak RSS, read with
wait4() on that child, is its own. The report holds held-out success vs training episodes and vs
training wall-clock (PNG), peak RSS, seconds per step and realized turns per method.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import mean, median


from esopt.confutil import ConfigError, from_dict, opt, to_dict
from esopt.policy.config import ModelConfig
from esopt.rollout import RolloutConfig
from esopt.runconfig import EnvRunConfig, EnvSection, parse_config
from esopt.train.logging import read_metrics

METHODS = ("es", "grpo", "ppo")
SUBCOMMAND = {"es": "train", "grpo": "grpo", "ppo": "ppo"}


@dataclass
class CompareConfig(EnvRunConfig):
    model: ModelConfig = opt(ModelConfig(), "the model every method starts from")
    env: EnvSection = opt(EnvSection(), "the task environment (shared)")
    rollout: RolloutConfig = opt(RolloutConfig(), "rollout settings shared by all methods; held-out evaluation uses them")
    methods: list = opt(list(METHODS), "methods to run, in order: es, grpo, ppo (comma-separated on the command line)")
    budget_episodes: int = opt(256, "training episodes per method (steps = budget // episodes per step, at least 1)")
    match: str = opt("episodes", "'episodes' (same training episodes) or 'wall_clock' (gradient methods get ES's training seconds)")
    wall_clock_step_cap: int = opt(10, "with match=wall_clock: at most this many times the episode-matched steps")
    eval_tasks: int = opt(32, "held-out tasks per evaluation (same tasks for every method)")
    eval_seed: int = opt(0, "seed of the held-out task set")
    eval_points: int = opt(1, "evaluations during training besides before/after... total evals = eval_points + 1 (1 = before and after only)")
    seed: int = opt(0, "run seed passed to every method")
    es: dict = opt({}, "overrides of the ES run config (esopt train's YAML keys, e.g. es: {population: 8}, tasks_per_step: 8)")
    grpo: dict = opt({}, "overrides of the GRPO run config (esopt grpo's YAML keys)")
    ppo: dict = opt({}, "overrides of the PPO run config (esopt ppo's YAML keys)")
    timeout_s: float = opt(0.0, "kill a method's subprocess after this many seconds (0 = no limit)")
    runs_dir: str = opt("runs", "parent directory of the comparison directory")
    run_name: str | None = opt(None, "comparison directory name (default: <env>__compare__<seed>__<time>)")

    run_marker = "report.md"

    def run_label(self) -> str:
        return f"{self.env.name}__compare"

    def check(self) -> None:
        super().check()
        unknown = [m for m in self.methods if m not in METHODS]
        if unknown or not self.methods:
            raise ConfigError(f"methods must be a non-empty subset of {','.join(METHODS)}, got {self.methods}")
        if self.budget_episodes < 1 or self.eval_tasks < 1 or self.eval_points < 1:
            raise ConfigError("budget_episodes, eval_tasks and eval_points must be >= 1")
        if self.match not in ("episodes", "wall_clock"):
            raise ConfigError(f"match must be 'episodes' or 'wall_clock', got {self.match!r}")
        if self.match == "wall_clock" and "es" not in self.methods:
            raise ConfigError("match=wall_clock measures ES's training time: include es in methods")
        for method in self.methods:
            self.method_config(method, steps_override=1)

    # ---- per-method configs --------------------------------------------------------------------
    def _merged(self, method: str) -> dict:
        base = {
            "model": to_dict(self.model),
            "env": to_dict(self.env),
            "rollout": to_dict(self.rollout),
            "eval_tasks": self.eval_tasks,
            "eval_seed": self.eval_seed,
            "seed": self.seed,
        }
        return _deep_merge(base, getattr(self, method))

    def method_config(self, method: str, steps_override: int | None = None):
        from esopt.train.config import TrainConfig
        from esopt.baselines.grpo import GRPOConfig
        from esopt.baselines.ppo import PPOConfig

        cls = {"es": TrainConfig, "grpo": GRPOConfig, "ppo": PPOConfig}[method]
        config = from_dict(cls, self._merged(method), where=method)
        per_step = episodes_per_step(method, config)
        config.steps = steps_override or max(1, self.budget_episodes // per_step)
        config.eval_every = max(1, config.steps // self.eval_points) if self.eval_points > 1 else 0
        config.validate()
        return config


def episodes_per_step(method: str, config) -> int:
    if method == "es":
        return config.es.population * config.tasks_per_step * config.samples_per_task
    return config.tasks_per_step * config.group_size


def _deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# ---- running one method ---------------------------------------------------------------------------
@dataclass
class MethodRun:
    method: str
    run_dir: Path
    returncode: int
    wall_s: float
    peak_rss_mb: float
    episodes_per_step: int


def run_method(method: str, config, compare_dir: Path, timeout_s: float, console) -> MethodRun:
    """Write the method's config and run it in a child process; peak RSS from wait4() on that child."""
    config.runs_dir = str(compare_dir / "runs")
    config.run_name = method
    path = compare_dir / "configs" / f"{method}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config.to_yaml())
    log = compare_dir / "logs" / f"{method}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "esopt.cli", SUBCOMMAND[method], "--config", str(path)]
    console.print(f"[bold]{method}[/]: {config.steps} steps x {episodes_per_step(method, config)} episodes; log {log}")
    start = time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        timer = threading.Timer(timeout_s, proc.kill) if timeout_s else None
        if timer:
            timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            if timer:
                timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    rss_mb = usage.ru_maxrss / 1024  # Linux: kilobytes
    if proc.returncode != 0:
        console.print(f"[red]{method} exited with {proc.returncode}[/]; see {log}")
    return MethodRun(method, compare_dir / "runs" / method, proc.returncode, wall, rss_mb, episodes_per_step(method, config))


def method_summary(run: MethodRun) -> dict:
    metrics = read_metrics(run.run_dir)
    train = [r for r in metrics if "time/step_s" in r and ("train/mean_reward" in r or "train/fitness_mean" in r)]
    evals = [r for r in metrics if "eval/success" in r]
    elapsed, clock = 0.0, {0: 0.0}
    for r in train:
        elapsed += r["time/step_s"]
        clock[r["step"]] = elapsed
    curve = [
        {
            "step": r["step"],
            "episodes": r["step"] * run.episodes_per_step,
            "train_s": clock.get(r["step"], elapsed),
            "success": r["eval/success"],
            "mean_reward": r["eval/mean_reward"],
            "mean_turns": r["eval/mean_turns"],
        }
        for r in evals
    ]
    return {
        "method": run.method,
        "returncode": run.returncode,
        "steps": len(train),
        "episodes": len(train) * run.episodes_per_step,
        "episodes_per_step": run.episodes_per_step,
        "seconds_per_step": median(r["time/step_s"] for r in train) if train else None,
        "train_s": elapsed,
        "process_wall_s": run.wall_s,
        "peak_rss_mb": run.peak_rss_mb,
        "peak_rss_mb_inprocess": max((r.get("mem/peak_rss_mb", 0.0) for r in train), default=None),
        "train_turns": mean(r["train/mean_turns"] for r in train) if train else None,
        "curve": curve,
        "run_dir": str(run.run_dir),
    }


# ---- report -----------------------------------------------------------------------------------------
def _plots(out: Path, summaries: list[dict]) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    names = []
    for key, label, name in (
        ("episodes", "training episodes", "success_vs_episodes.png"),
        ("train_s", "training wall-clock (s, evaluations excluded)", "success_vs_wallclock.png"),
    ):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for s in summaries:
            if s["curve"]:
                ax.plot([p[key] for p in s["curve"]], [p["success"] for p in s["curve"]], "o-", label=s["method"])
        ax.set_xlabel(label)
        ax.set_ylabel("held-out success")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        names.append(name)
    return names


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def write_compare_report(out: Path, config: CompareConfig, summaries: list[dict]) -> Path:
    plots = _plots(out, summaries)
    lines = [
        f"# esopt compare: {config.env.name} {config.env.options}",
        "",
        f"Model `{config.model.path}` ({config.model.dtype}); budget {config.budget_episodes} training episodes per method "
        f"(match: {config.match}); held-out: {config.eval_tasks} tasks (seed {config.eval_seed}), evaluated with the "
        f"same rollout code and settings for every method (sampling temperature {config.rollout.sampling.temperature:g}); "
        f"seed {config.seed}. Each method ran in its own process; peak RSS is that process's (wait4).",
        "",
        "| method | steps | episodes | success before | success after | reward before | reward after | s/step (median) | train s | peak RSS MB | eval turns (after) | train turns |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        c = s["curve"]
        b, a = (c[0], c[-1]) if c else ({}, {})
        lines.append(
            f"| {s['method']}{'' if s['returncode'] == 0 else ' (failed: rc ' + str(s['returncode']) + ')'} | {s['steps']} | {s['episodes']} | "
            f"{_fmt(b.get('success'), '.3f')} | {_fmt(a.get('success'), '.3f')} | {_fmt(b.get('mean_reward'), '.3f')} | "
            f"{_fmt(a.get('mean_reward'), '.3f')} | {_fmt(s['seconds_per_step'], '.1f')} | {_fmt(s['train_s'], '.0f')} | "
            f"{_fmt(s['peak_rss_mb'], '.0f')} | {_fmt(a.get('mean_turns'), '.2f')} | {_fmt(s['train_turns'], '.2f')} |"
        )
    lines.append("")
    for name in plots:
        lines += [f"![{name[:-4]}]({name})", ""]
    lines += ["Run directories (config.yaml, metrics.jsonl, report.md each):", ""]
    lines += [f"- {s['method']}: `{s['run_dir']}`" for s in summaries]
    lines.append("")
    path = out / "report.md"
    path.write_text("\n".join(lines))
    (out / "summary.json").write_text(json.dumps(summaries, indent=2))
    return path


# ---- entry point --------------------------------------------------------------------------------------
def run_compare(config: CompareConfig, console=None) -> dict:
    from rich.console import Console

    console = console or Console()
    config.validate()
    out = config.create_run_dir()
    order = sorted(config.methods, key=lambda m: m != "es") if config.match == "wall_clock" else list(config.methods)
    summaries: dict[str, dict] = {}
    es_train_s = None
    for method in order:
        method_cfg = config.method_config(method)
        if config.match == "wall_clock" and method != "es":
            method_cfg.steps *= config.wall_clock_step_cap
            method_cfg.max_train_seconds = max(1e-3, es_train_s or 0.0)
            method_cfg.eval_every = 0
        run = run_method(method, method_cfg, out, config.timeout_s, console)
        summaries[method] = method_summary(run)
        if method == "es":
            es_train_s = summaries[method]["train_s"]
    ordered = [summaries[m] for m in config.methods]
    report = write_compare_report(out, config, ordered)
    return {"dir": str(out), "report": str(report), "methods": ordered}


def main(argv: list[str]) -> int:
    from rich.console import Console
    from rich.table import Table

    config, _ = parse_config(
        argv, CompareConfig, "esopt compare",
        "Run ES, GRPO and PPO on one env and model at a matched budget and write a comparison report.",
    )
    console = Console()
    console.rule("comparison config")
    console.print(config.to_yaml(), highlight=False)
    result = run_compare(config, console)
    table = Table(title=f"esopt compare: {config.env.name}")
    for column in ("method", "episodes", "success before", "success after", "s/step", "peak RSS MB"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for s in result["methods"]:
        c = s["curve"]
        table.add_row(
            s["method"], str(s["episodes"]),
            _fmt(c[0]["success"] if c else None, ".3f"), _fmt(c[-1]["success"] if c else None, ".3f"),
            _fmt(s["seconds_per_step"], ".1f"), _fmt(s["peak_rss_mb"], ".0f"),
        )
    console.print(table)
    console.print(f"comparison directory: {result['dir']}  report: {result['report']}")
    return 0 if all(s["returncode"] == 0 for s in result["methods"]) else 1
