"""Does ES make the model better? Held-out gains over several training seeds, with their intervals.

    python -m benchmarks.learning [--quick] [--envs sudoku-h1,sudoku-h3,countdown,countdown-n2] [--seeds 0,1,2]
                                  [--eval-tasks 200] [--out bench_results]

For each env: ES-trains the default model from `configs/learn_<env>.yaml` once per training seed (each
run its own `esopt train` process; its periodic evaluations on the *val* split give the learning
curve), then GRPO-trains it from `configs/learn_<env>_grpo.yaml` with the same seed, tasks and episodes
per step for exactly the training seconds that ES spent (`max_train_seconds`), then evaluates the base model and every trained model on the same `--eval-tasks` tasks of the
*eval* split, which no setting was chosen on: greedy decoding, and Mean@4 with the sampled decoder of
the Agentic ESOpt paper (temperature 0.7, top-p 0.8, top-k 20). Reported per env and seed: success with
its 95% Wilson interval, the paired gain over the base on the same tasks with its 95% bootstrap
interval, the best trivial policy's rate (e.g. always the most frequent answer) and the distribution of
the model's answers, so a collapse to one answer cannot pass for learning. Writes
`<out>/learning.md`, `<out>/learning.json` and one `learning_<env>.png` per env (held-out success
against wall-clock seconds and against training episodes).

Sudoku H*=3 trains nothing of its own (MODELS_FROM): its rows are the sudoku-h1 runs' models of each method
and seed (trained once, shared by both sections), played whole on H*=3 puzzles; a second ES stage on H*=3
one-turn tasks lowered val success from those models (bench_results/ablation.md, Sudoku H*=3), so the benchmark
measures what the H*=1 training gives multi-turn play. Its seconds, episodes and updates are the H*=1 runs'.

`--quick` (what `make learn QUICK=1` runs): only sudoku-h1, one seed of QUICK_STEPS ES steps (the sigma and
alpha schedules compressed to the steps) and GRPO for the same seconds, 128 eval
tasks, no Mean@4: it checks the pipeline end to end on the real model and shows the start of the curve.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENVS = {
    "sudoku-h1": "configs/learn_sudoku_h1.yaml",
    "sudoku-h3": "configs/learn_sudoku_h3.yaml",
    "countdown": "configs/learn_countdown.yaml",
    "countdown-n2": "configs/learn_countdown_n2.yaml",
}
GRPO_CONFIGS = {env: path.replace(".yaml", "_grpo.yaml") for env, path in ENVS.items()}
# Envs evaluated on the models trained for another env (no training of their own): the key's eval env and
# decoding, the value's runs.
MODELS_FROM = {"sudoku-h3": "sudoku-h1"}
# Envs whose eval split holds fewer distinct balanced tasks than --eval-tasks asks for: with two numbers 1-50 and
# targets 1-100 the eval split's `a * b` puzzles that the other operators' draws leave (`t * 1` is also `t / 1`,
# `2 * 2` also `2 + 2`) run out after 43, so 172 tasks, 43 per operator, is the most it can draw.
MAX_EVAL_TASKS = {"countdown-n2": 172}
PAPER_SAMPLING = {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
QUICK_STEPS = 60  # a step of the config is ~5.5 s without AMX, so 60 fit the 15 minutes with GRPO's equal seconds


def train(env: str, method: str, seed: int, runs_dir: Path, extra: list[str]) -> Path:
    """One training run (method "es" or "grpo") in its own process; returns its run directory."""
    name = f"{env}__{method}__seed{seed}"
    run_dir = runs_dir / name
    if (run_dir / "report.md").exists():
        print(f"[learn] {name}: already trained, reusing {run_dir}", flush=True)
        return run_dir
    command, config = ("train", ENVS[env]) if method == "es" else ("grpo", GRPO_CONFIGS[env])
    command = [sys.executable, "-m", "esopt.cli", command, "--config", str(ROOT / config), "--seed", str(seed),
               "--runs_dir", str(runs_dir), "--run_name", name, *extra]
    print(f"[learn] {' '.join(command[2:])}", flush=True)
    log = runs_dir / f"{name}.log"
    runs_dir.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        code = subprocess.call(command, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if code:
        raise SystemExit(f"[learn] training {name} failed (exit {code}); see {log}")
    return run_dir


def curve(run_dir: Path) -> list[dict]:
    """(updates, wall-clock seconds of training so far, training episodes so far, val success) per eval,
    of an ES or a GRPO run."""
    import yaml

    from esopt.train.logging import read_metrics

    rows, seconds, episodes = [], 0.0, 0
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    if "es" in config:
        per_step = config["es"]["population"] * config["tasks_per_step"] * config.get("samples_per_task", 1)
    else:
        per_step = config["tasks_per_step"] * config["group_size"]
    for record in read_metrics(run_dir):
        if "time/step_s" in record:
            seconds += record["time/step_s"]
            episodes += per_step
        if "eval/success" in record:
            rows.append({"step": record["step"], "seconds": seconds, "episodes": episodes, "success": record["eval/success"]})
    return rows


def evaluate_models(env_name: str, models: dict[str, str], eval_tasks: int, samples: bool) -> dict:
    """Greedy (and Mean@4 sampled) evaluation of every model on the same eval-split tasks."""
    import dataclasses

    from esopt.policy import load_policy
    from esopt.train.config import load_config
    from esopt.train.es_trainer import eval_rollout_config
    from esopt.train.evaluate import evaluate

    config = load_config(ROOT / ENVS[env_name])
    env = config.make_eval_env()  # the env the runs' own evaluations play
    tasks = env.tasks("eval", eval_tasks, 12345)  # a seed no training run or config uses
    greedy = eval_rollout_config(config)  # what the trainer's own evaluations use (eval_greedy)
    sampled = dataclasses.replace(greedy, sampling=dataclasses.replace(config.rollout.sampling, **PAPER_SAMPLING))
    results = {}
    for label, path in models.items():
        policy = load_policy(dataclasses.replace(config.model, path=path))
        results[label] = {"greedy": evaluate(policy, env, tasks, greedy, 1, seed=12345)}
        if samples:
            results[label]["mean@4"] = evaluate(policy, env, tasks, sampled, 4, seed=12345)
        print(f"[learn] {env_name} {label}: greedy success {results[label]['greedy']['success_mean@1']:.3f}", flush=True)
        del policy
    return results


def latest_checkpoint(run_dir: Path) -> str:
    from esopt.train.es_trainer import checkpoints

    return str(checkpoints(run_dir)[-1][1])


def plot(env: str, curves: dict[str, list[dict]], out: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for label, rows in curves.items():
        for ax, key in zip(axes, ("seconds", "episodes")):
            ax.plot([r[key] for r in rows], [r["success"] for r in rows], "o-" if label.startswith("ES") else "s--", label=label)
    axes[0].set_xlabel("training wall-clock (s)")
    axes[1].set_xlabel("training episodes")
    axes[0].set_ylabel("val success (greedy)")
    axes[1].legend()
    fig.suptitle(f"{env}: held-out (val) success during ES and GRPO training")
    fig.tight_layout()
    name = f"learning_{env}.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def rate(report: dict, key: str) -> str:
    from esopt.train.report import rate_with_interval

    return rate_with_interval(report[key] * report["tasks"], report["tasks"])


def gain(after: dict, before: dict) -> str:
    from esopt.envs.metrics import paired_difference

    d = paired_difference(after["per_task_success"], before["per_task_success"])
    return f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] (p={d['p']:.2g})"


def answers(report: dict) -> str:
    return ", ".join(f"`{a}` {c}" for a, c in list(report["answers"].items())[:4])


def markdown(env: str, source: str, results: dict, curves: dict, png: str | None, samples: bool) -> list[str]:
    base = results["base"]
    trivial = f"{base['greedy']['trivial_policy']}: {rate(base['greedy'], 'trivial_success')}" if "trivial_policy" in base["greedy"] else "n/a"
    lines = [
        f"## {env} ({source})",
        "",
        f"{base['greedy']['tasks']} eval-split tasks (never used to choose settings). Best trivial policy ({trivial}).",
        "",
        "| model | greedy success [95% CI] | paired gain vs base [95% CI] |"
        + (" Mean@4 sampled [95% CI] | paired gain vs base |" if samples else "")
        + " train s | episodes | updates | answers (greedy) |",
        "|---|---|---|" + ("---|---|" if samples else "") + "---|---|---|---|",
    ]
    for label, result in results.items():
        g = result["greedy"]
        row = f"| {label} | {rate(g, 'success_mean@1')} | " + ("-" if label == "base" else gain(g, base["greedy"])) + " |"
        if samples:
            s = result["mean@4"]
            row += f" {rate(s, 'success_mean@4')} | " + ("-" if label == "base" else gain(s, base["mean@4"])) + " |"
        last = curves[label][-1] if curves.get(label) else {}
        row += f" {last['seconds']:.0f} | {last['episodes']} | {last['step']} |" if last else " - | - | - |"
        row += f" {answers(g)} |"
        lines.append(row)
    lines.append("")
    lines += by_category(results)
    lines += head_to_head(results, samples)
    if png:
        lines += [f"![{env} learning curves]({png})", ""]
    elif env in MODELS_FROM:
        lines += [f"Train s, episodes and updates are the {MODELS_FROM[env]} runs'; their curves are in its section.", ""]
    return lines


def by_category(results: dict) -> list[str]:
    """Greedy success per task category (the env's, e.g. the task's right answer), one column each: a rate
    that rises overall while one answer is never got right shows here."""
    from esopt.train.report import table_cell

    base = results["base"]["greedy"].get("by_category", {})
    if not base:
        return []
    lines = [
        "Greedy success by task category (for Sudoku H*=1 and Countdown's operators grammar, the task's right answer):",
        "",
        "| model | " + " | ".join(f"{table_cell(c)} (n = {rate['n']})" for c, rate in base.items()) + " |",
        "|---|" + "---|" * len(base),
    ]
    for label, result in results.items():
        own = result["greedy"].get("by_category", {})
        lines.append(f"| {label} | " + " | ".join(f"{own[c]['success']:.2f}" if c in own else "-" for c in base) + " |")
    return [*lines, ""]


def head_to_head(results: dict, samples: bool) -> list[str]:
    """ES minus GRPO (same seed, same training seconds) on the same eval tasks, per seed and averaged over the
    seeds. The average's interval resamples tasks with the seeds held fixed: it says how sure the difference
    is on these training seeds, not how it would vary over others (the per-seed rows show that)."""
    seeds = [label[3:] for label in results if label.startswith("ES ") and f"GRPO {label[3:]}" in results]
    if not seeds:
        return []
    decoders = ["greedy", "mean@4"] if samples else ["greedy"]

    def seed_mean(method: str, decoder: str) -> list[float]:
        per_seed = [results[f"{method} {seed}"][decoder]["per_task_success"] for seed in seeds]
        return [sum(values) / len(values) for values in zip(*per_seed)]

    lines = [
        "ES minus GRPO at equal training seconds, paired on the same tasks (> 0: ES ahead):",
        "",
        "| seeds | " + " | ".join(f"{d}: ES - GRPO [95% CI]" for d in decoders) + " |",
        "|---|" + "---|" * len(decoders),
    ]
    for seed in seeds:
        cells = [gain(results[f"ES {seed}"][d], results[f"GRPO {seed}"][d]) for d in decoders]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    if len(seeds) > 1:
        cells = [gain({"per_task_success": seed_mean("ES", d)}, {"per_task_success": seed_mean("GRPO", d)}) for d in decoders]
        lines.append(f"| mean of {len(seeds)} (tasks resampled, seeds fixed) | " + " | ".join(cells) + " |")
    return [*lines, ""]


def with_baseline_grpo(results: dict, curves: dict, earlier: dict, seeds: list[int], source: str) -> tuple[dict, dict]:
    """results and curves with the GRPO rows of an earlier benchmark of the env inserted after each ES row whose
    seed it has (GRPO rows trained in this run stay where they are); SystemExit unless that benchmark's base model
    solved exactly the same tasks (same tasks, same numerics)."""
    if earlier["results"]["base"]["greedy"]["per_task_success"] != results["base"]["greedy"]["per_task_success"]:
        raise SystemExit(f"--grpo-from {source}: its base model's per-task eval results differ from this run's "
                         "(another machine kind or other eval tasks), so its GRPO rows are not comparable")
    merged, merged_curves = {}, dict(curves)
    for label, result in results.items():
        merged[label] = result
        grpo = label.replace("ES", "GRPO", 1)
        if label.startswith("ES seed ") and int(label[8:]) in seeds and grpo in earlier["results"]:
            merged[grpo] = earlier["results"][grpo]
            merged_curves[grpo] = earlier["curves"][grpo]
    return merged, merged_curves


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"sudoku-h1 only, seed 0, {QUICK_STEPS} ES steps, 128 eval tasks, greedy only")
    parser.add_argument("--envs", default=",".join(ENVS), help="comma-separated: " + ", ".join(ENVS))
    parser.add_argument("--seeds", default="0,1,2", help="training seeds")
    parser.add_argument("--eval-tasks", type=int, default=200, help="eval-split tasks per model")
    parser.add_argument("--out", default=None, help="output directory (default bench_results, bench_results/quick with --quick)")
    parser.add_argument(
        "--grpo-from", default=None, metavar="LEARNING_JSON",
        help="take GRPO's rows (curves and per-task eval results) from an earlier benchmark's learning.json instead "
        "of training GRPO, for the seeds that file has (GRPO is trained for the others): for ES-only changes measured "
        "against a fixed baseline. Meaningful only on the machine kind and eval tasks that file was made with (its "
        "base row must equal this run's, which is checked); the reused GRPO's seconds are then its own, not this ES's",
    )
    args = parser.parse_args(argv)
    envs = ["sudoku-h1"] if args.quick else [e for e in args.envs.split(",") if e]
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    eval_tasks = 128 if args.quick else args.eval_tasks
    samples = not args.quick
    unknown = [e for e in envs if e not in ENVS]
    if unknown:
        raise SystemExit(f"unknown env(s) {', '.join(unknown)}; choose from {', '.join(ENVS)}")
    baseline = json.loads(Path(args.grpo_from).read_text()) if args.grpo_from else None
    missing = [e for e in envs if baseline is not None and e not in baseline]
    if missing:
        raise SystemExit(f"--grpo-from {args.grpo_from} has no results for {', '.join(missing)}")
    out = ROOT / (args.out or ("bench_results/quick" if args.quick else "bench_results"))
    runs_dir = out / "learning_runs"
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    report = ["# Learning benchmark", "", f"`python -m benchmarks.learning {' '.join(argv if argv is not None else sys.argv[1:])}`", ""]
    everything = {}
    for env in envs:
        extra = ["--steps", str(QUICK_STEPS), "--eval_every", str(QUICK_STEPS // 3)] if args.quick else []
        trained_on = MODELS_FROM.get(env, env)
        run_dirs = {}
        for seed in seeds:
            run_dirs[f"ES seed {seed}"] = es_run = train(trained_on, "es", seed, runs_dir, extra)
            if baseline is not None and f"GRPO seed {seed}" in baseline[env]["results"]:
                continue
            seconds = curve(es_run)[-1]["seconds"]  # GRPO gets exactly ES's training wall-clock
            run_dirs[f"GRPO seed {seed}"] = train(trained_on, "grpo", seed, runs_dir, ["--max_train_seconds", f"{seconds:.1f}"])
        curves = {label: curve(run) for label, run in run_dirs.items()}
        models = {"base": "default", **{label: latest_checkpoint(run) for label, run in run_dirs.items()}}
        results = evaluate_models(env, models, min(eval_tasks, MAX_EVAL_TASKS.get(env, eval_tasks)), samples)
        if baseline is not None:
            results, curves = with_baseline_grpo(results, curves, baseline[env], seeds, args.grpo_from)
        png = plot(env, curves, out) if env not in MODELS_FROM else None
        source = f"`{ENVS[env]}`" if env not in MODELS_FROM else f"the {trained_on} models, played with `{ENVS[env]}`"
        report += markdown(env, source, results, curves, png, samples)
        everything[env] = {
            "curves": curves,
            "results": results,
        }
    report += [f"Total wall-clock: {time.time() - started:.0f} s.", ""]
    (out / "learning.md").write_text("\n".join(report))
    (out / "learning.json").write_text(json.dumps(everything, indent=1))
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
