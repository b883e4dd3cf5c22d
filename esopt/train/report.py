"""report.md and reward-curve PNG of a finished run, built from its metrics.jsonl."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from statistics import mean, median

from esopt.envs.base import shown_answer
from esopt.envs.metrics import paired_difference, wilson_interval
from esopt.es import read_history
from esopt.machine import describe as describe_machine, read_record as read_machine_record
from esopt.train.diagnostics import diagnostics_line, tie_summary

EVAL_KEYS = ("success", "mean_reward", "mean_turns", "invalid_rate")
TIME_KEYS = ("generate_s", "env_s", "perturb_s", "restore_s", "update_s")


def plot_reward_curve(
    run_dir: Path,
    train: list[dict],
    evals: list[dict],
    mean_key: str = "train/fitness_mean",
    mean_label: str = "train: mean member fitness",
    std_key: str | None = "train/fitness_std",
    std_label: str = "± 1 std over members",
    train_axis: str = "training fitness",
) -> str | None:
    """reward_curve.png: the training curve (with a ± 1 std band when std_key is given) and held-out
    success; returns the file name, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        steps = [r["step"] for r in train]
        ax.plot(steps, [r[mean_key] for r in train], label=mean_label)
        if std_key:
            ax.fill_between(
                steps,
                [r[mean_key] - r[std_key] for r in train],
                [r[mean_key] + r[std_key] for r in train],
                alpha=0.2,
                label=std_label,
            )
    ax.set_xlabel("updates")
    ax.set_ylabel(train_axis)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if evals:
        # its own axis: success is a rate in [0, 1], the training fitness need not be (a log fitness is below 0)
        success_ax = ax.twinx()
        success_ax.plot([r["step"] for r in evals], [r["eval/success"] for r in evals], "o-", color="tab:orange",
                        label="held-out success")
        success_ax.set_ylim(0, 1)
        success_ax.set_ylabel("held-out success")
        more_handles, more_labels = success_ax.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    if handles:  # on the top axes, so no line is drawn over the legend box
        (success_ax if evals else ax).legend(handles, labels)
    fig.tight_layout()
    name = "reward_curve.png"
    fig.savefig(run_dir / name, dpi=120)
    plt.close(fig)
    return name


def summarize(metrics: list[dict], train_key: str = "train/fitness_mean", time_keys=TIME_KEYS) -> dict:
    """Before/after held-out metrics, median step time, mean time split and peak RSS of a run's metrics."""
    train = [r for r in metrics if train_key in r]
    evals = [r for r in metrics if "eval/success" in r]
    summary: dict = {"steps": len(train)}
    if evals:
        summary["before"] = {k: evals[0][f"eval/{k}"] for k in EVAL_KEYS}
        summary["after"] = {k: evals[-1][f"eval/{k}"] for k in EVAL_KEYS}
        summary["eval_steps"] = (evals[0]["step"], evals[-1]["step"])
    if train:
        summary["seconds_per_step"] = median(r["time/step_s"] for r in train)
        summary["time_split"] = {k: mean(r[f"time/{k}"] for r in train) for k in time_keys}
        summary["peak_rss_mb"] = max(r["mem/peak_rss_mb"] for r in train)
    return summary


def print_summary(console, summary: dict, title: str) -> None:
    """The end-of-run table (held-out before/after), time split and where the run directory is."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("held-out metric")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    n = summary.get("eval_n")
    for key in summary.get("before", {}):
        cells = []
        for when in ("before", "after"):
            value = summary[when][key]
            interval = wilson_interval(value * n, n) if key == "success" and n else None
            cells.append(f"{value:.3f}" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else ""))
        table.add_row(key, *cells)
    console.print(table)
    heldout = summary.get("heldout")
    if heldout:
        d = heldout["gain"]
        trivial = f"; best trivial policy ({heldout['trivial'][0]}) {heldout['trivial'][1]:.3f}" if heldout.get("trivial") else ""
        console.print(
            f"paired success gain {d['diff']:+.3f} (95% CI [{d['low']:+.3f}, {d['high']:+.3f}], n = {d['n']}){trivial}"
        )
    if "seconds_per_step" in summary:
        split = summary["time_split"]
        total = sum(split.values()) or 1.0
        parts = ", ".join(f"{k[:-2]} {v / total:.0%}" for k, v in split.items())
        console.print(f"{summary['seconds_per_step']:.1f} s/step ({parts}); peak RSS {summary['peak_rss_mb']:.0f} MB")
    diagnostics = diagnostics_line(summary.get("ties"), summary.get("update_magnitudes"))
    if diagnostics:
        console.print(diagnostics)
    console.print(f"run directory: {summary['run_dir']}  report: {summary['report']}")


def held_out_label(config, what: str) -> str:
    """`what` the held-out evaluation was, and the env options it set differently from training."""
    return what + (f", env options {config.eval_env_options} set for evaluation" if config.eval_env_options else "")


def eval_section(summary: dict, what: str) -> list[str]:
    """Markdown lines: held-out metrics before and after training, success with its 95% Wilson interval,
    and (from the eval trajectories, see `heldout_comparison`) the paired gain, the answer distribution
    and the best trivial policy (empty without evals)."""
    if "before" not in summary:
        return []
    first, last = summary["eval_steps"]

    def cell(key: str, when: str) -> str:
        value = summary[when][key]
        if key != "success" or "eval_n" not in summary:
            return f"{value:.3f}"
        return rate_with_interval(value * summary["eval_n"], summary["eval_n"])

    lines = [
        f"## Held-out evaluation ({what})",
        "",
        f"| metric | before (step {first}) | after (step {last}) |",
        "|---|---|---|",
        *[f"| {k} | {cell(k, 'before')} | {cell(k, 'after')} |" for k in EVAL_KEYS],
        "",
    ]
    heldout = summary.get("heldout")
    if heldout:
        d = heldout["gain"]
        lines += [f"Success is shown with its 95% Wilson interval over n = {d['n']} tasks.", ""]
        lines += [
            f"Paired gain (after - before, same tasks): {d['diff']:+.3f}, 95% bootstrap interval "
            f"[{d['low']:+.3f}, {d['high']:+.3f}], sign-flip p = {d['p']:.3g}.",
            "",
        ]
        if "invalid_change" in heldout:
            v, (b, a) = heldout["invalid_change"], heldout["invalid_episodes"]
            lines += [
                f"Episodes with an invalid action: {rate_with_interval(b * v['n'], v['n'])} before, "
                f"{rate_with_interval(a * v['n'], v['n'])} "
                f"after; paired change {v['diff']:+.3f}, 95% bootstrap interval [{v['low']:+.3f}, {v['high']:+.3f}].",
                "",
            ]
        if heldout.get("trivial"):
            name, rate = heldout["trivial"]
            lines += [f"Best trivial policy ({name}): {rate_with_interval(rate * d['n'], d['n'])}.", ""]
        for when in ("before", "after"):
            answers = ", ".join(f"`{a or '(none)'}` {c}" for a, c in heldout["answers"][when][:6])
            lines += [f"Answers {when}: {answers}", ""]
        lines += category_table(heldout.get("category_successes", {}))
    return lines


def rate_with_interval(successes: float, n: int) -> str:
    """`rate [low, high]`: a success rate over n tasks with its 95% Wilson interval (fractional successes allowed)."""
    low, high = wilson_interval(successes, n)
    return f"{successes / n:.3f} [{low:.3f}, {high:.3f}]"


def table_cell(text: str) -> str:
    """`text` safe inside a markdown table cell (a category such as `answer a * b | a / b` holds a bar)."""
    return text.replace("|", "\\|")


def category_table(category_successes: dict[str, dict[str, list[float]]]) -> list[str]:
    """Markdown lines: success before and after on each task category (e.g. the task's right answer), each with its
    own Wilson interval and n, so an answer the policy never gets right shows even when the overall rate rises."""
    if not category_successes:
        return []

    def rate(values: list[float]) -> str:
        return rate_with_interval(sum(values), len(values))

    return [
        "Success by task category (the env's, e.g. the task's right answer), before and after on the same tasks:",
        "",
        "| category | n | success before [95% CI] | after [95% CI] |",
        "|---|---|---|---|",
        *[f"| {table_cell(category)} | {len(r['after'])} | {rate(r['before'])} | {rate(r['after'])} |"
          for category, r in category_successes.items()],
        "",
    ]


def heldout_comparison(run_dir: Path, first: int, last: int, env=None, tasks=None) -> dict | None:
    """Paired before/after success and answer distributions from a run's eval trajectories (one record
    per task, in task order), plus the env's trivial baseline on the same tasks."""
    files = [Path(run_dir) / "trajectories" / f"eval_step{step:05d}.jsonl" for step in (first, last)]
    if not all(f.exists() for f in files):
        return None
    before, after = ([json.loads(line) for line in f.read_text().splitlines() if line] for f in files)
    if not before or len(before) != len(after):
        return None
    answers = {
        when: Counter(shown_answer(r.get("final_info", {})) for r in records).most_common()
        for when, records in (("before", before), ("after", after))
    }
    def invalid(records: list[dict]) -> list[float]:
        return [float(any(r.get("invalid", []))) for r in records]

    # per category, each task's success before and after (evaluate()'s by_category holds one model's rates)
    category_successes: dict[str, dict[str, list[float]]] = {}
    for b, a in zip(before, after):
        category = b.get("final_info", {}).get("category", a.get("final_info", {}).get("category"))
        if category is not None:
            rates = category_successes.setdefault(str(category), {"before": [], "after": []})
            rates["before"].append(float(b["success"]))
            rates["after"].append(float(a["success"]))
    return {
        "category_successes": dict(sorted(category_successes.items())),
        "gain": paired_difference([float(r["success"]) for r in after], [float(r["success"]) for r in before]),
        "invalid_change": paired_difference(invalid(after), invalid(before)),
        "invalid_episodes": (sum(invalid(before)) / len(before), sum(invalid(after)) / len(after)),
        "answers": answers,
        "trivial": env.trivial_baseline(tasks) if env is not None and tasks else None,
    }


def time_section(summary: dict) -> list[str]:
    """Markdown lines: median seconds per step, peak RSS and the mean split of a step (empty without steps)."""
    if "time_split" not in summary:
        return []
    split = summary["time_split"]
    total = sum(split.values()) or 1.0
    episodes = f" over {summary['episodes']} training episodes" if "episodes" in summary else ""
    return [
        "## Time per step",
        "",
        f"Median {summary['seconds_per_step']:.1f} s per step{episodes}; peak RSS {summary['peak_rss_mb']:.0f} MB.",
        "",
        "| part | mean seconds | share |",
        "|---|---|---|",
        *[f"| {k[:-2]} | {v:.2f} | {v / total:.1%} |" for k, v in split.items()],
        "",
    ]


def diagnostics_section(summary: dict) -> list[str]:
    """Markdown lines: the share of steps whose members all tied (zero update) and the distribution of
    |theta_T - theta_0| against sigma (the Agentic ESOpt paper's Table 6); empty when neither is known."""
    ties, magnitudes = summary.get("ties"), summary.get("update_magnitudes")
    if not (ties and ties["steps"]) and not magnitudes:
        return []
    lines = ["## ES diagnostics", ""]
    if ties and ties["steps"]:
        lines += [
            f"Steps whose members all tied (fitness std 0, so a zero update): {ties['tied']} of {ties['steps']} "
            f"({ties['fraction']:.1%})" + (f"; the last {ties['tied_tail']} steps all tied." if ties["tied_tail"] > 1 else "."),
            "",
        ]
    if magnitudes and magnitudes.get("weights"):
        m = magnitudes
        lines += [
            f"Update magnitudes |theta_T - theta_0| over the {m['weights']:,} trained weights "
            f"({m['moved']:.1%} moved at all):",
            "",
            "| median | p90 | p99 | max | share > sigma_0 | share > sigma_T |",
            "|---|---|---|---|---|---|",
            f"| {m['p50']:.2e} | {m['p90']:.2e} | {m['p99']:.2e} | {m['max']:.2e} "
            f"| {m['above_sigma_0']:.1%} (sigma_0 = {m['sigma_0']:g}) | {m['above_sigma_final']:.1%} (sigma_T = {m['sigma_final']:g}) |",
            "",
        ]
    return lines


def forgetting_section(metrics: list[dict], trained_env: str, tasks: int) -> list[str]:
    """Markdown lines: the forgetting probe (train/forgetting.py) before and after training; empty when
    the run has no probe at both ends."""
    from esopt.train.forgetting import other_env_spec

    probes = [r for r in metrics if "probe/other_env_success" in r]
    if len(probes) < 2:
        return []
    before, after = probes[0], probes[-1]
    lines = ["## Forgetting probe", "", "What training cost outside the trained env (train/forgetting.py):", "",
             "| measure | before | after | change |", "|---|---|---|---|"]
    if "probe/general_loglik" in before and "probe/general_loglik" in after:
        b, a = before["probe/general_loglik"], after["probe/general_loglik"]
        lines.append(f"| generic instruction/answer pairs: mean log-likelihood per token | {b:.4f} | {a:.4f} | {a - b:+.4f} |")
    b, a = before["probe/other_env_success"], after["probe/other_env_success"]

    def rate(x: float) -> str:
        return rate_with_interval(x * tasks, tasks)

    lines += [f"| `{other_env_spec(trained_env)[0]}` success, {tasks} val tasks, greedy [95% CI] | {rate(b)} | {rate(a)} | {a - b:+.3f} |", ""]
    return lines


def dtype_shown(model) -> str:
    """The model's dtype setting, with what `auto` resolved to on this machine."""
    from esopt.policy.config import resolve_device, resolve_dtype

    if model.dtype != "auto":
        return model.dtype
    return f"auto: {resolve_dtype(model.dtype, resolve_device(model.device))}"


def machine_section(run_dir: Path) -> list[str]:
    """The machine the run computed on (esopt.machine): another CPU kernel or library version retrains differently."""
    record = read_machine_record(run_dir)
    return [f"Machine: {describe_machine(record)}.", ""] if record else []


def write_report(
    run_dir: Path, config, metrics: list[dict], fingerprint: str, env=None, eval_tasks=None, update_magnitudes: dict | None = None
) -> dict:
    """report.md (and the reward curve) of a finished ES run; `update_magnitudes` (see
    diagnostics.BaseSnapshot) comes from the trainer, which alone holds the base weights."""
    run_dir = Path(run_dir)
    summary = summarize(metrics)
    if (run_dir / "history.jsonl").exists():
        summary["ties"] = tie_summary(read_history(run_dir / "history.jsonl"))
    if update_magnitudes:
        summary["update_magnitudes"] = update_magnitudes
    if "eval_steps" in summary:
        summary["eval_n"] = config.eval_tasks
        summary["heldout"] = heldout_comparison(run_dir, *summary["eval_steps"], env, eval_tasks)
    train = [r for r in metrics if "train/fitness_mean" in r]
    evals = [r for r in metrics if "eval/success" in r]
    fitness = "mean member fitness (mean log expected reward)" if config.rollout.log_expected_reward else "mean member fitness"
    plot = plot_reward_curve(run_dir, train, evals, mean_label=f"train: {fitness}")
    lines = [
        f"# esopt run: {config.env.name} / {config.method}",
        "",
        f"Model `{config.model.path}` ({dtype_shown(config.model)}), env `{config.env.name}` {config.env.options}, "
        f"G={config.es.population}, N={config.tasks_per_step} tasks/step"
        + (f" x {config.samples_per_task} samples" if config.samples_per_task > 1 else "")
        + f", {config.steps} steps, "
        f"sigma {config.es.sigma:g}" + (f" -> {config.es.sigma_final:g} (cosine)" if config.es.strategy in ("agentic-esopt", "copes") else " (constant)")
        + f", alpha {config.es.alpha:g}" + (f" -> {config.es.alpha_final:g} (cosine)" if config.es.alpha_final is not None else "")
        + (f", fitness = {'mean log of the ' if config.rollout.log_expected_reward else ''}expected reward of the sampler"
           if config.rollout.expected_reward else "")
        + f", seed {config.seed}.",
        "",
    ]
    held_out = f"{config.eval_tasks} {config.eval_split} tasks" + (", greedy" if config.eval_greedy else "")
    lines += eval_section(summary, held_out_label(config, held_out))
    lines += time_section(summary)
    lines += diagnostics_section(summary)
    lines += forgetting_section(metrics, config.env.name, config.probe_tasks)
    if plot:
        lines += ["## Reward curve", "", f"![reward curve]({plot})", ""]
    lines += [f"Final weights fingerprint: `{fingerprint}`", ""]
    lines += machine_section(run_dir)
    (run_dir / "report.md").write_text("\n".join(lines))
    summary["report"] = str(run_dir / "report.md")
    summary["plot"] = str(run_dir / plot) if plot else None
    return summary
