"""Reports of AHD runs: one run's report.md and best-so-far PNG, and a per-task comparison of runs
(best objective, validity, gap to the optimum / best-known value, gap-ratio gain over the matched
baseline)."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from statistics import mean

import yaml

from esopt.confutil import ConfigError

__all__ = ["RunRecord", "load_run", "reference_target", "gap_ratio_gain", "write_run_report", "compare_runs", "paper_table"]


class RunRecord:
    """What a run directory holds, read back (works for a killed run: no summary.json)."""

    def __init__(self, run_dir: Path, config: dict, reference: dict, candidates: list[dict], summary: dict | None):
        self.run_dir = run_dir
        self.config = config
        self.reference = reference
        self.candidates = candidates
        self.summary = summary or {}
        self.task = config["task"]
        self.method = config["method"]
        self.sense = reference.get("sense", "min")

    @property
    def complete(self) -> bool:
        return bool(self.summary)

    def best_so_far(self) -> list[float | None]:
        best, out = None, []
        for c in self.candidates:
            if c["valid"] and (best is None or (c["objective"] < best if self.sense == "min" else c["objective"] > best)):
                best = c["objective"]
            out.append(best)
        return out

    @property
    def best(self) -> float | None:
        curve = self.best_so_far()
        return curve[-1] if curve else None

    @property
    def valid_rate(self) -> float:
        return sum(bool(c["valid"]) for c in self.candidates) / len(self.candidates) if self.candidates else 0.0

    @property
    def group(self) -> tuple:
        return (self.task, self.config.get("eval_seed", 0), self.summary.get("eval_instances", self.config.get("eval_instances")),
                self.config.get("budget"))


def load_run(run_dir: str | Path) -> RunRecord:
    d = Path(run_dir)
    if not (d / "config.yaml").is_file() or not (d / "reference.json").is_file():
        raise ConfigError(f"{run_dir} is not an AHD run directory (no config.yaml / reference.json)")
    config = yaml.safe_load((d / "config.yaml").read_text()) or {}
    if "task" not in config or "method" not in config:
        raise ConfigError(f"{run_dir}/config.yaml is not an AHD run config")
    reference = json.loads((d / "reference.json").read_text())
    candidates = []
    path = d / "candidates.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                candidates.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a crash
    summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else None
    return RunRecord(d, config, reference, candidates, summary)


def reference_target(task: str, reference: dict) -> tuple[float | None, str]:
    """(value, label) that gaps are measured against: the exact optimum where the task knows it,
    else the best-known value its reference provides (labelled as such); (None, why) if neither."""
    if reference.get("optimum") is not None:
        if reference.get("optimum_source"):
            return float(reference["optimum"]), reference["optimum_source"]
        if task.startswith("admissible"):  # run directories written before references named their source
            return float(reference["optimum"]), "best-known (FunSearch)"
        return float(reference["optimum"]), "optimum (exact)"
    if reference.get("two_opt") is not None:
        return float(reference["two_opt"]), "best-known: nearest neighbour + 2-opt (not a proven optimum)"
    if reference.get("lower_bound") is not None:
        return float(reference["lower_bound"]), "lower bound ceil(sum(sizes)/capacity) (not a proven optimum)"
    return None, "none: the task provides no optimum or best-known value"


def gap(objective: float | None, target: float | None) -> float | None:
    if objective is None or target is None:
        return None
    return abs(objective - target)


def gap_ratio_gain(gap_baseline: float | None, gap_method: float | None) -> float | None:
    """gap(baseline) / gap(method) - 1: 0 = same gap, 1 = half the gap, inf = reached the target."""
    if gap_baseline is None or gap_method is None:
        return None
    if gap_method == 0:
        return 0.0 if gap_baseline == 0 else math.inf
    return gap_baseline / gap_method - 1.0


def _fmt(x, spec=".5g") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return format(x, spec)


def _plot(path: Path, records: list[RunRecord], title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    drew_ref = set()
    for r in records:
        curve = r.best_so_far()
        xs = [i + 1 for i, v in enumerate(curve) if v is not None]
        ys = [v for v in curve if v is not None]
        ax.step(xs, ys, where="post", label=f"{r.task} {r.method} (seed {r.config.get('seed')})")
        greedy = r.reference.get("greedy")
        if greedy is not None and r.task not in drew_ref:
            ax.axhline(greedy, color="grey", ls=":", lw=1, label=f"{r.task} greedy")
            target, label = reference_target(r.task, r.reference)
            if target is not None:
                ax.axhline(target, color="black", ls="--", lw=1, label=f"{r.task} {label.split(':')[0].split(' (')[0]}")
            drew_ref.add(r.task)
    ax.set_xlabel("evaluations (proposals)")
    ax.set_ylabel("best objective so far")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_run_report(run_dir: str | Path) -> dict:
    """report.md (+ best_so_far.png) for one run; returns {"report": path, "plot": path or None}."""
    r = load_run(run_dir)
    d = Path(run_dir)
    plot = d / "best_so_far.png"
    has_plot = _plot(plot, [r], f"{r.task} / {r.method}")
    target, label = reference_target(r.task, r.reference)
    ops: dict[str, list] = defaultdict(list)
    for c in r.candidates:
        ops[c["operator"]].append(c)
    reasons: dict[str, int] = defaultdict(int)
    for c in r.candidates:
        if not c["valid"]:
            reasons[(c.get("reason") or "?").splitlines()[0][:100]] += 1
    s = r.summary
    lines = [
        f"# AHD run: {r.task} / {r.method}",
        "",
        f"Budget {r.config['budget']} proposals in batches of G={r.config['population']}, seed {r.config['seed']}, "
        f"model `{r.config['model']['path']}`, temperature {r.config['sampling']['temperature']}, "
        f"max_new_tokens {r.config['sampling']['max_new_tokens']}"
        + (f", ES sigma {r.config['es']['sigma']:g} -> {r.config['es']['sigma_final']:g} (cosine), alpha {r.config['es']['alpha']:g}"
           if r.method.startswith("agentic-esopt") else "") + ".",
        f"Candidates ran in the sandbox with isolation: {r.config.get('isolation', 'python (before OS isolation)')}.",
        "",
        "| | objective |",
        "|---|---|",
        f"| greedy ({r.reference.get('greedy_name')}) | {_fmt(r.reference.get('greedy'))} |",
        f"| reference: {label} | {_fmt(target)} |",
        f"| best found | {_fmt(r.best)} |",
        "",
        f"Valid proposals: {sum(c['valid'] for c in r.candidates)}/{len(r.candidates)} "
        f"({r.valid_rate:.0%}); duplicates: {sum(c.get('duplicate') is not None for c in r.candidates)}"
        + (f"; {s['seconds']:.0f} s" if s.get("seconds") is not None else "; run incomplete") + ".",
        "",
        "| operator | proposals | valid | best |",
        "|---|---|---|---|",
    ]
    for op, cs in ops.items():
        vals = [c["objective"] for c in cs if c["valid"]]
        best = (min(vals) if r.sense == "min" else max(vals)) if vals else None
        lines.append(f"| {op} | {len(cs)} | {sum(c['valid'] for c in cs)} | {_fmt(best)} |")
    if reasons:
        lines += ["", "Why proposals were invalid:", ""]
        lines += [f"- {n} x {reason}" for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:10]]
    if has_plot:
        lines += ["", "![best so far](best_so_far.png)"]
    (d / "report.md").write_text("\n".join(lines) + "\n")
    return {"report": str(d / "report.md"), "plot": str(plot) if has_plot else None}


METHOD_ORDER = ("sample", "agentic-esopt+sample", "eoh", "agentic-esopt+eoh")
METHOD_LABELS = {"sample": "Sample", "agentic-esopt+sample": "Agentic ESOpt + Sample", "eoh": "EoH",
                 "agentic-esopt+eoh": "Agentic ESOpt + EoH"}


def _method_rows(runs: list[RunRecord], target: float | None) -> dict[str, dict]:
    """Per method: runs, mean best objective, mean gap to `target`, validity, seconds, incomplete runs."""
    by_method: dict[str, list[RunRecord]] = defaultdict(list)
    for r in runs:
        by_method[r.method].append(r)
    rows = {}
    for method, rs in by_method.items():
        bests = [r.best for r in rs]
        gaps = [gap(b, target) for b in bests]
        valid_bests = [b for b in bests if b is not None]
        rows[method] = {
            "runs": len(rs),
            "best": mean(valid_bests) if valid_bests else None,
            "gap": mean(gaps) if gaps and all(g is not None for g in gaps) else None,
            "valid": mean(r.valid_rate for r in rs),
            "seconds": mean(r.summary["seconds"] for r in rs) if all(r.summary.get("seconds") is not None for r in rs) else None,
            "incomplete": sum(not r.complete for r in rs),
        }
    return rows


def _ordered(rows: dict) -> list[str]:
    return [m for m in METHOD_ORDER if m in rows] + sorted(m for m in rows if m not in METHOD_ORDER)


def _baseline_gain(method: str, rows: dict) -> float | None:
    """An Agentic ESOpt variant's gap-ratio gain over the method it co-evolves with (None if either is missing)."""
    base = method.split("+")[-1] if method.startswith("agentic-esopt+") else None
    if base not in rows:
        return None
    return gap_ratio_gain(rows[base]["gap"], rows[method]["gap"])


def paper_table(columns: list[dict]) -> str:
    """The layout of the Agentic ESOpt paper's Table 5: one column per task; rows Greedy Construct, Optimal,
    each method's objective (mean best over runs), and under each Agentic ESOpt variant its gap-ratio gain
    gap(baseline)/gap(method) - 1 over its baseline method, gaps measured to the Optimal row."""
    methods: list[str] = []
    for column in columns:
        methods += [m for m in _ordered(column["rows"]) if m not in methods]
    methods = [m for m in METHOD_ORDER if m in methods] + [m for m in methods if m not in METHOD_ORDER]
    lines = [("", [c["name"] for c in columns]),
             ("Greedy Construct", [_fmt(c["greedy"], ".4f") for c in columns]),
             ("Optimal", [_fmt(c["target"], ".4f") for c in columns])]
    for method in methods:
        lines.append((METHOD_LABELS.get(method, method),
                      [_fmt(c["rows"][method]["best"], ".4f") if method in c["rows"] else "-" for c in columns]))
        if method.startswith("agentic-esopt+"):
            gains = [_baseline_gain(method, c["rows"]) if method in c["rows"] else None for c in columns]
            lines.append(("  Gain", [_fmt(g, "+.3f") if g is not None else "-" for g in gains]))
    width = max(12, *(len(c["name"]) + 2 for c in columns))
    out = [f"{label:24s}" + "".join(f"{cell:>{width}s}" for cell in cells) for label, cells in lines]
    out.append("Optimal: " + "; ".join(f"{c['name']}: {c['label']}" for c in columns) + ".")
    return "\n".join(out)


def compare_runs(run_dirs: list[str | Path], plot: str | None = None) -> str:
    """The Table 5 layout over every task with results, then a per-task comparison of runs (text). Runs of
    one task that share evaluation instances and budget are compared; several seeds of a method are averaged."""
    records = [load_run(d) for d in run_dirs]
    groups: dict[tuple, list[RunRecord]] = defaultdict(list)
    for r in records:
        groups[r.group].append(r)
    tasks_seen = [key[0] for key in groups]
    columns: list[dict] = []
    out: list[str] = []
    for (task, eval_seed, n_inst, budget), runs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        ref = runs[0].reference
        target, label = reference_target(task, ref)
        greedy = ref.get("greedy")
        rows = _method_rows(runs, target)
        name = task if tasks_seen.count(task) == 1 else f"{task} (seed {eval_seed}, {n_inst} inst, T={budget})"
        columns.append({"name": name, "greedy": greedy, "target": target, "label": label, "rows": rows})
        out.append(f"== {task}  (sense {ref.get('sense')}, {n_inst} instance(s), eval seed {eval_seed}, budget {budget})")
        out.append(f"   reference: {label}: {_fmt(target)}")
        out.append(f"   greedy ({ref.get('greedy_name')}): {_fmt(greedy)}   gap {_fmt(gap(greedy, target))}")
        header = f"   {'method':24s} {'runs':>4s} {'best':>10s} {'gap':>9s} {'gain vs baseline':>17s} {'gain vs greedy':>15s} {'valid':>6s} {'seconds':>8s}"
        out.append(header)
        for method in _ordered(rows):
            row = rows[method]
            base = method.split("+")[-1] if method.startswith("agentic-esopt+") else None
            gain = _baseline_gain(method, rows)
            gain_txt = ("vs " + base + " " + _fmt(gain, "+.3f")) if base in rows else ("(baseline)" if base is None else f"no {base} run")
            g_greedy = gap_ratio_gain(gap(greedy, target), row["gap"])
            seconds = _fmt(row["seconds"], ".0f")
            out.append(f"   {method:24s} {row['runs']:>4d} {_fmt(row['best']):>10s} {_fmt(row['gap'], '.4g'):>9s} "
                       f"{gain_txt:>17s} {_fmt(g_greedy, '+.3f'):>15s} {row['valid']:>6.0%} {seconds:>8s}"
                       + (f"  ({row['incomplete']} incomplete)" if row["incomplete"] else ""))
        out.append("")
    out.append("gap = |objective - reference|; gain = gap(baseline)/gap(method) - 1 (0: same gap, "
               "1: half the gap, inf: reached the reference); best/gap/valid/seconds are means over runs.")
    if plot:
        if _plot(Path(plot), records, "best objective so far"):
            out.append(f"plot: {plot}")
        else:
            out.append("plot: matplotlib is not installed")
    return "\n".join(["Table 5 layout (objective: mean best over runs)", paper_table(columns), "", *out])
