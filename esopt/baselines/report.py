"""A GRPO/PPO run's summary, budget line and report.md (the ES report's sections, plus the budget spent)."""

from __future__ import annotations

from pathlib import Path

from esopt.baselines.config import PGConfig
from esopt.train.report import (
    eval_section, forgetting_section, held_out_label, heldout_comparison, machine_section, plot_reward_curve, summarize,
    time_section,
)

PG_TIME_KEYS = ("generate_s", "env_s", "score_s", "update_s")


def summarize_pg(metrics: list[dict]) -> dict:
    """`summarize` plus the budget a run spent: optimizer steps, training episodes, training seconds
    (rollouts and updates) and evaluation seconds."""
    summary = summarize(metrics, "train/mean_reward", PG_TIME_KEYS)
    train = [r for r in metrics if "train/mean_reward" in r]
    summary["optimizer_steps"] = int(sum(r.get("train/optimizer_steps", 0) for r in train))
    summary["episodes"] = train[-1]["train/episodes"] if train else 0
    summary["train_s"] = train[-1].get("time/train_s", 0.0) if train else 0.0
    summary["eval_s"] = sum(r.get("time/eval_s", 0.0) for r in metrics if "eval/success" in r)
    return summary


def budget_line(summary: dict) -> str:
    """One line: what the run spent, so methods compare at equal cost."""
    wall = f", {summary['wall_s']:.0f} s wall-clock in all" if "wall_s" in summary else ""
    return (
        f"{summary['optimizer_steps']} optimizer steps over {summary['steps']} steps, {summary['episodes']} training episodes, "
        f"{summary['train_s']:.0f} s training (rollouts and updates) + {summary['eval_s']:.0f} s evaluation{wall}"
    )


def write_pg_report(
    run_dir: Path, config: PGConfig, method: str, metrics: list[dict], fingerprint: str, wall_seconds: float | None = None
) -> dict:
    summary = summarize_pg(metrics)
    if wall_seconds is not None:
        summary["wall_s"] = wall_seconds
    if "eval_steps" in summary:  # success intervals and the paired before/after gain, as ES reports show them
        summary["eval_n"] = config.eval_tasks
        summary["heldout"] = heldout_comparison(run_dir, *summary["eval_steps"])
    train = [r for r in metrics if "train/mean_reward" in r]
    evals = [r for r in metrics if "eval/success" in r]
    plot = plot_reward_curve(
        run_dir, train, evals, "train/mean_reward", "train: mean episode reward (sampled)", std_key=None,
        train_axis="training reward",
    )
    o = config.optim
    lines = [
        f"# esopt run: {config.env.name} / {method}",
        "",
        f"Model `{config.model.path}` ({config.model.dtype}), env `{config.env.name}` {config.env.options}, "
        f"{config.tasks_per_step} tasks x K={config.group_size} episodes per step, {summary['steps']} of {config.steps} steps, "
        f"train temperature {config.train_temperature:g}, lr {o.lr:g}, {o.epochs} epoch(s) x {o.minibatches} minibatch(es), "
        f"clip {config.clip_eps:g}, KL {config.kl_coef:g}, seed {config.seed}.",
        "",
        "## Budget",
        "",
        budget_line(summary) + ".",
        "",
    ]
    lines += eval_section(summary, held_out_label(config, f"{config.eval_tasks} tasks, same rollout/eval code as ES"))
    lines += time_section(summary)
    lines += forgetting_section(metrics, config.env.name, config.probe_tasks)
    if plot:
        lines += ["## Reward curve", "", f"![reward curve]({plot})", ""]
    lines += [f"Final weights fingerprint: `{fingerprint}`", ""]
    lines += machine_section(Path(run_dir))
    (Path(run_dir) / "report.md").write_text("\n".join(lines))
    summary["report"] = str(Path(run_dir) / "report.md")
    return summary
