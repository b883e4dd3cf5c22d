"""The side-by-side report of a Trace2Skill experiment's finished conditions."""

from __future__ import annotations

import json
from pathlib import Path

from esopt.confutil import ConfigError
from esopt.experiments.skill.config import CONDITIONS, RESULT_FILE
from esopt.skills.distill import read_log


def _fmt(x) -> str:
    return f"{x:.3f}" if isinstance(x, float) else ("-" if x is None else str(x))


def report(experiment_dir: str | Path) -> str:
    """A markdown table of every finished condition in `experiment_dir` (also written to report.md)."""
    root = Path(experiment_dir)
    results = []
    for name in CONDITIONS:
        path = root / name / RESULT_FILE
        if path.exists():
            results.append(json.loads(path.read_text()))
    if not results:
        raise ConfigError(f"{root} holds no finished condition (no */{RESULT_FILE})")
    k = results[0]["metrics"]["samples"]
    env = results[0]["env"]
    tasks = results[0]["metrics"]["tasks"]
    lines = [
        f"# Trace2Skill conditions: {env}",
        "",
        f"{tasks} held-out tasks, k = {k} episodes each. Mean@{k}: mean episode reward; Pass@{k}: a task "
        f"counts when any of its {k} episodes succeeded. Analyst validity: proposals that parsed into a "
        "patch valid against the skill (the rest were rejected and changed nothing).",
        "",
        f"| condition | Mean@{k} | Pass@{k} | success Mean@{k} | invalid actions | turns | skill | analyst valid | ES steps | skill document |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r["metrics"]
        a = r.get("analyst") or {}
        valid = f"{a['valid']}/{a['proposals']}" if a.get("proposals") else "-"
        lines.append(
            f"| {r['label']} | {_fmt(m[f'mean@{k}'])} | {_fmt(m[f'pass@{k}'])} | {_fmt(m[f'success_mean@{k}'])} | "
            f"{_fmt(m['invalid_rate'])} | {m['mean_turns']:.2f} | {r['skill'] or '-'} | {valid} | "
            f"{r.get('es_steps', '-')} | {('`' + r['skill_file'] + '`') if r.get('skill_file') else '-'} |"
        )
    for r in results:
        if r.get("skill_file"):
            text = (root / r["skill_file"]).read_text()
            lines += ["", f"## Skill of {r['label']} ({r['skill']})", "", "```markdown", text.strip(), "```"]
            rejected = [x for x in read_log(root / r["condition"]) if x["kind"] == "proposal" and not x["valid"]]
            if rejected:
                reasons: dict[str, int] = {}
                for x in rejected:
                    reasons[x["reason"][:90]] = reasons.get(x["reason"][:90], 0) + 1
                lines += ["", "Rejected proposals by reason: " + "; ".join(
                    f"{why} ({n})" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:5])]
    text = "\n".join(lines) + "\n"
    (root / "report.md").write_text(text)
    return text
