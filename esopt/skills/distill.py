"""Distillation: trajectories -> one analyst proposal each (against a frozen snapshot of the skill)
-> hierarchical merge -> validation -> a new version of the skill.

When the merged patch makes the skill break its limits (too long, too many sections), the edits
that add text (inserts, appends, then replaces) are dropped one at a time - least supported
first, later ones first among equals - until it fits; each dropped edit is logged. A round whose
proposals are all rejected, or whose merged patch changes nothing, leaves the skill as it was
(same version). Outputs in `out_dir`:

- `SKILL.md`: the current skill (with its version header),
- `skill_v<N>.md`: every version (v0 = the starting document),
- `distill_log.jsonl`: per round, one line per proposal (source trajectory, success, the raw reply,
  the patch or the rejection reason), one "merge" line (merged patch, conflicts, dropped edits)
  and one "result" line (version, tag, validity rate).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from esopt.confutil import Config, ConfigError, opt
from esopt.skills.analyst import Analyst, Rejection
from esopt.skills.document import Skill, SkillError, SkillLimits
from esopt.skills.patch import Conflict, Edit, Patch, apply_patch, hierarchical_merge

SKILL_FILE = "SKILL.md"
LOG_FILE = "distill_log.jsonl"


@dataclass
class DistillConfig(Config):
    group_size: int = opt(4, "k: patches merged per group at each level of the hierarchical merge")
    max_trajectories: int = opt(32, "trajectories read per distillation round (0 = all); successes and failures alternate")
    batch_size: int = opt(16, "trajectories per analyst generate call")
    limits: SkillLimits = opt(SkillLimits(), "limits every distilled skill must satisfy")

    def check(self) -> None:
        if self.group_size < 2:
            raise ConfigError(f"distill.group_size must be >= 2, got {self.group_size}")
        if self.max_trajectories < 0 or self.batch_size < 1:
            raise ConfigError("distill.max_trajectories must be >= 0 and distill.batch_size >= 1")


@dataclass
class DistillResult:
    base: Skill
    skill: Skill
    proposals: list = field(default_factory=list)
    """Patch or Rejection per trajectory read, in order."""
    merged: Patch = field(default_factory=Patch)
    conflicts: list[Conflict] = field(default_factory=list)
    dropped: list[Edit] = field(default_factory=list)
    levels: int = 0

    @property
    def changed(self) -> bool:
        return self.skill.text != self.base.text

    @property
    def rejections(self) -> list[Rejection]:
        return [p for p in self.proposals if isinstance(p, Rejection)]

    @property
    def valid(self) -> int:
        return len(self.proposals) - len(self.rejections)

    def summary(self) -> dict:
        n = len(self.proposals)
        return {
            "from": self.base.tag, "version": self.skill.version, "tag": self.skill.tag, "changed": self.changed,
            "proposals": n, "valid": self.valid, "valid_rate": self.valid / n if n else 0.0,
            "edits": len(self.merged.edits), "conflicts": len(self.conflicts), "dropped": len(self.dropped),
            "chars": len(self.skill.text), "sections": len(self.skill.sections),
        }


def select_trajectories(trajectories: list[dict], limit: int) -> list[dict]:
    """At most `limit` trajectories (0 = all), successes and failures alternating, in their order."""
    if not limit or len(trajectories) <= limit:
        return list(trajectories)
    wins = [t for t in trajectories if t.get("success")]
    losses = [t for t in trajectories if not t.get("success")]
    out = []
    while len(out) < limit and (wins or losses):
        for pool in (wins, losses):
            if pool and len(out) < limit:
                out.append(pool.pop(0))
    return out


def _fit(base: Skill, merged: Patch, limits: SkillLimits) -> tuple[Skill, Patch, list[Edit]]:
    """Apply `merged`; while the result breaks `limits`, drop the weakest text-adding edit."""
    patch = Patch(list(merged.edits), merged.source)
    dropped: list[Edit] = []
    priority = {"insert": 0, "append": 1, "replace": 2}
    while True:
        new = apply_patch(base, patch)
        if not new.problems(limits):
            return new, patch, dropped
        candidates = [(priority[e.op], e.support, -i) for i, e in enumerate(patch.edits) if e.op in priority]
        if not candidates:  # only deletes left and still too big: the base itself breaks the limits
            raise SkillError(f"the skill breaks its limits even without additions: {'; '.join(new.problems(limits))}")
        _, _, neg_index = min(candidates)
        dropped.append(patch.edits.pop(-neg_index))


def distill(
    skill: Skill,
    trajectories: list[dict],
    analyst: Analyst,
    config: DistillConfig | None = None,
    out_dir: str | Path | None = None,
    seed: int = 0,
    round_name: str = "",
) -> DistillResult:
    """One distillation round. `trajectories` are Trajectory.to_json() dicts. Returns the result;
    with `out_dir`, writes SKILL.md, skill_v<N>.md and appends to distill_log.jsonl."""
    config = config or DistillConfig()
    base = skill.copy()
    problems = base.problems(config.limits)
    if problems:
        raise SkillError(f"the starting skill breaks its limits: {'; '.join(problems)}")
    chosen = select_trajectories(trajectories, config.max_trajectories)
    proposals, raws = [], []
    for start in range(0, len(chosen), config.batch_size):
        batch = chosen[start : start + config.batch_size]
        proposals += analyst.propose_many(base, batch, seed=seed + start)
        raws += analyst.replies() or [""] * len(batch)
    patches = [p for p in proposals if isinstance(p, Patch)]
    merged, conflicts, levels = hierarchical_merge(patches, config.group_size)
    new, applied, dropped = _fit(base, merged, config.limits)
    new.version = base.version + 1 if new.text != base.text else base.version
    result = DistillResult(base, new if new.text != base.text else base, proposals, applied, conflicts, dropped, levels)
    if out_dir is not None:
        _write(Path(out_dir), result, chosen, raws, round_name)
    return result


def _write(out: Path, result: DistillResult, trajectories: list[dict], raws: list[str], round_name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    first = out / f"skill_v{result.base.version}.md"
    if not first.exists():
        result.base.save(first)
    if result.changed:
        result.skill.save(out / f"skill_v{result.skill.version}.md")
    result.skill.save(out / SKILL_FILE)
    with (out / LOG_FILE).open("a") as f:
        for trajectory, proposal, raw in zip(trajectories, result.proposals, raws):
            line = {"round": round_name, "kind": "proposal", "source": proposal.source,
                    "success": bool(trajectory.get("success")), "valid": not isinstance(proposal, Rejection),
                    "raw": raw}
            if isinstance(proposal, Rejection):
                line["reason"] = proposal.reason
            else:
                line["patch"] = proposal.to_json()
            f.write(json.dumps(line) + "\n")
        f.write(json.dumps({"round": round_name, "kind": "merge", "levels": result.levels,
                            "patch": result.merged.to_json(), "conflicts": [c.to_json() for c in result.conflicts],
                            "dropped": [e.to_json() for e in result.dropped]}) + "\n")
        f.write(json.dumps({"round": round_name, "kind": "result", **result.summary()}) + "\n")


def read_log(out_dir: str | Path) -> list[dict]:
    path = Path(out_dir) / LOG_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
