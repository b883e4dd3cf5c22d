"""One row per training run, one change at a time: the ablation table of a set of runs.

    python -m benchmarks.ablation REFERENCE_RUN OTHER_RUN ... [--out bench_results/ablation.md]

The first run is the reference; every other row shows the settings in which its config.yaml differs
from the reference's (so a row that changes two things at once is visible as such), its periodic
evaluation (the split its config names: choose settings on `val`) before and after training with 95%
Wilson intervals, the paired difference of its last evaluation from the reference's on the same tasks
(95% bootstrap interval; `-` when the two did not evaluate the same tasks), the mean training reward over the first and the last third of its steps, the share
of steps whose members all tied (ES runs), seconds per step and peak memory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import median

import yaml


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


IGNORED = {"run_name", "runs_dir"}


def changes(config: dict, reference: dict) -> str:
    a, b = flatten(reference), flatten(config)
    diff = [f"{k}={b.get(k)}" for k in sorted(set(a) | set(b)) if k not in IGNORED and a.get(k) != b.get(k)]
    return ", ".join(diff) or "(reference)"


def last_eval(run_dir: Path) -> dict[str, bool]:
    """Success per task id in the run's last periodic evaluation (its saved eval episodes)."""
    import json

    files = sorted((run_dir / "trajectories").glob("eval_step*.jsonl"))
    if not files:
        return {}
    return {r["task_id"]: bool(r["success"]) for r in map(json.loads, files[-1].read_text().splitlines())}


def versus(run_dir: Path, reference_dir: Path) -> str:
    from esopt.envs.metrics import paired_difference

    ours, theirs = last_eval(run_dir), last_eval(reference_dir)
    if not ours or ours.keys() != theirs.keys():
        return "-"
    tasks = sorted(ours)
    d = paired_difference([ours[k] for k in tasks], [theirs[k] for k in tasks])
    return f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"


def row(run_dir: Path, reference_dir: Path) -> str:
    from esopt.envs.metrics import wilson_interval
    from esopt.es import read_history
    from esopt.train.diagnostics import tie_summary
    from esopt.train.logging import read_metrics

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    reference = yaml.safe_load((reference_dir / "config.yaml").read_text())
    metrics = read_metrics(run_dir)
    evals = [r for r in metrics if "eval/success" in r]
    train = [r for r in metrics if "time/step_s" in r]
    n = config["eval_tasks"]

    def rate(x: float) -> str:
        low, high = wilson_interval(x * n, n)
        return f"{x:.3f} [{low:.2f}, {high:.2f}]"

    third = max(1, len(train) // 3)
    key = "train/fitness_mean"
    early = sum(r[key] for r in train[:third]) / third if train else float("nan")
    late = sum(r[key] for r in train[-third:]) / third if train else float("nan")
    ties = "-"
    if (run_dir / "history.jsonl").exists():
        t = tie_summary(read_history(run_dir / "history.jsonl"))
        ties = f"{t['fraction']:.0%}" if t["steps"] else "-"
    step_s = median(r["time/step_s"] for r in train) if train else float("nan")
    peak = max((r.get("mem/peak_rss_mb", 0) for r in train), default=0) / 1024
    before = rate(evals[0]["eval/success"]) if evals else "-"
    after = f"{rate(evals[-1]['eval/success'])} (step {evals[-1]['step']})" if len(evals) > 1 else "-"
    paired = "-" if run_dir == reference_dir else versus(run_dir, reference_dir)
    return (f"| `{run_dir.name}` | {changes(config, reference)} | {before} | {after} | {paired} | {early:.3f} -> {late:.3f} "
            f"| {ties} | {len(train)} | {step_s:.0f} | {peak:.1f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories; the first is the reference")
    parser.add_argument("--out", default=None, help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    dirs = [Path(r) for r in args.runs]
    missing = [str(d) for d in dirs if not (d / "config.yaml").exists()]
    if missing:
        raise SystemExit(f"not a run directory (no config.yaml): {', '.join(missing)}")
    lines = [
        f"`python -m benchmarks.ablation {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        "| run | change vs reference | success before [95% CI] (the run's eval_split) | after | after - reference's after "
        "(paired) [95% CI] | train reward first -> last third | tied steps | steps | s/step | peak GB |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *[row(d, dirs[0]) for d in dirs],
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
